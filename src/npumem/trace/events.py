"""The in-memory event model shared by every trace format."""

from __future__ import annotations

from typing import NamedTuple


class TraceEvent(NamedTuple):
    """One allocation or free. `addr` identifies the block within its trace."""

    t_us: float
    action: str          # "alloc" | "free"
    addr: int
    size: int            # requested bytes (on free: the size of the block freed)
    stream: int = 0


class TraceFormatError(ValueError):
    """A trace file that cannot be read; names the file, the position and what is wrong."""

    def __init__(self, path: str, position: str, reason: str):
        self.path, self.position, self.reason = path, position, reason
        super().__init__(f"{path}:{position}: {reason}")

    def __reduce__(self):          # rebuilt from its parts when it crosses a process boundary
        return type(self), (self.path, self.position, self.reason)
