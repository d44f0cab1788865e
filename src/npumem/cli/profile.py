"""`npumem profile`: run a script with memory tracking on and write a report folder; say
what it found, what could not be written, and what to run next."""

from __future__ import annotations

import contextlib
import os
import sys

import click

from ..cli_sizes import size_option


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--out", "out_dir", default="npumem-profile", show_default=True,
              type=click.Path(), help="Folder for the report and the exported files.")
@click.option("--force", is_flag=True, help="Write into --out even if it holds files.")
@click.option("--stacks", is_flag=True, help="Record the Python stack of every allocation "
              "(file:line of leaks and top sites; a few microseconds each).")
@click.option("--interval", "interval_ms", default=10.0, show_default=True, type=float,
              help="Sampling interval of allocated/reserved/host RSS, in milliseconds.")
@click.option("--max-entries", default=1_000_000, show_default=True, type=click.IntRange(min=1),
              help="Events kept (a ring buffer: the oldest go first).")
@click.option("--torch/--no-torch", "torch_memory", default=True, show_default=True,
              help="Also record PyTorch's own memory when the script imports torch: every "
              "tensor storage with its line and category, and on a GPU or NPU the caching "
              "allocator's history.")
@click.option("--sample-bytes", "sample_bytes", default=None, metavar="SIZE",
              help="For loops too hot to record whole: keep about one PyTorch allocation in "
              "SIZE bytes of those smaller than SIZE (e.g. 1MiB); larger ones are all kept. "
              "Default: every allocation.")
@click.argument("target", nargs=-1, type=click.UNPROCESSED, required=True)
def profile(out_dir, force, stacks, interval_ms, max_entries, torch_memory, sample_bytes,
            target):
    """Run a Python script with memory tracking on and write a report folder.

        npumem profile --stacks -- train.py --epochs 1

    When the script uses torch: report.html and summary.txt on PyTorch's memory (peak by
    category, leaks as growth step over step, the user's lines) and torch_snapshot.pickle
    (PyTorch's snapshot format: `npumem replay`, `tune`, `diff` and `report` take it, or the
    folder). When it uses npumem's runtime: snapshot.pickle, trace.json (Perfetto),
    memory_record.csv, operator_memory.csv and leaks.txt, with its report as report.html and
    summary.txt, or npumem_report.html and npumem_summary.txt beside PyTorch's. Exits with the
    script's own exit code (1 if a file could not be written). `-m module` runs a module
    instead of a script. One run at a time writes a folder; each file appears whole or not at
    all. Ctrl-C saves only the snapshots (within 3.5 s) and exits 130.
    """
    from ..errors import InvalidParamError
    from ..profile import stop_environment_session
    from ..profile.folder import claim_folder
    from ..profile.run import run_target
    from ..profile.session import ProfileSession

    if interval_ms <= 0:
        raise click.BadParameter("must be positive", param_hint="--interval")
    sample = size_option(sample_bytes, "--sample-bytes") if sample_bytes is not None else 0
    if target and target[0].startswith("-") and target[0] != "-m" and not os.path.exists(
            target[0]):                  # an option of profile's own that it does not have
        raise click.NoSuchOption(target[0].partition("=")[0])
    if target and target[0] != "-m":     # a pickle, a binary, a folder: one line, no report
        from ..profile.script_check import not_a_script

        problem = not_a_script(target[0])
        if problem is not None:
            from .errors import CommandError

            raise CommandError(problem)
    stop_environment_session()           # NPUMEM_PROFILE=1 as well: this run is the profile
    created = not os.path.exists(out_dir)
    try:
        folder, lock = claim_folder(out_dir, force)
    except InvalidParamError as exc:
        raise click.UsageError(exc.message) from None
    ran = False                          # a target that is not there leaves no folder behind
    try:
        try:
            session = ProfileSession(stacks=stacks, interval_ms=interval_ms,
                                     max_entries=max_entries, torch_memory=torch_memory,
                                     sample_bytes=sample)
        except InvalidParamError as exc:
            raise click.UsageError(exc.message) from None
        session.start()
        try:
            outcome = run_target(list(target))   # its globals held: live at the end is a leak
        except InvalidParamError as exc:
            session.stop(quick=True)
            raise click.UsageError(exc.message) from None
        ran = True
        title = f"npumem profile of {' '.join(target)}"
        if outcome.interrupted:
            _echo_interrupted(session, folder, session.write_interrupted(folder, title))
            import gc

            gc.freeze()      # exit now: no last collections over the recording (seconds)
            sys.exit(130)
        try:
            session.stop()
            problems = session.write(folder, title)
        except KeyboardInterrupt:         # Ctrl-C while the reports are built: keep what is whole
            _echo_interrupted(session, folder, [])
            sys.exit(130)
        code = outcome.code or _echo_written(session, folder, problems)
        torch_used = _echo_torch_memory(session.tracker.torch_memory, session.torch_report,
                                        folder)
        if session.npumem_used() or not torch_used:
            _echo_npumem_memory(session, folder,
                                "npumem_report.html" if torch_used else "report.html")
        del outcome
        sys.exit(code)
    finally:
        lock.release()
        if created and not ran:
            with contextlib.suppress(OSError):
                os.rmdir(folder)         # only if empty


