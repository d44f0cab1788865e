"""The event model every trace format reads into and writes from, and the allocators and the
planner take: one allocation or free, in time order."""

from __future__ import annotations

from typing import NamedTuple


class TraceEvent(NamedTuple):
    """One allocation or free. `addr` identifies the block within its trace."""

    t_us: float
    action: str          # "alloc" | "free"
    addr: int
    size: int            # requested bytes (on free: the size of the block freed)
    stream: int = 0
