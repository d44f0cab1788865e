"""Time axes for the report's SVGs: a unit that suits a span, and round ticks in it."""

from __future__ import annotations

import math


def time_unit(us: float) -> tuple[str, float]:
    """The time unit that suits `us` microseconds: (name, microseconds per unit)."""
    return next(((u, f) for u, f in (("s", 1e6), ("ms", 1e3)) if us >= f), ("us", 1.0))


def time_ticks(span_us: float, count: int = 5) -> tuple[list[float], str, float]:
    """Round tick times from 0 (1, 2, 2.5 or 5 times a power of ten), in the unit that suits
    the span: (ticks in us, unit name, us per unit)."""
    unit, scale = time_unit(span_us)
    raw = span_us / scale / count
    magnitude = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw) * scale
    return [i * step for i in range(int(span_us // step) + 1)], unit, scale
