"""Page accounting: device memory is split into a huge-page (2 MiB) and a normal-page (4 KiB) pool.

An allocation takes whole pages of one kind; the malloc policy chooses the kind (REFERENCE.md §2):
HUGE_FIRST uses normal pages up to 1 MiB and huge pages above, falling back to normal pages;
HUGE_ONLY fails when huge pages run out; NORMAL_ONLY never touches huge pages.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..constants import (
    HUGE_FIRST_THRESHOLD, HUGE_PAGE_SIZE, HUGE_POLICIES, NORMAL_PAGE_SIZE, NORMAL_POLICIES,
    MallocPolicy,
)
from ..units import align_up


@dataclass
class PagePool:
    """Pages of one size: how many bytes exist and how many are taken."""

    kind: str
    page_size: int
    total: int
    used: int = 0

    @property
    def free(self) -> int:
        return self.total - self.used

    def cost(self, nbytes: int) -> int:
        """Bytes of pages that `nbytes` occupies."""
        return align_up(max(nbytes, 1), self.page_size)

    def fits(self, nbytes: int) -> bool:
        return self.cost(nbytes) <= self.free


class PageAccounting:
    """The two pools of one device and the policy that picks between them."""

    def __init__(self, total: int, huge_total: int):
        huge_total = min(huge_total, total) // HUGE_PAGE_SIZE * HUGE_PAGE_SIZE
        normal_total = (total - huge_total) // NORMAL_PAGE_SIZE * NORMAL_PAGE_SIZE
        self.huge = PagePool("huge", HUGE_PAGE_SIZE, huge_total)
        self.normal = PagePool("normal", NORMAL_PAGE_SIZE, normal_total)

    @property
    def total(self) -> int:
        return self.huge.total + self.normal.total

    @property
    def free(self) -> int:
        return self.huge.free + self.normal.free

    def candidates(self, nbytes: int, policy: MallocPolicy) -> list[PagePool]:
        """Pools to try, in order, for a request of `nbytes` under `policy`."""
        if policy in HUGE_POLICIES:
            return [self.huge]
        if policy in NORMAL_POLICIES or nbytes <= HUGE_FIRST_THRESHOLD:
            return [self.normal]
        return [self.huge, self.normal]

    def take(self, nbytes: int, policy: MallocPolicy) -> PagePool | None:
        """Take pages for `nbytes`; the pool used, or None when none of the candidates fits."""
        for pool in self.candidates(nbytes, policy):
            if pool.fits(nbytes):
                pool.used += pool.cost(nbytes)
                return pool
        return None

    def give_back(self, pool: PagePool, nbytes: int) -> None:
        pool.used -= pool.cost(nbytes)