def _echo_written(session, folder, problems: list[str]) -> int:
    """Say what could not be written and, when files are missing (a full disk), which are
    whole; 1 when one is missing."""
    for problem in problems:
        click.echo(f"npumem profile: could not write {problem}", err=True)
    if session.incomplete:
        click.echo(f"npumem profile: incomplete: {', '.join(session.incomplete)} not written "
                   f"(no part of them is left in {folder}); whole: "
                   f"{', '.join(session.written) or 'nothing'}", err=True)
        return 1
    return 0


def _echo_interrupted(session, folder, problems: list[str]) -> None:
    """An interrupted profile: what it kept, and how to make the reports it skipped."""
    _echo_written(session, folder, problems)
    kept = [name for name in session.written if name.endswith(".pickle")]
    if kept:
        click.echo(f"npumem profile: interrupted: kept {', '.join(session.written)} in {folder}; "
                   f"the reports were skipped: npumem report {folder / kept[0]} --html "
                   f"{folder / 'report.html'} makes them", err=True)
    elif not problems:
        click.echo("npumem profile: interrupted before any memory was recorded: nothing to "
                   "save", err=True)
    else:
        click.echo("npumem profile: interrupted: nothing was saved", err=True)


def _echo_npumem_memory(session, folder, page: str) -> None:
    """The profile's summary of npumem's own runtime memory."""
    from ..units import format_size

    leaks = session.tracker.leaks()
    for device, totals in sorted(session.tracker.devices().items()):
        click.echo(f"npumem profile: npumem device {device} peak allocated "
                   f"{format_size(totals['peak_allocated'])}, peak reserved "
                   f"{format_size(totals['peak_reserved'])}", err=True)
    click.echo(f"npumem profile: npumem's runtime: {leaks.count} leaked allocation(s), "
               f"{format_size(leaks.bytes)}; report: {folder / page}", err=True)
    for growth in session.tracker.growth()[:5]:
        click.echo(f"npumem profile: probable leak, growing: {growth.describe()}", err=True)


def _echo_torch_memory(recorder, report, folder) -> bool:
    """The profile's summary of PyTorch's memory (`report`, the one written), and where to go
    next; False when the script made no tensor."""
    from ..profile.report import build_report
    from ..units import format_size

    torch_snapshot = recorder.snapshot() if recorder is not None else None
    if torch_snapshot is None:
        return False
    if report is None:
        report = build_report(torch_snapshot, "")
    for device in report.devices:
        reserved = (f", peak reserved {format_size(device.peak_reserved)}"
                    if recorder.device != "cpu" else "")
        kinds = ", ".join(f"{name} {format_size(n)}" for name, n in
                          list(device.peak_categories.items())[:4])
        click.echo(f"npumem profile: PyTorch {recorder.device}:{device.device} peak allocated "
                   f"{format_size(device.peak_allocated)}{reserved}"
                   + (f" ({kinds})" if kinds else ""), err=True)
    # the report's own leak analysis (leak_analysis), as `npumem report` prints it
    analysis = report.leak_analysis
    for leak in report.step_leaks[:3]:
        click.echo(f"npumem profile: leak: {leak.describe()}", err=True)
    if analysis is not None and not report.step_leaks:
        verdicts = "; ".join(analysis.verdict(device) for device in sorted(analysis.steps))
        if analysis.any_judged:
            click.echo(f"npumem profile: no leak: nothing grew step over step ({verdicts})",
                       err=True)
        else:
            click.echo(f"npumem profile: {verdicts}; {format_size(report.leaked_bytes)} was "
                       "still live at the end (summary.txt lists it by line)", err=True)
    pickle_path = folder / "torch_snapshot.pickle"
    replay = (f"npumem replay {pickle_path} --allocator torch" if recorder.device == "cpu" else
              f"npumem replay --check {pickle_path}")
    click.echo(f"npumem profile: report: {folder / 'report.html'}; {replay}; "
               f"npumem tune {pickle_path}", err=True)
    return True
