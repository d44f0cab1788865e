"""A torch_npu (Ascend PyTorch) profiler output, or msprof's, as one report: the operators that
held memory at the peak (operator_memory.csv, the operator standing as the allocation site), the
memory of each component (memory_record.csv: PTA, GE, PTA+GE, APP, WORKSPACE; npu_module_mem.csv:
CANN's components) and a timeline of them.

torch_npu writes `<name>_ascend_pt/ASCEND_PROFILER_OUTPUT/` (sizes in MB); msprof writes
`PROF_*/mindstudio_profiler_output/` with `_<timestamp>` in each name (sizes in KB). A report is
asked for with any of: the `*_ascend_pt` folder, its ASCEND_PROFILER_OUTPUT, a folder holding
one or more of those (one report each), or one of the files (its neighbours are read with it).
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field

from ..trace import msprof
from ..units import MiB, format_size

OUTPUT = "ASCEND_PROFILER_OUTPUT"
MSPROF_OUTPUT = "mindstudio_profiler_output"
_KINDS = {"operator": "operator_memory", "record": "memory_record", "module": "npu_module_mem"}
_SEARCH_DEPTH = 3              # parent -> *_ascend_pt -> PROF_* -> mindstudio_profiler_output


@dataclass
class AscendFiles:
    """The memory files of one profiler output folder (None: not there)."""

    folder: str
    operator: str | None = None
    record: str | None = None
    module: str | None = None
    skipped: list[str] = field(default_factory=list)    # further slices, not read


def _matches(folder: str, stem: str) -> list[str]:
    """`stem.csv`, or msprof's `stem_<timestamp>.csv` / `stem_slice_<n>_<timestamp>.csv`."""
    exact = os.path.join(folder, f"{stem}.csv")
    found = [exact] if os.path.isfile(exact) else []
    return found + sorted(p for p in glob.glob(os.path.join(glob.escape(folder), f"{stem}_*.csv"))
                          if os.path.isfile(p))


def files_in(folder: str) -> AscendFiles | None:
    """The memory files directly in `folder`, or None when it holds none."""
    files = AscendFiles(folder)
    for attribute, stem in _KINDS.items():
        found = _matches(folder, stem)
        if found:
            setattr(files, attribute, found[0])
            files.skipped += found[1:]
    return files if files.operator or files.record or files.module else None


def find_outputs(path: str, depth: int = _SEARCH_DEPTH) -> list[AscendFiles]:
    """The profiler output folders at or under `path`, as described in the module's doc."""
    here = files_in(path)
    if here:
        return [here]
    for name in (OUTPUT, MSPROF_OUTPUT):
        inner = os.path.join(path, name)
        if os.path.isdir(inner):
            found = files_in(inner)
            if found:
                return [found]
    if depth <= 0:
        return []
    try:
        children = sorted(os.listdir(path))
    except OSError:
        return []
    outputs = []
    for child in children:
        inner = os.path.join(path, child)
        # only the profilers' own folder names: an npumem profile folder beside them (which
        # holds msprof-named CSVs too) is not taken for one
        if os.path.isdir(inner) and (child.endswith("_ascend_pt") or child.startswith("PROF_")):
            outputs += find_outputs(inner, depth - 1)
    return outputs


def files_beside(path: str) -> AscendFiles:
    """One memory file and the others of its folder: the operators of `path` (when it is an
    operator_memory file) with the folder's memory_record and npu_module_mem files."""
    folder = os.path.dirname(os.path.abspath(path))
    files = files_in(folder) or AscendFiles(folder)
    files.folder, files.skipped = path, []          # the title names the file asked for
    files.operator = path
    return files


# --- components --------------------------------------------------------------------------------

@dataclass
class Component:
    """One component's curve: [(time us, MB)] of allocated and of reserved memory."""

    name: str
    device: str
    source: str                       # the file it comes from
    allocated: list[tuple[float, float]]
    reserved: list[tuple[float, float]]
    samples: list[tuple] = field(default_factory=list)   # (time, allocated, reserved, active) MB

    @property
    def main(self) -> list[tuple[float, float]]:
        """The curve the timeline draws: allocated where the file has it, else reserved."""
        return self.allocated or self.reserved


def _curve(samples, index: int) -> list[tuple[float, float]]:
    return sorted((s[0], s[index]) for s in samples if s[0] is not None and s[index] is not None)


