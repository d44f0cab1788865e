"""`npumem report`: one report for whatever the user has: a profile folder, a snapshot, any
trace, PyTorch's memory_stats JSON, or Ascend profiler output; cut to a --window or --device."""

from __future__ import annotations

import os

import click

from .errors import CommandError

from .common import is_operator_memory, load_as_snapshot


@click.command()
@click.argument("path", type=click.Path())
@click.option("--html", "html_out", type=click.Path(dir_okay=False), default=None,
              help="Also write the report as a self-contained HTML page.")
@click.option("--top", default=10, show_default=True, type=click.IntRange(min=1),
              help="Sites to list.")
@click.option("--snapshot", "snapshot_path", type=click.Path(dir_okay=False), default=None,
              help="With a memory_stats JSON file: the run's snapshot pickle, for fragmentation.")
@click.option("--device", "device", type=click.IntRange(min=0), default=None,
              help="Report on this device of a snapshot only (default: every device).")
@click.option("--window", "window_text", default=None, metavar="START:END",
              help="Report on part of a recording: entry numbers (1000000:2000000) or times "
                   "from its start (90s:120s, 1500ms:, :2.5s), with what was live at START.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the report of a snapshot or trace as JSON (peak, sites, "
                   "fragmentation, leaks with their evidence, steps and their source): one "
                   "object, or a list of them for a folder with two snapshots.")
def report(path, html_out, top, snapshot_path, device, window_text, as_json):
    """Report on a profile folder, a snapshot pickle (npumem's or PyTorch's
    torch.cuda.memory._snapshot()) or any allocation trace npumem reads: peak, top sites, leaks,
    fragmentation. A JSON file of PyTorch's memory_stats() prints its summary table with hit
    rate (and fragmentation); msprof's memory_record.csv, a summary of its usage curve."""
    from ..output_files import OutputPathError, check_output
    from ..profile.html import render_html
    from ..profile.report import build_report, format_report
    from ..file_paths import not_a_file

    if not (os.path.isfile(path) or os.path.isdir(path)):
        raise CommandError(f"{path}: {not_a_file(path)}")
    window = _window(window_text)
    if html_out:
        try:
            check_output(html_out, None if os.path.isdir(path) else path)
        except OutputPathError as exc:
            raise click.BadParameter(str(exc), param_hint="--html") from None
    if as_json and os.path.isfile(path) and (
            (path.endswith(".json") and not _is_trace(path)) or _is_usage_curve(path)
            or is_operator_memory(path)):
        raise click.BadParameter("reads snapshots and traces (not a memory_stats file, a "
                                 "usage curve or Ascend profiler output)", param_hint="--json")
    if path.endswith(".json") and os.path.isfile(path) and not _is_trace(path):
        _no_window(window, "a memory_stats file")
        _no_device(device, "a memory_stats file")
        _report_torch_stats(path, snapshot_path)
        return
    if snapshot_path is not None:        # it was dropped without a word
        raise click.BadParameter(f"goes with a memory_stats JSON file (for the fragmentation "
                                 f"its totals lack); {path} is not one: drop --snapshot",
                                 param_hint="--snapshot")
    if os.path.isfile(path) and _is_usage_curve(path):
        _no_window(window, "a usage curve")
        _no_device(device, "a usage curve")
        click.echo(_usage_summary(path), nl=False)
        if html_out:
            from ..profile.html import render_usage_html
            from ..trace.msprof import usage_curves

            _write_page(html_out, render_usage_html(f"npumem report of {path}", usage_curves(path)))
        return
    if os.path.isfile(path) and is_operator_memory(path):
        from ..profile.ascend import files_beside

        _no_window(window, "Ascend profiler output")
        _no_device(device, "Ascend profiler output")
        _report_ascend([files_beside(path)], top, html_out)
        return
    if os.path.isdir(path):
        # A profile folder: npumem's memory, and PyTorch's own when the script used torch.
        found = [os.path.join(path, name) for name in ("snapshot.pickle", "torch_snapshot.pickle")
                 if os.path.exists(os.path.join(path, name))]
        if not found:
            from ..profile.ascend import find_outputs

            outputs = find_outputs(path)
            if outputs:                           # a torch_npu (or msprof) profiler output
                if as_json:                       # it printed text, exit 0, to a JSON reader
                    raise click.BadParameter("reads snapshots and traces (not a memory_stats "
                                             "file, a usage curve or Ascend profiler output)",
                                             param_hint="--json")
                _no_window(window, "Ascend profiler output")
                _no_device(device, "Ascend profiler output")
                _report_ascend(outputs, top, html_out)
                return
            raise CommandError(f"{path} has neither torch_snapshot.pickle nor snapshot.pickle "
                               "(an npumem profile folder) nor Ascend profiler memory files "
                               "(operator_memory.csv, memory_record.csv, npu_module_mem.csv, in "
                               "<name>_ascend_pt/ASCEND_PROFILER_OUTPUT or "
                               "PROF_*/mindstudio_profiler_output)")
        snapshots = [(name, load_as_snapshot(name)) for name in found]
        if len(snapshots) == 2 and not any(snapshots[0][1].get("device_traces") or []):
            snapshots = snapshots[1:]             # a plain PyTorch script: npumem saw nothing
    else:
        snapshots = [(path, load_as_snapshot(path))]
    reports = [_built(build_report, _part(data, device, window, name), name)
               for name, data in snapshots]
    if as_json:                  # the same analysis as the text, for scripts and CI
        import json

        from ..profile.report import report_json

        found = [report_json(result, top) for result in reports]
        click.echo(json.dumps(found[0] if len(found) == 1 else found, indent=1))
        if html_out:
            _write_page(html_out, render_html(reports[-1]))
        return
    for result in reports:
        click.echo(format_report(result, top), nl=False)
    if html_out:
        _write_page(html_out, render_html(reports[-1]))


