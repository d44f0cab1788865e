"""A one-line progress bar on stderr, drawn only when stderr is a terminal."""

from __future__ import annotations

import sys
import time


class ProgressBar:
    """`update(done)` redraws at most ten times a second; `close()` clears the line."""

    def __init__(self, total: int | None, label: str, unit: str = "", stream=None,
                 enabled: bool | None = None):
        self.total, self.label, self.unit = total, label, unit
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.started = self._drawn = time.perf_counter()
        self.done = 0

    def update(self, done: int, force: bool = False) -> None:
        self.done = done
        now = time.perf_counter()
        if not self.enabled or (not force and now - self._drawn < 0.1):
            return
        self._drawn = now
        elapsed = now - self.started
        if self.total:
            filled = int(24 * min(done / self.total, 1.0))
            bar = f"[{'#' * filled}{'.' * (24 - filled)}] {done:,}/{self.total:,}"
        else:
            bar = f"{done:,}"
        self.stream.write(f"\r{self.label} {bar}{' ' + self.unit if self.unit else ''} {elapsed:.1f}s ")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r" + " " * 79 + "\r")
            self.stream.flush()

