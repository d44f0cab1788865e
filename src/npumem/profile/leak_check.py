"""A leak check around a block or a function:

    with npumem.profile.check_leaks():      # raises LeakError with the report
        step()
"""

from __future__ import annotations

import functools

from .leaks import LeakReport, settle
from .tracker import Tracker


class LeakError(AssertionError):
    """Allocations made inside a `check_leaks()` block were still live at its end."""

    def __init__(self, report: LeakReport):
        self.report = report
        super().__init__(report.format())


class check_leaks:
    """Raise LeakError if allocations made inside the block are still live at its end.

    Garbage is collected first, so tensors only held by reference cycles are not reported.
    `stacks=True` (default) gives each leak's file and line. As a decorator it checks each call.
    """

    def __init__(self, stacks: bool = True, max_entries: int = 100_000):
        self._stacks, self._max_entries = stacks, max_entries
        self.tracker: Tracker | None = None
        self.report: LeakReport | None = None

    def __enter__(self) -> "check_leaks":
        self.tracker = Tracker(stacks=self._stacks, max_entries=self._max_entries).start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        settle()
        self.tracker.stop()
        self.report = self.tracker.leaks()
        if self.report and exc_type is None:     # never hide the block's own exception
            raise LeakError(self.report)

    def __call__(self, function):
        @functools.wraps(function)
        def checked(*args, **kwargs):
            with check_leaks(self._stacks, self._max_entries):
                return function(*args, **kwargs)
        return checked
