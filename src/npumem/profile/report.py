"""The report: peak, who held memory at the peak, leaks, fragmentation — as text (the terminal,
summary.txt) and as data for the HTML page. Built from a snapshot (npumem's or PyTorch's), plus
what only a live profile knows: the exact leak report, op timings and host samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..trace.snapshot.columns import SEGMENT_ADD, SEGMENT_REMOVE, holds, impossible_grant
from ..units import format_size
from .analysis import DeviceAnalysis, SiteUsage, analyze_snapshot, group_by_site, live_after
from .fragmentation import PoolFragmentation, analyze, format_fragmentation, maps_over_time
from .leaks import LeakReport
from .leak_analysis import LeakAnalysis, analyze_leaks
from .step_leaks import StepLeak, growth_per_step
from .sampler import Sample
from .tracker import Annotation


@dataclass
class OpRow:
    name: str
    count: int
    total_us: float


@dataclass
class Span:
    """A user range, a mark (start == end) or an op, in the time base of the snapshot."""

    kind: str                          # "range" | "mark" | "op"
    name: str
    start_us: float
    end_us: float
    lane: str                          # the thread or stream it ran on
    device: int


@dataclass
class Report:
    title: str
    devices: list[DeviceAnalysis]
    fragmentation: list[PoolFragmentation]
    leaks: list[SiteUsage]
    leak_heading: str                 # what the leak list means for this source
    ops: list[OpRow] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    oom: list[str] = field(default_factory=list)      # an out-of-memory, explained
    spans: list[Span] = field(default_factory=list)   # for the timeline (a live profile only)
    moments: dict = field(default_factory=dict)       # device -> fragmentation.maps_over_time
    growth: list[str] = field(default_factory=list)   # growing sites, described
    # live bytes at each step boundary and at the end, less the first boundary's (per device)
    step_growth: dict = field(default_factory=dict)
    step_leaks: list[StepLeak] = field(default_factory=list)   # a recording's growing sites
    kernels: list = field(default_factory=list)       # AI core Timelines (a live profile only)
    leak_analysis: LeakAnalysis | None = None         # steps and growth (a recording's)
    fragmentation_note: str = ""      # why fragmentation is not known (a window of a recording)

    @property
    def leaked_bytes(self) -> int:
        return sum(row.bytes for row in self.leaks)


def leak_sites(report: LeakReport) -> list[SiteUsage]:
    return [SiteUsage(site.where, site.count, site.bytes, [str(f) for f in site.stack[1:8]])
            for site in report.sites]


def op_rows(annotations: list[Annotation]) -> list[OpRow]:
    rows: dict[str, OpRow] = {}
    for a in annotations:
        if a.kind == "op":
            row = rows.setdefault(a.name, OpRow(a.name, 0, 0.0))
            row.count += 1
            row.total_us += (a.end_ns - a.start_ns) / 1e3
    return sorted(rows.values(), key=lambda r: -r.total_us)


def spans_of(annotations: list[Annotation], clock) -> list[Span]:
    """The annotations as spans; `clock(ns)` gives the snapshot's microseconds (Tracker.wall_us).
    Lanes are named "thread 1", "stream 2", ... in order of appearance (ids are huge numbers)."""
    names: dict[tuple[str, int], str] = {}

    def lane(a: Annotation) -> str:
        kind = "stream" if a.kind == "op" else "thread"
        if kind == "stream" and not a.thread:
            return "default stream"
        key = (kind, a.thread)
        return names.setdefault(key, f"{kind} {1 + sum(1 for k in names if k[0] == kind)}")

    return [Span(a.kind, a.name, clock(a.start_ns), clock(a.end_ns), lane(a), a.device)
            for a in annotations]


def build_report(snapshot: dict, title: str, leaks: LeakReport | None = None,
                 annotations: list[Annotation] = (), samples: list[Sample] = (),
                 clock=None) -> Report:
    """With `leaks` (a live profile's exact report) leaks are those; otherwise the blocks the
    snapshot's trace allocated and never freed. With `clock` (ns -> the snapshot's us) the
    annotations are placed on the timeline too."""
    devices = analyze_snapshot(snapshot)
    growing: list[StepLeak] = []
    # each device's steps (marked, inferred or none) and what grew over them: one analysis
    analysis = analyze_leaks(snapshot, [d.device for d in devices
                                        if d.device < len(snapshot.get("device_traces") or [])])
    starts = {device: steps.starts for device, steps in analysis.steps.items()}
    if leaks is not None:
        rows, heading = leak_sites(leaks), "Leaks: allocations still live at exit"
    else:
        rows, heading, growing = _snapshot_leaks(snapshot, analysis)
    notes = list(snapshot.get("npumem_notes") or [])        # what reading the file changed
    meta = snapshot.get("npumem")                          # the tensor recorder's own notes
    sampled = meta.get("sampled_out_bytes") if isinstance(meta, dict) else 0
    if sampled:
        notes.append(f"sampled (--sample-bytes): {format_size(sampled)} of small allocations "
                     "were left out; peaks and sites count what was kept")
    dropped = meta.get("dropped_events") if isinstance(meta, dict) else 0
    if dropped:
        notes.append(f"the oldest {dropped:,} events fell out of the recorder's ring "
                     "(--max-entries keeps more): the trace starts later than the run")
    traces = snapshot.get("device_traces") or []
    for device, trace in enumerate(traces):
        damaged = impossible_grant(trace) if trace else None
        if damaged:
            notes.append(f"device {device}, entry {damaged[0]}: {damaged[1]}: the figures below "
                         f"count it as written")
    window = snapshot.get("npumem_window") or {}
    if any(traces) and not snapshot.get("segments") and not window.get("reserved_known") and not any(
            _has_segment_events(trace) for trace in traces):
        notes.append("This trace has allocations and frees but no segment data, so what an "
                     "allocator reserved cannot be known: the reserved figures here are the "
                     "allocated ones. `npumem replay` shows what each allocator would reserve.")
    if not snapshot.get("device_traces") or not any(snapshot["device_traces"]):
        notes.append("The snapshot has no event history (device_traces): record it with "
                     "record_memory_history / torch.cuda.memory._record_memory_history to get "
                     "the timeline, the peak and allocation sites.")
    from .oom import explain_oom

    report = Report(title, devices, analyze(snapshot), rows, heading, op_rows(list(annotations)),
                    list(samples), notes)
    report.step_leaks = growing
    report.leak_analysis = analysis
    report.step_growth = {device: growth_per_step(snapshot, device, at)
                          for device, at in starts.items() if at}
    report.oom = explain_oom(snapshot, title)
    if clock is not None:
        report.spans = spans_of(list(annotations), clock)
    if window and not window.get("end_state"):
        report.fragmentation_note = ("not known for a window that ends before the recording "
                                     "does: the snapshot's segments are its end state")
        return report
    for device in report.devices:
        moments = maps_over_time(snapshot, device.device, also=device.peak_entry)
        if any(maps for _, _, maps in moments):         # a trace with segments to draw
            report.moments[device.device] = moments
    return report


# The leak list's headings, by what the recording allowed to be judged
GROWING = "Leaks: growing step over step"
LIVE_AT_DUMP = "Live at the dump (the snapshot has no trace to tell when)"
LIVE_AT_END = ("Allocated during the trace and still live at its end (not leaks: without steps, "
               "growth cannot be told from memory made once)")


def _snapshot_leaks(snapshot: dict, analysis: LeakAnalysis
                    ) -> tuple[list[SiteUsage], str, list[StepLeak]]:
    """A recording's leaks are what grows step over step (`leak_analysis`); what is merely live
    at the end (weights, optimizer state, caches) is not. Without steps to judge on, the list is
    what is live at the end, and says that it is no more than that."""
    traces = snapshot.get("device_traces") or []
    if analysis.any_judged:
        growing = analysis.leaks
        rows = [SiteUsage(leak.where, leak.count, leak.live, leak.stack) for leak in growing]
        return rows, GROWING, growing
    if not any(traces):              # no history: what the dump holds, where it was made
        rows = group_by_site([{"size": block.get("size", 0), "frames": block.get("frames"),
                               "requested_size": block.get("requested_size")}
                              for segment in snapshot.get("segments") or []
                              for block in segment.get("blocks") or []
                              if block.get("state") == "active_allocated"])
        return rows, LIVE_AT_DUMP, []
    rows = group_by_site([entry for trace in traces
                          for entry in live_after([], trace, len(trace) - 1)])
    return rows, LIVE_AT_END, []


def _has_segment_events(trace) -> bool:
    return holds(trace, *SEGMENT_ADD, *SEGMENT_REMOVE)


def _sites(title: str, sites: list[SiteUsage], limit: int) -> list[str]:
    if not sites:
        return []
    lines = [f"  {title}:"]
    lines += [f"    {format_size(s.bytes):>12} in {s.count:>6} allocation(s)  {s.where}"
              for s in sites[:limit]]
    return lines


def _signed(nbytes: int) -> str:
    return ("+" if nbytes >= 0 else "-") + format_size(abs(nbytes))


def format_report(report: Report, limit: int = 10) -> str:
    lines = [report.title, "=" * len(report.title)]
    lines += [f"note: {note}" for note in report.notes]
    if report.oom:
        lines.append("Out of memory:")
        lines += ["  " + line for line in report.oom]
        lines.append("")
    for device in report.devices:
        ratio = device.peak_reserved / device.peak_allocated if device.peak_allocated else 0.0
        events = f"{device.events:,} event{'' if device.events == 1 else 's'}"
        lines.append(f"device {device.device}: {events}, peak allocated "
                     f"{format_size(device.peak_allocated)}, peak reserved "
                     f"{format_size(device.peak_reserved)} (reserved/allocated {ratio:.3f})")
        if device.peak_categories:
            lines.append("  live at the allocated peak, by category: " + ", ".join(
                f"{name} {format_size(n)}" for name, n in device.peak_categories.items()))
        growth = report.step_growth.get(device.device)
        steps = report.leak_analysis.steps.get(device.device) if report.leak_analysis else None
        if growth:
            how = " (steps inferred, not marked)" if steps is not None and steps.inferred else ""
            lines.append(f"  live bytes at each step{how}, against the first: "
                         + " ".join(_signed(n) for n in growth[:12])
                         + (" ..." if len(growth) > 12 else ""))
        lines += _sites("live at the allocated peak, by site", device.at_peak, limit)
        lines += _sites("all allocations, by site", device.by_site, limit)
    lines.append("")
    analysis = report.leak_analysis
    if analysis is not None and analysis.steps and report.leak_heading in (GROWING, LIVE_AT_END):
        lines.append("Leaks (growth at step boundaries):")
        lines += [f"  {line}" for line in analysis.lines(limit)]
        if report.leak_heading == GROWING:
            return _rest(report, lines, limit)
        lines.append("")
    lines.append(f"{report.leak_heading}:")
    if not report.leaks:
        lines.append("  none")
    for row in report.leaks[:limit] if not report.step_leaks else ():
        lines.append(f"  {format_size(row.bytes):>12} in {row.count:>6} allocation(s)  {row.where}")
        lines += [f"      called from {frame}" for frame in row.callers[:8]]
    if len(report.leaks) > limit:
        lines.append(f"  ... and {len(report.leaks) - limit} more site(s)")
    return _rest(report, lines, limit)


def _rest(report: Report, lines: list[str], limit: int) -> str:
    """The report after its leak section."""
    if report.growth:
        lines.append("")
        lines.append("Growing while the program ran (probable leaks):")
        lines += [f"  {line}" for line in report.growth[:limit]]
    lines.append("")
    lines.append("Fragmentation (now):")
    lines += ["  " + line for line in (report.fragmentation_note or format_fragmentation(
        report.fragmentation, 8)).splitlines()]
    if report.kernels:
        lines.append("")
        lines.append(f"Kernel launches on the AI cores (modelled; the last {len(report.kernels)}):")
        lines += [f"  {timeline.summary()}" for timeline in report.kernels[-limit:]]
    if report.ops:
        lines.append("")
        lines.append("Ops (time on the streams):")
        lines += [f"  {op.name:<20} {op.count:>7} run(s) {op.total_us / 1e3:>10.3f} ms"
                  for op in report.ops[:limit]]
    return "\n".join(lines) + "\n"


def _site_json(site: SiteUsage) -> dict:
    return {"where": site.where, "allocations": site.count, "bytes": site.bytes,
            "callers": site.callers[:8]}


def report_json(report: Report, limit: int = 10) -> dict:
    """The report as data (`npumem report --json`): what the text says, from the same
    analysis. `leaks` and `steps` are `leak_analysis.LeakAnalysis.to_json()`'s; without steps to
    judge on, `live_at_end` lists what was allocated and still live (not leaks)."""
    analysis = report.leak_analysis
    leaks = analysis.to_json() if analysis is not None else {
        "steps": {"count": 0, "source": None, "marker": None, "judged": False,
                  "reason": "a live profile of npumem's runtime: leaks are what is live at exit"},
        "leaks": []}
    out = {
        "title": report.title,
        "notes": list(report.notes),
        "devices": [{
            "device": d.device, "events": d.events,
            "peak_allocated_bytes": d.peak_allocated, "peak_reserved_bytes": d.peak_reserved,
            "peak_time_us": d.peak_time_us, "peak_categories": dict(d.peak_categories),
            "at_peak": [_site_json(s) for s in d.at_peak[:limit]],
            "sites": [_site_json(s) for s in d.by_site[:limit]],
            "live_bytes_at_each_step": list(report.step_growth.get(d.device) or [])}
            for d in report.devices],
        "fragmentation": {"known": not report.fragmentation_note,
                          "note": report.fragmentation_note or None,
                          "pools": [{"device": f.device, "reserved_bytes": f.reserved,
                                     "allocated_bytes": f.allocated, "free_bytes": f.free,
                                     "largest_free_bytes": f.largest_free,
                                     "cached_bytes": f.cached,
                                     "cached_segments": f.cached_segments,
                                     "stranded_bytes": f.stranded,
                                     "largest_stranded_bytes": f.largest_stranded,
                                     "ratio": round(f.ratio, 4)}
                                    for f in report.fragmentation]},
        "leaks": leaks["leaks"],
        "steps": leaks["steps"],
        "oom": list(report.oom),
    }
    if "steps_by_device" in leaks:
        out["steps_by_device"] = leaks["steps_by_device"]
    if not report.step_leaks:             # what the list under the leak heading holds
        out["live_at_end"] = {"heading": report.leak_heading,
                              "sites": [_site_json(s) for s in report.leaks[:limit]]}
    return out
