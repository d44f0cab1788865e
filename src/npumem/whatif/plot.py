"""A self-contained SVG bar chart of peak reserved memory per replay (no plotting library)."""

from __future__ import annotations

from html import escape
from typing import Sequence

from ..units import format_size
from .replay import ReplayResult

ROW, LABEL_WIDTH, BAR_WIDTH, MARGIN = 22, 380, 420, 12


def label_of(result: ReplayResult) -> str:
    if result.allocator != "pool":
        return result.allocator
    return f"pool {result.settings}" if result.settings and result.settings != "defaults" else "pool"


def sweep_svg(results: Sequence[ReplayResult], title: str = "peak reserved per setting") -> str:
    """Bars of peak reserved bytes, grouped by trace; a dashed line marks each trace's peak live
    bytes (the lower bound), so the gap to it is what an allocator wastes."""
    traces: dict[str, list[ReplayResult]] = {}
    for result in results:
        traces.setdefault(result.trace, []).append(result)
    largest = max([r.peak_reserved_bytes for r in results] + [1])
    rows = sum(len(group) + 1 for group in traces.values())
    height = MARGIN * 2 + ROW * (rows + 1)
    width = LABEL_WIDTH + BAR_WIDTH + 110
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="12">',
             f'<text x="{MARGIN}" y="{MARGIN + 12}" font-weight="bold">{escape(title)}</text>']
    y = MARGIN + ROW
    for trace, group in traces.items():
        parts.append(f'<text x="{MARGIN}" y="{y + 15}" font-weight="bold">{escape(trace)}</text>')
        y += ROW
        top = y
        for result in group:
            bar = max(1, round(BAR_WIDTH * result.peak_reserved_bytes / largest))
            parts.append(f'<text x="{LABEL_WIDTH - 6}" y="{y + 15}" text-anchor="end">'
                         f'{escape(label_of(result))}</text>')
            parts.append(f'<rect x="{LABEL_WIDTH}" y="{y + 4}" width="{bar}" height="{ROW - 8}" '
                         f'fill="#4a7ab5"><title>{result.peak_reserved_bytes} bytes</title></rect>')
            parts.append(f'<text x="{LABEL_WIDTH + bar + 4}" y="{y + 15}">'
                         f'{format_size(result.peak_reserved_bytes)} '
                         f'({result.reserved_over_allocated:.3f}x)</text>')
            y += ROW
        live = round(BAR_WIDTH * group[0].peak_allocated_bytes / largest)
        parts.append(f'<line x1="{LABEL_WIDTH + live}" y1="{top}" x2="{LABEL_WIDTH + live}" '
                     f'y2="{y}" stroke="#c0392b" stroke-dasharray="4 3">'
                     f'<title>peak live {group[0].peak_allocated_bytes} bytes</title></line>')
    parts.append("</svg>")
    return "\n".join(parts)