def _window(text: str | None):
    """--window's START:END, read (None without it); a bad one is a usage error."""
    if text is None:
        return None
    from ..profile.window import WindowError, parse_window
    try:
        return parse_window(text)
    except WindowError as exc:
        raise click.BadParameter(str(exc), param_hint="--window") from None


def _no_window(window, what: str) -> None:
    if window is not None:
        raise click.BadParameter(f"{what} has no entries to cut: --window reads snapshots and "
                                 "traces", param_hint="--window")


def _no_device(device, what: str) -> None:
    if device is not None:               # it was dropped without a word
        raise click.BadParameter(f"{what} is reported whole: --device picks a device of a "
                                 "snapshot or trace", param_hint="--device")


def _cut(data: dict, window, path: str) -> dict:
    """`data` cut to --window; a window outside the recording exits 2 saying its extent."""
    if window is None:
        return data
    from ..profile.window import WindowError, windowed
    try:
        return windowed(data, window)
    except WindowError as exc:
        raise CommandError(f"{path}: {exc}")


def _part(data: dict, device: int | None, window, path: str) -> dict:
    """`data` cut to --window (its clock is the whole recording's), then to --device; a device
    the snapshot does not hold exits 2 naming those it does."""
    if device is None:
        return _cut(data, window, path)
    traces = data.get("device_traces") or []
    segments = data.get("segments") or []
    held = sorted({index for index, trace in enumerate(traces) if trace}
                  | {segment.get("device", 0) for segment in segments})
    if device not in held:
        raise CommandError(f"{path} holds no device {device}; its devices: "
                           f"{', '.join(map(str, held)) or 'none'}")
    data = _cut(data, window, path)
    traces = data.get("device_traces") or []
    return {**data, "device_traces": [trace if index == device else []
                                      for index, trace in enumerate(traces)],
            "segments": [segment for segment in data.get("segments") or []
                         if segment.get("device", 0) == device]}


def _report_ascend(outputs, top: int, html_out: str | None) -> None:
    """`report` of Ascend profiler outputs (profile.ascend): one report each; the page is the
    last one's."""
    from ..profile.ascend import build, render_page
    from ..trace import TraceFormatError

    results = []
    for files in outputs:
        try:
            results.append(build(files, top))
        except TraceFormatError as exc:
            raise CommandError(str(exc)) from None
        click.echo(results[-1].text, nl=False)
    if html_out:
        _write_page(html_out, render_page(results[-1]))


def _write_page(path: str, page: str) -> None:
    """--html: the page appears whole or not at all; a failed write exits 2."""
    from ..output_files import written_whole

    try:
        with written_whole(path) as partial, open(partial, "w", encoding="utf-8",
                                                        errors="replace") as out:
            out.write(page)     # (a file name no UTF-8 holds, from a hostile file: "?")
    except OSError as exc:
        raise CommandError(f"cannot write {path}: {exc.strerror}")
    click.echo(f"wrote {path}")


def _is_trace(path: str) -> bool:
    """A file in a trace format npumem reads (a .json one: a Chrome trace, or JSONL so named),
    not a memory_stats() dump."""
    from ..trace import TraceFormatError, detect_format

    try:
        detect_format(path)
        return True
    except TraceFormatError:
        return False


def _is_usage_curve(path: str) -> bool:
    from ..trace import TraceFormatError
    from ..trace.msprof import is_module_memory, is_usage_curve
    from ..trace.textio import read_head

    try:
        head = read_head(path)
        return is_usage_curve(head) or is_module_memory(head)
    except TraceFormatError:          # unreadable: the loader says why
        return False


def _usage_summary(path: str) -> str:
    from ..trace import TraceFormatError
    from ..trace.msprof import usage_summary

    try:
        return usage_summary(path)
    except TraceFormatError as exc:
        raise CommandError(str(exc)) from None


def _report_torch_stats(path: str, snapshot_path: str | None) -> None:
    from ..profile.torch_allocator import torch_memory_summary
    from ..errors import AclError
    from ..profile import SnapshotError

    try:
        click.echo(torch_memory_summary(path, snapshot_path), nl=False)
    except AclError as exc:
        raise CommandError(exc.message) from None        # the sentence, not the ACL code
    except SnapshotError as exc:
        raise CommandError(str(exc)) from None


def _built(build_report, data, name):
    """build_report of a file's data; a recording the allocator model cannot follow (its start
    state, say) is refused naming the file, which the data read from it no longer knows."""
    from ..trace import TraceFormatError

    try:
        return build_report(data, f"npumem report of {name}")
    except TraceFormatError as exc:
        where = f":{exc.position}" if exc.position else ""
        raise CommandError(f"{name}{where}: {exc.reason}") from None
