"""What every trace reader checks of the values it takes out of a file, and how it says what is
wrong (TraceFormatError)."""

from __future__ import annotations

import math

from ..events import TraceEvent


class TraceFormatError(ValueError):
    """A trace file that cannot be read; names the file, the position and what is wrong."""

    def __init__(self, path: str, position: str, reason: str):
        self.path, self.position, self.reason = path, position, reason
        super().__init__(f"{path}:{position}: {reason}" if position else f"{path}: {reason}")

    def __reduce__(self):          # rebuilt from its parts when it crosses a process boundary
        return type(self), (self.path, self.position, self.reason)


ADDRESS_LIMIT = 1 << 64       # addresses, sizes and streams are 64-bit in every tool that writes them


# The checks every reader makes on the values it takes out of a file (here and snapshot_schema).

def natural(value, limit: int = ADDRESS_LIMIT) -> bool:
    """An int (not a bool) in [0, limit)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < limit


def finite_number(value) -> bool:
    """An int or float (not a bool) that is finite as a float (a 400-digit int is not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def shown(value) -> str:
    """A value for an error message, cut short (a 400-digit number stays readable)."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):     # past Python's 4300-digit limit, or too deep
        return f"a {type(value).__name__} too large to show"
    return text if len(text) <= 40 else f"{text[:30]}... ({len(text)} characters)"


def checked_event(path: str, where: str, t_us, action: str, addr, size, stream=0) -> TraceEvent:
    """A TraceEvent from values a reader took out of a file, or a TraceFormatError saying which
    value is wrong: times must be finite numbers, addresses, sizes and streams integers in
    [0, 2**64)."""
    if not finite_number(t_us):
        raise TraceFormatError(path, where, f"the time must be finite, a number, got {shown(t_us)}")
    for name, value in (("address", addr), ("size", size), ("stream", stream)):
        if value is None:
            raise TraceFormatError(path, where, f"the {name} is missing (an integer in "
                                   "[0, 2**64))")
        if not natural(value):
            raise TraceFormatError(path, where, f"the {name} must be an integer in [0, 2**64), "
                                   f"got {shown(value)}")
    return TraceEvent(float(t_us), action, addr, size, stream)
