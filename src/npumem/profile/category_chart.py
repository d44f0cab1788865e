"""Memory by category over time, as a stacked SVG chart, and the peak by category as a table:
the HTML report's view of what a PyTorch program's bytes were for (categories.py)."""

from __future__ import annotations

from html import escape

from ..units import format_size
from .categories import ORDER
from .time_axis import time_ticks

# One colour per category, in the stacking order (parameters at the bottom).
COLOURS = {"parameter": "#3b6fd8", "optimizer_state": "#7c4dbe", "gradient": "#e07b24",
           "input": "#2a9d8f", "activation": "#d1495b", "temporary": "#b9c0cf",
           "other": "#e9c46a"}


def category_svg(series: list[tuple[float, dict[str, int]]], width: int = 1060,
                 height: int = 240) -> str:
    """Stacked live bytes by category; hover a band for its name."""
    if len(series) < 2:
        return "<p class=sub>Not enough events for a timeline by category.</p>"
    kinds = [kind for kind in ORDER if any(values.get(kind) for _, values in series)]
    left, right, top, bottom = 80, 34, 10, 28
    t0 = min(t for t, _ in series)
    span = (max(t for t, _ in series) - t0) or 1.0
    ymax = max(sum(values.values()) for _, values in series) or 1

    def x(t: float) -> float:
        return left + (t - t0) / span * (width - left - right)

    def y(v: float) -> float:
        return top + (1 - v / ymax) * (height - top - bottom)

    parts, below = [], [0] * len(series)
    for kind in kinds:
        above = [b + values.get(kind, 0) for b, (_, values) in zip(below, series)]
        upper = " ".join(f"{x(t):.1f},{y(v):.1f}" for (t, _), v in zip(series, above))
        lower = " ".join(f"{x(t):.1f},{y(v):.1f}" for (t, _), v in reversed(list(zip(series, below))))
        peak = max(values.get(kind, 0) for _, values in series)
        parts.append(f'<polygon points="{upper} {lower}" fill="{COLOURS[kind]}" '
                     f'fill-opacity="0.85"><title>{kind}: up to {escape(format_size(peak))}'
                     f'</title></polygon>')
        below = above
    ticks, unit, scale = time_ticks(span)
    axis = [f'<text x="{x(t0 + t):.1f}" y="{height - 8}" text-anchor="middle">{t / scale:g} '
            f'{unit}</text>' for t in ticks]
    axis += [f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">'
             f'{escape(format_size(int(v)))}</text>' for v in (0, ymax / 2, ymax)]
    legend = "".join(f'<i style="background:{COLOURS[kind]}"></i>{kind}' for kind in kinds)
    return (f'<svg viewBox="0 0 {width} {height}" width="100%" role="img" '
            f'aria-label="live bytes by category over time">{"".join(parts)}{"".join(axis)}'
            f'</svg><div class="legend sub">{legend}</div>')


def category_rows(categories: dict[str, int]) -> list[list[str]]:
    """Table rows: category, bytes, share of the total."""
    total = sum(categories.values()) or 1
    return [[escape(kind), escape(format_size(n)), f"{100 * n / total:.1f}%"]
            for kind, n in categories.items()]
