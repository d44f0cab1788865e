"""Page accounting: device memory handed out in huge (2 MiB) or normal (4 KiB) pages.

Both kinds draw from one capacity; huge pages are further capped by a huge-page limit (all of
memory by default, NPUMEM_SIM_HUGE_MEMORY to lower it). An allocation takes whole pages of one
kind; the malloc policy chooses the kind (REFERENCE.md section 2): HUGE_FIRST uses normal pages up
to 1 MiB and huge pages above, falling back to normal pages; HUGE_ONLY fails when huge pages run
out; NORMAL_ONLY never touches huge pages.
"""

from __future__ import annotations

from ..constants import (
    HUGE_FIRST_THRESHOLD, HUGE_PAGE_SIZE, HUGE_POLICIES, NORMAL_PAGE_SIZE, NORMAL_POLICIES,
    MallocPolicy,
)
from ..units import align_up

PAGE_SIZE = {"huge": HUGE_PAGE_SIZE, "normal": NORMAL_PAGE_SIZE}


class PageAccounting:
    """How many bytes of each page kind one device has handed out."""

    def __init__(self, total: int, huge_limit: int | None = None):
        self.total = total // NORMAL_PAGE_SIZE * NORMAL_PAGE_SIZE
        limit = self.total if huge_limit is None else min(huge_limit, self.total)
        self.huge_limit = limit // HUGE_PAGE_SIZE * HUGE_PAGE_SIZE
        self.used = {"huge": 0, "normal": 0}

    @property
    def free(self) -> int:
        return self.total - self.used["huge"] - self.used["normal"]

    @staticmethod
    def cost(kind: str, nbytes: int) -> int:
        """Bytes of `kind` pages that `nbytes` occupies."""
        return align_up(nbytes, PAGE_SIZE[kind])

    def available(self, kind: str) -> int:
        """Bytes of `kind` pages that could still be handed out."""
        if kind == "normal":
            return self.free
        room = min(self.huge_limit - self.used["huge"], self.free)
        return room // HUGE_PAGE_SIZE * HUGE_PAGE_SIZE

    def capacity(self, kind: str) -> int:
        """The most bytes of `kind` pages this device can ever hold."""
        return self.huge_limit if kind == "huge" else self.total

    def candidates(self, nbytes: int, policy: MallocPolicy) -> list[str]:
        """Page kinds to try, in order, for a request of `nbytes` under `policy`."""
        if policy in HUGE_POLICIES:
            return ["huge"]
        if policy in NORMAL_POLICIES or nbytes <= HUGE_FIRST_THRESHOLD:
            return ["normal"]
        return ["huge", "normal"]

    def take(self, nbytes: int, policy: MallocPolicy) -> str | None:
        """Take pages for `nbytes`: the kind used, or None when no candidate kind has room."""
        for kind in self.candidates(nbytes, policy):
            if self.cost(kind, nbytes) <= self.available(kind):
                self.used[kind] += self.cost(kind, nbytes)
                return kind
        return None

    def give_back(self, kind: str, nbytes: int) -> None:
        self.used[kind] -= self.cost(kind, nbytes)
