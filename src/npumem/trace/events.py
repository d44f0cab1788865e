"""The in-memory event model shared by every trace format."""

from __future__ import annotations

import math
from typing import NamedTuple


class TraceEvent(NamedTuple):
    """One allocation or free. `addr` identifies the block within its trace."""

    t_us: float
    action: str          # "alloc" | "free"
    addr: int
    size: int            # requested bytes (on free: the size of the block freed)
    stream: int = 0


NO_SUCH_FILE = "no such file"        # one wording, wherever a file to read is missing


class TraceFormatError(ValueError):
    """A trace file that cannot be read; names the file, the position and what is wrong."""

    def __init__(self, path: str, position: str, reason: str):
        self.path, self.position, self.reason = path, position, reason
        super().__init__(f"{path}:{position}: {reason}" if position else f"{path}: {reason}")

    def __reduce__(self):          # rebuilt from its parts when it crosses a process boundary
        return type(self), (self.path, self.position, self.reason)


ADDRESS_LIMIT = 1 << 64       # addresses, sizes and streams are 64-bit in every tool that writes them


def _natural(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < ADDRESS_LIMIT


def checked_event(path: str, where: str, t_us, action: str, addr, size, stream=0) -> TraceEvent:
    """A TraceEvent from values a reader took out of a file, or a TraceFormatError saying which
    value is wrong: times must be finite numbers, addresses, sizes and streams integers in
    [0, 2**64)."""
    if isinstance(t_us, bool) or not isinstance(t_us, (int, float)):
        raise TraceFormatError(path, where, f"the time must be a number, got {_shown(t_us)}")
    try:
        time = float(t_us)
    except OverflowError:
        time = math.inf
    if not math.isfinite(time):
        raise TraceFormatError(path, where, f"the time must be finite, got {_shown(t_us)}")
    for name, value in (("address", addr), ("size", size), ("stream", stream)):
        if not _natural(value):
            raise TraceFormatError(path, where, f"the {name} must be an integer in [0, 2**64), "
                                   f"got {_shown(value)}")
    return TraceEvent(time, action, addr, size, stream)


def _shown(value) -> str:
    """A value for an error message, cut short (a 400-digit number stays readable)."""
    try:
        text = repr(value)
    except ValueError:                 # an integer past Python's 4300-digit conversion limit
        return "an integer of thousands of digits"
    return text if len(text) <= 40 else f"{text[:30]}... ({len(text)} characters)"