def read_components(files: AscendFiles, counts: dict[str, int]) -> list[Component]:
    """memory_record's and npu_module_mem's curves, by component and device. torch_npu writes
    APP (the process's device memory, from msprof's npu_mem) in one total or the other; it is
    shown as reserved either way."""
    components = []
    for path in (files.record, files.module):
        if path is None:
            continue
        for (name, device), samples in msprof.usage_curves(path, counts).items():
            allocated, reserved = _curve(samples, 1), _curve(samples, 2)
            if name == "APP" and not reserved:
                allocated, reserved = [], allocated
            components.append(Component(name, device, os.path.basename(path), allocated,
                                        reserved, samples))
    return components


def _mb(value: float | None) -> str:
    return "-" if value is None else format_size(int(round(value * MiB)))


def _at(curve: list[tuple[float, float]], time_us: float) -> float | None:
    """The curve's value at `time_us`: its last sample at or before it."""
    value = None
    for t, v in curve:
        if t > time_us:
            break
        value = v
    return value


def components_lines(components: list[Component], peak_us: float | None) -> list[str]:
    """A table of each component's peaks (and value at the operators' peak, when known)."""
    if not components:
        return []
    at_peak = peak_us is not None
    lines = ["Memory by component (peaks; PTA: torch_npu's caching allocator, GE: CANN's graph "
             "engine, APP: the whole process on the device; npu_module_mem: CANN's own "
             "components):"]
    header = (f"  {'component':<12} {'device':<7} {'peak allocated':>14} {'peak reserved':>14}"
              + (f" {'at the peak':>12}" if at_peak else "") + f" {'samples':>8}  file")
    lines.append(header)
    for c in components:
        peak_a = max((v for _, v in c.allocated), default=None)
        peak_r = max((v for _, v in c.reserved), default=None)
        row = (f"  {c.name[:12] or '?':<12} {c.device[:7] or '?':<7} {_mb(peak_a):>14} "
               f"{_mb(peak_r):>14}")
        if at_peak:
            row += f" {_mb(_at(c.main, peak_us)):>12}"
        lines.append(row + f" {len(c.allocated) or len(c.reserved):>8}  {c.source}")
    return lines


# --- the timeline ------------------------------------------------------------------------------

_BARS = "▁▂▃▄▅▆▇█"
COLUMNS = 48


def sparkline(curve: list[tuple[float, float]], start: float, end: float,
              columns: int = COLUMNS) -> str:
    """The curve as `columns` characters over [start, end]: each the highest value in its
    stretch (the value carried on from before where there is no sample), scaled to the curve's
    peak; blank before the first sample."""
    peak = max((v for _, v in curve), default=0.0)
    width = (end - start) / columns if end > start else 1.0
    out, index, last = [], 0, None
    for column in range(columns):
        stop = start + (column + 1) * width
        high = last
        while index < len(curve) and (curve[index][0] < stop or column == columns - 1):
            last = curve[index][1]
            high = last if high is None else max(high, last)
            index += 1
        if high is None:
            out.append(" ")
        else:
            level = int(high / peak * (len(_BARS) - 1) + 0.5) if peak > 0 else 0
            out.append(_BARS[min(max(level, 0), len(_BARS) - 1)])
    return "".join(out)


def _span(us: float, digits: str = ".3f") -> str:
    return f"{us / 1e3:{digits}} ms" if us < 1e6 else f"{us / 1e6:{digits}} s"


def timeline_lines(rows: list[tuple[str, list[tuple[float, float]]]]) -> list[str]:
    """A compact timeline: one line per curve over the window they share, with its peak."""
    rows = [(label, curve) for label, curve in rows if curve]
    if not rows:
        return []
    start = min(curve[0][0] for _, curve in rows)
    end = max(curve[-1][0] for _, curve in rows)
    lines = [f"Timeline over {_span(end - start)} ({COLUMNS} columns of {_span((end - start) / COLUMNS, '.4g')};"
             " each line scaled to its own peak):"]
    for label, curve in rows:
        peak_t, peak = max(curve, key=lambda point: (point[1], -point[0]))
        lines.append(f"  {label[:24]:<24} |{sparkline(curve, start, end)}| peak {_mb(peak)} at "
                     f"+{_span(peak_t - start)}")
    return lines


# --- the report --------------------------------------------------------------------------------

