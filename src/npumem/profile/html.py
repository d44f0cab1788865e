"""The HTML report: one self-contained file (inline SVG, CSS and a short script for zooming the
timelines; nothing is fetched)."""

from __future__ import annotations

import bisect
import json
import math
import zlib
from html import escape

from ..units import format_size
from .aicore_html import kernels_section
from .analysis import Point
from .category_chart import category_rows, category_svg
from .fragmentation import describe_free
from .time_axis import time_ticks as _time_ticks
from .time_axis import time_unit as _unit
from .report import Report

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:24px auto;max-width:1100px;
color:#1d2330;padding:0 16px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dde
;padding-bottom:4px} .sub{color:#667}
.cards{display:flex;gap:12px;flex-wrap:wrap;margin:14px 0}
.card{border:1px solid #dde;border-radius:8px;padding:10px 14px;min-width:150px}
.card b{display:block;font-size:19px} .card span{color:#667;font-size:12px}
table{border-collapse:collapse;width:100%;font-size:13px} td,th{padding:4px 8px;text-align:left;
border-bottom:1px solid #eef} th{background:#f6f7fb} td.n{text-align:right;white-space:nowrap;width:1%}
code{font-size:12px} .ok{color:#17803d} .bad{color:#b42318}
.map{display:flex;height:14px;border:1px solid #ccd;margin:2px 0 8px}
.map i{flex:1} .c-a{background:#3b6fd8} .c-f{background:#eef0f5} .c-m{background:#9db4ea}
.c-p{background:#f0a23b} .legend i{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;
vertical-align:middle} svg text{font-size:11px;fill:#556} details{margin:2px 0}
"""
# Drawn in this order: allocated last, on top, so it stays visible where active equals it.
_SERIES = (("reserved", "#e07b24", 1.6), ("active", "#b9a6e8", 4.0), ("allocated", "#3b6fd8", 1.6))
_SERIES_HELP = ("reserved: held from the device by the allocator; active: allocated plus blocks "
                "freed but still in use by a stream's queued work; allocated: what the program "
                "holds")
_CELL_CLASS = {"#": "c-a", ".": "c-f", ":": "c-m", "+": "c-p"}


def _downsample(points: list[Point], buckets: int) -> list[Point]:
    """At most about 2 * buckets points, keeping each bucket's highest and last point."""
    if len(points) <= 2 * buckets:
        return points
    step = len(points) / buckets
    out = []
    for b in range(buckets):
        chunk = points[int(b * step):int((b + 1) * step)] or points[-1:]
        top = max(chunk, key=lambda p: p.reserved + p.allocated)
        out += [top, chunk[-1]] if top is not chunk[-1] else [top]
    return out


def _nice_ticks(top: float, count: int = 5) -> list[float]:
    """Round tick values in binary units (0, 512 MiB, 1 GiB, ...) up to `top`."""
    if top <= 0:
        return [0.0]
    unit = next(u for u in (1 << 30, 1 << 20, 1 << 10, 1) if top >= u)
    raw = top / unit / count
    magnitude = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw) * unit
    return [i * step for i in range(int(top // step) + 2)]


def timeline_window(points: list[Point], spans=()) -> tuple[float, float]:
    """(start, end) of a timeline, in the trace's microseconds: every event (a trace's clocks
    need not rise in entry order) and every annotation, so that a step or mark after the last
    event still shows. Times on the page are counted from its start."""
    times = [p.time_us for p in points] or [0.0]
    return (min(times + [item.start_us for item in spans]),
            max(times + [item.end_us for item in spans]))


def _at(us: float) -> str:
    """A time since the start, in the unit that suits it."""
    unit, scale = _unit(us)
    return f"{us / scale:g} {unit}" if unit == "us" else f"{us / scale:.3f} {unit}"


def timeline_svg(points: list[Point], width: int = 1060, height: int = 260, spans=(),
                 largest=(), key: str = "0") -> str:
    """Allocated, active and reserved over time. Below the chart, a lane per thread with user
    ranges and per stream with its ops; marks as vertical lines; the largest allocations as dots
    on the allocated line. Hover any of them for what it is (a stack for the allocations); drag
    across the chart to zoom in on a time range, double-click to zoom out (`_ZOOM`)."""
    if len(points) < 2:
        return "<p class=sub>Not enough events for a timeline.</p>"
    all_points = points
    points = _downsample(points, 700)
    left, right, top, bottom = 80, 34, 10, 28
    plot_width = width - left - right
    t0, t1 = timeline_window(all_points, spans)
    span = (t1 - t0) or 1.0
    ymax = max(max(p.reserved, p.allocated, p.active) for p in points) or 1
    ticks = _nice_ticks(ymax)
    ymax = max(ymax, ticks[-1])

    def x(t: float) -> float:
        return left + (t - t0) / span * plot_width

    def y(v: float) -> float:
        return top + (1 - v / ymax) * (height - top - bottom)

    lanes = sorted({item.lane for item in spans if item.kind != "mark"})
    lane_height = 16
    total_height = height + len(lanes) * lane_height + (6 if lanes else 0)
    axis, plot, xticks = [], [], []
    for tick in ticks:
        axis.append(f'<line x1="{left}" x2="{width - right}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" '
                    f'stroke="#eef" /><text x="{left - 6}" y="{y(tick) + 4:.1f}" '
                    f'text-anchor="end">{escape(format_size(int(tick)))}</text>')
    times, unit, scale = _time_ticks(span)
    for i, offset in enumerate(times):
        anchor = "start" if i == 0 else "end" if x(t0 + offset) > width - right - 30 else "middle"
        xticks.append(f'<text x="{x(t0 + offset):.1f}" y="{height - 8}" text-anchor="{anchor}">'
                      f'{offset / scale:g} {unit}</text>')
    # a trace without segments (the CPU) has reserved and active equal to allocated at every
    # moment (a free is requested and completed at once): one line
    settled = {p.time_us: p for p in all_points}.values()      # each moment's last point
    series = [item for item in _SERIES if item[0] == "allocated"
              or any(getattr(p, item[0]) != p.allocated for p in settled)]
    for name, color, stroke in series:
        coords = []
        previous = None
        for p in points:          # steps: a value holds until the next event
            px, py = x(p.time_us), y(getattr(p, name))
            if previous is not None:
                coords.append(f"{px:.1f},{previous:.1f}")
            coords.append(f"{px:.1f},{py:.1f}")
            previous = py
        coords.append(f"{x(t1):.1f},{previous:.1f}")       # the last value holds to the end
        plot.append(f'<polyline fill="none" stroke="{color}" stroke-width="{stroke}" '
                    f'{_KEEP_STROKE} points="{" ".join(coords)}"><title>{name}</title></polyline>')
    inside = [item for item in spans if item.end_us >= t0 and item.start_us <= t1]
    for item in inside:
        if item.kind == "mark":
            at = x(max(item.start_us, t0))
            plot.append(f'<g><title>mark {escape(item.name)} at {_at(item.start_us - t0)}</title>'
                        f'<line x1="{at:.1f}" x2="{at:.1f}" y1="{top}" y2="{height - bottom}" '
                        f'stroke="#98a" stroke-dasharray="2 3" stroke-width="1.2" {_KEEP_STROKE} /></g>')
    for row, lane in enumerate(lanes):
        y0 = height + 4 + row * lane_height
        axis.append(f'<text x="{left - 6}" y="{y0 + 11}" text-anchor="end">'
                    f'{escape(lane[-12:])}</text>')
        for item in inside:
            if item.lane != lane or item.kind == "mark":
                continue
            x0, x1 = x(max(item.start_us, t0)), x(min(item.end_us, t1))
            fill = "#c9b7f0" if item.kind == "op" else "#f3c98b"
            plot.append(f'<g><title>{escape(item.kind)} {escape(item.name)}: '
                        f'{_at(item.end_us - item.start_us)} from {_at(item.start_us - t0)}</title>'
                        f'<rect x="{x0:.1f}" y="{y0}" width="{max(x1 - x0, 1.5):.1f}" '
                        f'height="{lane_height - 3}" fill="{fill}" /></g>')
    times = [p.time_us for p in all_points]
    for allocation in largest:
        i = max(bisect.bisect_right(times, allocation.time_us) - 1, 0)
        stack = "".join(f"\n  called from {escape(line)}" for line in allocation.stack[:8])
        plot.append(f'<g><title>alloc {escape(format_size(allocation.size))} at '
                    f'{_at(allocation.time_us - t0)}: {escape(allocation.where)}{stack}</title>'
                    f'<circle cx="{x(allocation.time_us):.1f}" cy="{y(all_points[i].allocated):.1f}" '
                    f'r="3" fill="#3b6fd8" fill-opacity="0.55" /></g>')
    clip = f"timeline-clip-{escape(key)}"
    svg = (f'<svg class=timeline viewBox="0 0 {width} {total_height}" width="100%" role="img" '
           f'aria-label="allocated and reserved bytes over time" data-left="{left}" '
           f'data-plot-width="{plot_width}" data-span="{span}" data-height="{height}">'
           f'<clipPath id="{clip}"><rect x="{left}" y="0" width="{plot_width}" '
           f'height="{total_height}" /></clipPath>{"".join(axis)}'
           f'<g clip-path="url(#{clip})"><g class=plot>{"".join(plot)}</g></g>'
           f'<g class=xticks>{"".join(xticks)}</g>'
           f'<rect class=brush x="0" y="{top}" width="0" height="{height - top - bottom}" '
           f'fill="#3b6fd8" fill-opacity="0.12" /></svg>')
    legend = "".join(f'<i style="background:{c}"></i>{n}' for n, c, _ in series)
    if len(series) < len(_SERIES):
        legend += " (reserved and active are the same here: nothing records segments)"
    extras = [text for shown, text in (
        (largest, "dots: the largest allocations"), (lanes, "lanes: user ranges per thread and "
         "ops per stream"), (any(item.kind == "mark" for item in spans), "dotted lines: marks"))
        if shown]
    hint = f"<br>{escape('; '.join(extras))} (hover for details). " if extras else "<br>"
    return svg + (f'<div class="legend sub">{legend} &mdash; {escape(_SERIES_HELP)}{hint}'
                  f'Drag across the chart to zoom in, double-click to zoom out.</div>')


# The block map at the moment the slider picks (the data is the JSON beside each slider).
_MOMENTS = """
(() => {
  const classes = {"#": "c-a", ".": "c-f", ":": "c-m", "+": "c-p"};
  for (const slider of document.querySelectorAll("input.moment-slider")) {
    const id = slider.dataset.moments;
    const moments = JSON.parse(document.getElementById(id).textContent);
    const label = document.getElementById(id + "-label");
    const maps = document.getElementById(id + "-maps");
    const show = () => {
      const [when, allocated, segments] = moments[+slider.value];
      label.textContent = `at ${when}: ${allocated} allocated, ${segments.length} segment(s)` +
        ` (moment ${+slider.value + 1} of ${moments.length})`;
      maps.innerHTML = segments.map(([address, size, cells]) =>
        `<div class=sub><code>${address}</code> ${size}</div><div class=map>` +
        [...cells].map((c) => `<i class="${classes[c]}"></i>`).join("") + "</div>").join("");
    };
    slider.addEventListener("input", show);
    show();
  }
})();
"""


# Keeps lines as thin as drawn when the zoom stretches the plot sideways.
_KEEP_STROKE = 'vector-effect="non-scaling-stroke"'

# Zoom for every timeline: drag selects a time range, double-click shows the whole run. The plot
# group is stretched sideways (a matrix transform) and the time ticks are drawn again.
_ZOOM = """
(() => {
  const units = [["s", 1e6], ["ms", 1e3], ["us", 1]];
  for (const svg of document.querySelectorAll("svg.timeline")) {
    const left = +svg.dataset.left, width = +svg.dataset.plotWidth, span = +svg.dataset.span;
    const height = +svg.dataset.height;
    const plot = svg.querySelector(".plot"), ticks = svg.querySelector(".xticks");
    const brush = svg.querySelector(".brush");
    let from = 0, to = span, start = null;
    const at = (event) => {
      const point = svg.createSVGPoint();
      point.x = event.clientX; point.y = event.clientY;
      return point.matrixTransform(svg.getScreenCTM().inverse()).x;
    };
    const draw = () => {
      const k = span / (to - from), shift = left - k * left - from * width / (to - from);
      plot.setAttribute("transform", `matrix(${k} 0 0 1 ${shift} 0)`);
      const shown = to - from, [unit, scale] = units.find(([, s]) => shown >= s) || units[2];
      const raw = shown / scale / 5, magnitude = Math.pow(10, Math.floor(Math.log10(raw)));
      const step = [1, 2, 2.5, 5, 10].map((m) => m * magnitude).find((s) => s >= raw) * scale;
      let labels = "";
      for (let t = Math.ceil(from / step) * step; t <= to; t += step) {
        const x = left + (t - from) / shown * width;
        labels += `<text x="${x.toFixed(1)}" y="${height - 8}" text-anchor="middle">` +
                  `${+(t / scale).toPrecision(6)} ${unit}</text>`;
      }
      ticks.innerHTML = labels;
    };
    svg.addEventListener("mousedown", (event) => { start = at(event); event.preventDefault(); });
    svg.addEventListener("mousemove", (event) => {
      if (start === null) return;
      const x = at(event);
      brush.setAttribute("x", Math.min(start, x));
      brush.setAttribute("width", Math.abs(x - start));
    });
    window.addEventListener("mouseup", (event) => {
      if (start === null) return;
      const x = at(event), a = Math.max(Math.min(start, x), left);
      const b = Math.min(Math.max(start, x), left + width);
      start = null;
      brush.setAttribute("width", 0);
      if (b - a < 4) return;
      const shown = to - from;
      [from, to] = [from + (a - left) / width * shown, from + (b - left) / width * shown];
      draw();
    });
    svg.addEventListener("dblclick", () => { from = 0; to = span; draw(); });
  }
})();
"""


def _page_head(title: str, subtitle: str) -> str:
    return (f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
            f'<meta name=viewport content="width=device-width,initial-scale=1">'
            f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>"
            f"<h1>{escape(title)}</h1><div class=sub>{escape(subtitle)}</div>")


def render_usage_html(title: str, curves: dict[tuple[str, str], list[tuple]], extra: str = "") -> str:
    """A page of usage curves (msprof's memory_record.csv): one timeline per component and
    device, drawn from their totals; `extra` (HTML) goes before them."""
    out = [_page_head(title, "a memory usage curve: totals over time, no allocations (reserved "
                             "is drawn where the file has it)")]
    if extra:
        out.append(extra)
    out += usage_sections(curves)
    out.append(f"<script>{_ZOOM}</script></body></html>")
    return "\n".join(out)


def usage_sections(curves: dict[tuple[str, str], list[tuple]]) -> list[str]:
    """A heading and a timeline per (component, device) of [(time us, allocated MB, reserved
    MB, active MB)]; a missing reserved or active is drawn as allocated."""
    out = []
    mib = float(1 << 20)
    for number, ((component, device), samples) in enumerate(sorted(curves.items())):
        points = [Point(t, int((a or 0) * mib), int((r if r is not None else a or 0) * mib),
                        int((v if v is not None else a or 0) * mib))
                  for t, a, r, v in samples if t is not None]
        points.sort(key=lambda point: point.time_us)
        out.append(f"<h2>{escape(component or '?')} on {escape(device or '?')}</h2>")
        out.append(timeline_svg(points, key=f"usage-{number}"))
    return out


def _moments_section(device: int, moments) -> str:
    """The block map at moments of the trace, one at a time, chosen with a slider (`_MOMENTS`);
    it opens at the peak."""
    start = moments[0][0]
    data = [[_at(time_us - start), format_size(allocated),
             [[f"0x{address:x}", format_size(size), cells] for address, size, cells in maps]]
            for time_us, allocated, maps in moments]
    peak = max(range(len(moments)), key=lambda i: moments[i][1])
    payload = json.dumps(data).replace("</", "<\\/")         # never ends the script element
    return (f"<h2>Device {device}: block map over time</h2>"
            f'<input type=range class=moment-slider min=0 max={len(moments) - 1} value={peak} '
            f'data-moments="moments-{device}" style="width:100%" '
            f'aria-label="moment of the trace">'
            f'<div class=sub id="moments-{device}-label"></div><div id="moments-{device}-maps"></div>'
            f'<script type="application/json" id="moments-{device}">{payload}</script>')


def icicle_svg(stacks: dict[tuple[str, ...], int], width: int = 1060, depth: int = 14) -> str:
    """Live memory at the peak as an icicle: the outermost frames on top, each frame as wide as
    the bytes allocated under it; hover a frame for its name and size."""
    total = sum(stacks.values())
    if not total:
        return "<p class=sub>Nothing was live at the peak.</p>"
    tree: dict = {}                          # frame -> [bytes, children]
    for stack, nbytes in stacks.items():
        level = tree
        for frame in stack[:depth]:
            node = level.setdefault(frame, [0, {}])
            node[0] += nbytes
            level = node[1]
    row, parts, shown = 20, [], 0

    def draw(level: dict, x0: float, row_index: int) -> None:
        nonlocal shown
        x = x0
        for frame, (nbytes, children) in sorted(level.items(), key=lambda item: -item[1][0]):
            w = nbytes / total * width
            if w >= 1:
                shown = max(shown, row_index + 1)
                label = frame.rsplit("/", 1)[-1]
                fits = int(w / 6.6)
                text = (label if len(label) <= fits else label[:max(fits - 1, 0)] + "…") if fits >= 4 else ""
                hue = 200 + zlib.crc32(frame.encode(errors="replace")) % 40     # stable across runs
                parts.append(
                    f'<g><title>{escape(frame)}: {escape(format_size(nbytes))} '
                    f'({nbytes / total:.1%})</title><rect x="{x:.1f}" y="{row_index * row}" '
                    f'width="{max(w - 1, 0.5):.1f}" height="{row - 2}" fill="hsl({hue},55%,72%)" />'
                    f'<text x="{x + 3:.1f}" y="{row_index * row + 13}">{escape(text)}</text></g>')
                draw(children, x, row_index + 1)
            x += w

    draw(tree, 0.0, 0)
    height = shown * row
    return (f'<svg viewBox="0 0 {width} {height}" width="100%" role="img" '
            f'aria-label="live memory at the peak by stack">{"".join(parts)}</svg>'
            f'<div class=sub>{escape(format_size(total))} live at the peak; outermost frames on '
            f'top, each frame as wide as the memory allocated under it (hover for details)</div>')


def _table(headers: list[str], rows: list[list[str]], numeric: set[int] = frozenset()) -> str:
    if not rows:
        return "<p class=sub>None.</p>"
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>"
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _sites_table(sites, limit: int = 15) -> str:
    return _table(["bytes", "allocations", "site"],
                  [[escape(format_size(s.bytes)), str(s.count), f"<code>{escape(s.where)}</code>"]
                   for s in sites[:limit]], {0, 1})


def _leak_card(report: Report) -> str:
    """Leaks are growth where a recording has steps; without, what is live at the end is not
    called a leak (neutral), as is npumem's exact report of its own runtime."""
    if report.step_leaks:
        per_step = sum(leak.per_step for leak in report.step_leaks)
        return (f'<div class=card><span>leaks (growing per step)</span><b class=bad>'
                f'{len(report.step_leaks)} site(s), +{escape(format_size(per_step))}</b></div>')
    if report.step_growth:
        return '<div class=card><span>leaks (growing per step)</span><b class=ok>none</b></div>'
    if report.leak_heading.startswith("Leaks"):
        leak_class = "bad" if report.leaks else "ok"
        return (f'<div class=card><span>leaks</span><b class={leak_class}>'
                f'{sum(r.count for r in report.leaks)} / '
                f'{escape(format_size(report.leaked_bytes))}</b></div>')
    return (f'<div class=card><span>live at the end (no steps marked)</span>'
            f'<b>{escape(format_size(report.leaked_bytes))}</b></div>')


def _step_leaks(report: Report) -> str:
    rows = []
    for leak in report.step_leaks[:50]:
        stack = "".join(f"<div><code>{escape(f)}</code></div>"
                        for f in [f"inside {frame}" for frame in leak.inner[-3:]]
                        + [f"called from {frame}" for frame in leak.stack[:12]])
        where = f"<details open><summary><code>{escape(leak.where)}</code></summary>{stack}</details>"
        kinds = ", ".join(f"{kind} {format_size(n)}" for kind, n in
                          sorted(leak.categories.items(), key=lambda kv: -kv[1]))
        steps = f"{leak.steps} inferred" if getattr(leak, "inferred", False) else str(leak.steps)
        rows.append([f"+{escape(format_size(leak.per_step))}", steps,
                     escape(format_size(leak.live)), escape(kinds), where])
    return _table(["per step", "steps", "live at end", "categories", "the user's line"], rows,
                  {0, 1, 2})


def render_html(report: Report, extra: str = "", curves: dict | None = None) -> str:
    """The report's page; `extra` (HTML) and the usage `curves` (as `usage_sections` takes
    them: the components of an Ascend profile) go after the devices' sections."""
    out = [_page_head(report.title, "npumem memory report")]
    out += [f"<p class=sub>{escape(note)}</p>" for note in report.notes]
    cards = []
    for d in report.devices:
        cards.append(f'<div class=card><span>device {d.device} peak allocated</span>'
                     f'<b>{escape(format_size(d.peak_allocated))}</b></div>')
        cards.append(f'<div class=card><span>device {d.device} peak reserved</span>'
                     f'<b>{escape(format_size(d.peak_reserved))}</b></div>')
    cards.append(_leak_card(report))
    out.append(f"<div class=cards>{''.join(cards)}</div>")
    if report.oom:                # the run died: what happened, and the line to set, come first
        out.append("<h2 class=bad>Out of memory</h2><pre style=\"white-space:pre-wrap\">"
                   + escape("\n".join(report.oom)) + "</pre>")
    for d in report.devices:
        spans = [span for span in report.spans if span.kind != "op" or span.device == d.device]
        out.append(f"<h2>Device {d.device}: allocated and reserved over time</h2>")
        out.append(timeline_svg(d.timeline, spans=spans, largest=d.largest, key=str(d.device)))
        start = timeline_window(d.timeline, spans)[0]
        if d.category_timeline:
            out.append(f"<h2>Device {d.device}: live memory by category</h2>")
            out.append(category_svg(d.category_timeline))
        if d.peak_categories:
            out.append(f"<h2>Device {d.device}: the peak by category</h2>")
            out.append(_table(["category", "bytes", "share"], category_rows(d.peak_categories),
                              {1, 2}))
        out.append(f"<h2>Device {d.device}: live at the peak ({escape(format_size(d.peak_allocated))}"
                   f" at {_at(d.peak_time_us - start)})</h2>")
        out.append(_sites_table(d.at_peak))
        out.append(f"<h2>Device {d.device}: live at the peak, by stack</h2>")
        out.append(icicle_svg(d.peak_stacks))
        out.append(f"<h2>Device {d.device}: top allocation sites (all allocations)</h2>")
        out.append(_sites_table(d.by_site))
    if extra:
        out.append(extra)
    if curves:
        out += usage_sections(curves)
    out.append(f"<h2>{escape(report.leak_heading)}</h2>")
    analysis = report.leak_analysis       # on which steps leaks were judged, or why they were not
    if analysis is not None and analysis.steps:
        out += [f"<p class=sub>{escape(analysis.verdict(device))}</p>"
                for device in sorted(analysis.steps)]
    if report.step_leaks:
        out.append(_step_leaks(report))
    rows = []
    for row in report.leaks[:50] if not report.step_leaks else ():
        stack = "".join(f"<div><code>{escape(f)}</code></div>" for f in row.callers)
        where = f"<code>{escape(row.where)}</code>"
        if stack:
            where = f"<details><summary>{where}</summary>{stack}</details>"
        rows.append([escape(format_size(row.bytes)), str(row.count), where])
    if rows or not report.step_leaks:
        out.append(_table(["bytes", "allocations", "site"], rows, {0, 1}))
    if report.growth:
        out.append("<h2>Growing while the program ran (probable leaks)</h2><ul>")
        out += [f"<li class=bad><code>{escape(line)}</code></li>" for line in report.growth[:50]]
        out.append("</ul>")
    out.append("<h2>Fragmentation and block map</h2>")
    if report.fragmentation_note:
        out.append(f"<p class=sub>Fragmentation: {escape(report.fragmentation_note)}.</p>")
    elif not report.fragmentation:
        out.append("<p class=sub>No segments: nothing is reserved.</p>")
    for pool in report.fragmentation:
        out.append(f"<p>device {pool.device}: reserved {escape(format_size(pool.reserved))}, "
                   f"free {escape(format_size(pool.free))}: {escape(describe_free(pool))} "
                   "(fragmentation = (stranded - largest stranded piece) / stranded; cached "
                   "empty segments are not fragmented)</p>")
        for seg in pool.segments[:40]:
            cells = "".join(f'<i class="{_CELL_CLASS[c]}"></i>' for c in seg.map)
            out.append(f'<div class=sub><code>0x{seg.address:x}</code> {escape(format_size(seg.size))},'
                       f' free {escape(format_size(seg.free))}, ratio {seg.ratio:.3f}'
                       + ("" if seg.pool is None else f", private pool {escape(str(seg.pool))}")
                       + '</div>'
                       f'<div class=map title="0x{seg.address:x}">{cells}</div>')
        if len(pool.segments) > 40:
            out.append(f"<p class=sub>... {len(pool.segments) - 40} more segments</p>")
    out.append('<div class="legend sub"><i class=c-a></i>allocated<i class=c-p></i>pending free'
               '<i class=c-m></i>partly allocated<i class=c-f></i>free</div>')
    for device, moments in sorted(report.moments.items()):
        out.append(_moments_section(device, moments))
    if report.ops:
        out.append("<h2>Ops on the streams</h2>")
        out.append(_table(["op", "runs", "total ms"],
                          [[escape(o.name), str(o.count), f"{o.total_us / 1e3:.3f}"]
                           for o in report.ops[:30]], {1, 2}))
    if report.kernels:
        out.append(kernels_section(report.kernels))
    if report.samples:
        peak_rss = max(s.host_rss for s in report.samples)
        out.append(f"<h2>Host</h2><p>peak resident set size {escape(format_size(peak_rss))} over "
                   f"{len(report.samples)} samples</p>")
    if any(d.timeline for d in report.devices) or report.moments or curves:
        out.append(f"<script>{_ZOOM}{_MOMENTS}</script>")
    out.append("</body></html>")
    return "\n".join(out)
