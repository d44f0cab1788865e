"""Progress on stderr: a one-line bar redrawn in place on a terminal; elsewhere (a CI log, a
pipe) a plain line every 10 seconds once the work has run that long, so logs stay short."""

from __future__ import annotations

import sys
import time


class ProgressBar:
    """`update(done)` redraws at most ten times a second (a plain line every 10 s off a
    terminal); `close()` clears the bar."""

    LOG_EVERY = 10.0

    def __init__(self, total: int | None, label: str, unit: str = "", stream=None,
                 enabled: bool = True):
        self.total, self.label, self.unit = total, label, unit
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.terminal = self.stream.isatty()
        self.started = self._drawn = time.perf_counter()
        self.done = 0

    def update(self, done: int, force: bool = False) -> None:
        self.done = done
        now = time.perf_counter()
        every = 0.1 if self.terminal else self.LOG_EVERY
        if not self.enabled or now - self._drawn < every and not (force and self.terminal):
            return
        self._drawn = now
        elapsed = now - self.started
        if self.total:
            filled = int(24 * min(done / self.total, 1.0))
            bar = f"[{'#' * filled}{'.' * (24 - filled)}] {done:,}/{self.total:,}"
        else:
            bar = f"{done:,}"
        line = f"{self.label} {bar}{' ' + self.unit if self.unit else ''} {elapsed:.1f}s"
        self.stream.write(f"\r{line} " if self.terminal else f"{line}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.terminal:
            self.stream.write("\r" + " " * 79 + "\r")
            self.stream.flush()