@dataclass
class AscendReport:
    title: str
    text: str
    report: object | None                     # profile.report.Report of the operators
    components: list[Component]
    timeline: list[tuple[str, list[tuple[float, float]]]]


def build(files: AscendFiles, top: int = 10) -> AscendReport:
    """The report of one output folder; TraceFormatError for a file that is not what its name
    says (the caller prints it in one line)."""
    from .report import build_report, format_report

    title = f"npumem report of {files.folder} (Ascend profiler memory)"
    counts: dict[str, int] = {}
    components = read_components(files, counts)          # first: its notes go at the top
    component_notes = msprof.describe(counts)
    component_notes += [f"{os.path.basename(path)} not read (one file of each kind is)"
                        for path in files.skipped]
    report, lines, peak_us = None, [], None
    timeline: list[tuple[str, list[tuple[float, float]]]] = []
    if files.operator:
        data, notes = msprof.to_snapshot(files.operator)
        report = build_report(data, title)
        report.notes[:0] = [f"{os.path.basename(files.operator)}: {note}" for note in notes]
        report.notes = [note for note in report.notes if not note.startswith(
            "This trace has allocations and frees but no segment data")]
        report.notes += component_notes
        report.notes.append("Sites are operators (operator_memory.csv's Name); reserved here is "
                            "what the operators allocated: the allocators' own reserved memory "
                            "is in the components below.")
        text = format_report(report, top)
        for device in report.devices:
            if device.peak_entry >= 0:
                peak_us = device.peak_time_us if peak_us is None else peak_us
            curve = [(p.time_us, p.allocated / MiB) for p in device.timeline]
            timeline.append((f"operators (dev {device.device})", sorted(curve)))
    else:
        text = f"{title}\n{'=' * len(title)}\n"
        lines.append("note: no operator_memory.csv here (torch_npu writes it with "
                     "profile_memory=True): no operators to show")
        lines += [f"note: {note}" for note in component_notes]
    if components:
        lines += [""] + components_lines(components, peak_us)
    order = {"PTA+GE": 0, "PTA": 1, "GE": 2, "APP": 3}
    for c in sorted(components, key=lambda c: (order.get(c.name, 9), c.name, c.device)):
        if c.main:
            module = " (module)" if c.source.startswith("npu_module_mem") else ""
            timeline.append((f"{c.name} {c.device}".strip() + module, c.main))
    if timeline:
        lines += [""] + timeline_lines(timeline)
    text += "\n".join(lines) + ("\n" if lines else "")
    return AscendReport(title, text, report, components, timeline)


def render_page(result: AscendReport) -> str:
    """The HTML report: the operators' report (timeline, live at the peak by operator) with
    the components' table and curves after it."""
    from html import escape

    from .html import render_html, render_usage_html

    rows = []
    for c in result.components:
        peak_a = max((v for _, v in c.allocated), default=None)
        peak_r = max((v for _, v in c.reserved), default=None)
        rows.append(f"<tr><td>{escape(c.name)}</td><td>{escape(c.device)}</td>"
                    f'<td class="n">{escape(_mb(peak_a))}</td><td class="n">{escape(_mb(peak_r))}'
                    f"</td><td>{escape(c.source)}</td></tr>")
    table = ("<h2>Memory by component</h2><table><tr><th>component</th><th>device</th>"
             "<th>peak allocated</th><th>peak reserved</th><th>file</th></tr>"
             + "".join(rows) + "</table>") if rows else ""
    # a curve with one total (APP, npu_module_mem) draws it as both lines
    curves = {(c.name + (" (npu_module_mem)" if c.source.startswith("npu_module_mem") else ""),
               c.device): [(t, r if a is None else a, a if r is None else r, v)
                                   for t, a, r, v in c.samples]
              for c in result.components if c.main}
    if result.report is not None:
        return render_html(result.report, extra=table, curves=curves)
    return render_usage_html(result.title, curves, extra=table)


def is_operator_file(path: str) -> bool:
    """Whether `path` is an operator_memory CSV (by its header)."""
    from ..trace import TraceFormatError
    from ..trace.textio import read_head

    try:
        return msprof.sniff(read_head(path))
    except (TraceFormatError, OSError):
        return False


__all__ = ["AscendFiles", "AscendReport", "build", "files_beside", "find_outputs",
           "is_operator_file", "render_page", "sparkline"]
