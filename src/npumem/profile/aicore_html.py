"""The AI core timeline of a kernel launch as an SVG: one row per core and lane, one box per
instruction, so double buffering shows as MTE2 boxes under Vector boxes."""

from __future__ import annotations

from html import escape

from ..aicore.timeline import LANES, Timeline
from .time_axis import time_ticks

LANE_COLOURS = {"MTE2": "#3b6fd8", "MTE1": "#8a63d2", "Cube": "#d2553f", "Vector": "#17803d",
                "MTE3": "#e07b24"}
MAX_CORES = 8          # rows beyond these cores are summarised, not drawn
MAX_BOXES = 4000       # an SVG stays light enough for a browser


def kernel_timeline_svg(timeline: Timeline, width: int = 1060) -> str:
    lanes = [lane for lane in LANES if any(s.lane == lane for s in timeline.slices)]
    cores = sorted({s.core for s in timeline.slices})[:MAX_CORES]
    rows = [(core, lane) for core in cores for lane in lanes]
    if not rows:
        return "<p class=sub>The launch issued no instructions.</p>"
    row_height, left, top = 14, 110, 8
    height = top + len(rows) * row_height + 26
    span_us = timeline.microseconds(timeline.makespan) or 1.0
    plot = width - left - 10

    def x(cycles: float) -> float:
        return left + plot * timeline.microseconds(cycles) / span_us

    index = {row: i for i, row in enumerate(rows)}
    out = [f'<svg width="{width}" height="{height}" role="img" '
           f'aria-label="AI core timeline of {escape(timeline.kernel)}">']
    for i, (core, lane) in enumerate(rows):
        y = top + i * row_height
        out.append(f'<text x="4" y="{y + 10}">core {core} {lane}</text>')
    shown = [s for s in timeline.slices if (s.core, s.lane) in index][:MAX_BOXES]
    for s in shown:
        y = top + index[(s.core, s.lane)] * row_height + 1
        w = max(x(s.end) - x(s.start), 0.6)
        tip = f"{s.name}, block {s.block}, tile {s.tile}, {s.nbytes} bytes, " \
              f"{timeline.microseconds(s.end - s.start):.3f} us"
        out.append(f'<rect x="{x(s.start):.1f}" y="{y}" width="{w:.1f}" height="{row_height - 2}" '
                   f'fill="{LANE_COLOURS[s.lane]}"><title>{escape(tip)}</title></rect>')
    ticks, unit, scale = time_ticks(span_us)
    axis = top + len(rows) * row_height + 14
    for tick in ticks:
        tx = left + plot * tick / span_us
        out.append(f'<text x="{tx:.1f}" y="{axis}" text-anchor="middle">{tick / scale:g} {unit}'
                   f'</text>')
    out.append("</svg>")
    more = []
    hidden_cores = timeline.cores - len(cores)
    if hidden_cores > 0:
        more.append(f"cores {len(cores)}..{timeline.cores - 1} are not drawn (the Chrome trace "
                    "has every core)")
    if len(shown) == MAX_BOXES:
        more.append(f"only the first {MAX_BOXES} instructions are drawn")
    return "".join(out) + (f"<p class=sub>{escape('; '.join(more))}</p>" if more else "")


def kernels_section(timelines: list[Timeline], limit: int = 6) -> str:
    out = ["<h2>AI cores: kernel timelines (modelled)</h2>",
           "<p class=sub>Times come from the device profile's cost model, not a clock: "
           "what each transfer engine and compute unit would do. "
           + " ".join(f'<span style="color:{c}">&#9632;</span> {lane}'
                      for lane, c in LANE_COLOURS.items()) + "</p>"]
    shown = timelines[-limit:]
    if len(timelines) > limit:
        out.append(f"<p class=sub>The last {limit} of {len(timelines)} launches.</p>")
    for timeline in shown:
        out.append(f"<p><code>{escape(timeline.summary())}</code></p>")
        out.append(kernel_timeline_svg(timeline))
    return "\n".join(out)
