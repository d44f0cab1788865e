"""`npumem tune`: replay every candidate setting on a recording and recommend one: PyTorch's
for a snapshot (or any trace, with --memory), npumem's pool's otherwise."""

from __future__ import annotations

import sys

import click

from .errors import CommandError

from ..cli_sizes import device_memory
from .common import npu_chip_options, npu_pad, profile_input, run_replays, scheduler_options


@click.command()
@click.argument("trace", type=click.Path())
@click.option("--allocator", default=None, help="torch (PyTorch's settings; the default for "
              "PyTorch snapshots), torch_npu, or pool (npumem's pool settings; the default for "
              "other traces).")
@click.option("--memory", default=None, help="Replay on a device of this size (16GiB, or bytes: 11198791680) and "
              "list the settings that finish: which settings would have avoided an OOM.")
@click.option("--json", "as_json", is_flag=True, help="Print the recommendation as JSON.")
@click.option("--steps", "steps", default=3, show_default=True, type=click.IntRange(0, 100),
              help="For a recording that ends in an out-of-memory: periods of what it repeats "
                   "to play on past the failed request, to judge each setting on the rest of "
                   "the run (0: judge on the recorded part only).")
@npu_chip_options
@scheduler_options
def tune(trace, allocator, memory, as_json, steps, scheduler, workers, soc, cann):
    """Recommend allocator settings for a recorded trace: replays every candidate and picks the
    one with the lowest peak reserved memory.

    For a PyTorch snapshot it sweeps PyTorch's own settings through the model of its allocator
    and prints the PYTORCH_CUDA_ALLOC_CONF (or PYTORCH_NPU_ALLOC_CONF) line to set. TRACE may
    be an `npumem profile` folder (its torch_snapshot.pickle, else snapshot.pickle).
    """
    from ..trace import TraceFormatError
    from ..trace.formats import holds_snapshot

    trace = profile_input(trace)
    if allocator not in (None, "torch", "torch_npu", "pool"):
        raise click.BadParameter("choose torch, torch_npu or pool", param_hint="--allocator")
    try:
        snapshot = holds_snapshot(trace)
    except TraceFormatError as exc:
        raise CommandError(str(exc)) from None
    capacity = device_memory(memory)
    pad = npu_pad(soc, cann, allocator != "pool")
    if allocator == "pool" and capacity is not None:
        raise click.BadParameter("--memory asks which of PyTorch's settings finish on a device "
                                 "that size; npumem's pool is tuned on 64 GiB. Drop --allocator "
                                 "pool, or --memory", param_hint="--memory")
    # --memory is the question of a run that died: PyTorch's settings answer it, for any trace
    if allocator in ("torch", "torch_npu") or (allocator is None and (snapshot or capacity)):
        if scheduler not in ("processes", "serial"):
            click.echo(f"note: --scheduler {scheduler} is for pool tunes; PyTorch's settings "
                       "are replayed in local processes", err=True)
        _tune_torch(trace, allocator, capacity, as_json, steps,
                    1 if scheduler == "serial" else workers, pad)
    else:
        _tune_pool(trace, as_json, scheduler, workers)


def _tune_torch(trace, allocator, memory, as_json, steps, workers, pad=None) -> None:
    """PyTorch's settings, judged on the model of its allocator; ends with the line to set."""
    import json

    from ..profile.oom import oom_lines
    from ..whatif.torch_replay import load_for_model
    from ..whatif.torch_tune import tune_recording
    from ..units import format_size

    recording = run_replays("tune", as_json, lambda update: load_for_model(
        trace, "npu" if allocator == "torch_npu" else None, pad))
    if pad is not None and recording.flavour != "npu":
        raise click.BadParameter(f"{trace} is a CUDA recording: add --allocator torch_npu to "
                                 "replay it on an Ascend chip", param_hint="--soc/--cann")
    result = run_replays("tune", as_json, lambda update: tune_recording(
        recording, memory, steps=steps, progress=update, workers=workers))
    # the leak analysis report and profile show: a run that grows says so first
    from ..profile.leak_analysis import analyze_recording

    leaks = analyze_recording(recording)
    if as_json:
        click.echo(json.dumps({**result.as_dict(), **leaks.to_json()}, indent=2))
        return
    if leaks.leaks:
        died = result.died_at is not None
        click.echo(leaks.headline() + ("; no setting fits a leak" if died else
                                       "; if it keeps growing, no memory is enough in the end"))
    for line in oom_lines(recording, result.recorded.result):
        click.echo(line)
    for note in recording.read_notes:                  # how the trace was read
        click.echo(f"note: {note}")
    _echo_table(result)
    click.echo("")
    if result.best is not None:
        ran = {"cuda": "the CUDA run", "npu": "the NPU run"}.get(recording.recorded_flavour,
                                                                 "the recording")
        really = "really reserved"
        if recording.predicted:
            ran, really = "npumem estimate's predicted run", "reserved"
        real = (f"{ran} {really} {format_size(result.recorded_peak_reserved_bytes)}"
                if result.recorded_peak_reserved_bytes is not None else
                "the recording has no caching-allocator segments to compare with (a CPU or "
                "plain alloc/free trace)")
        click.echo(f"predicted peak reserved under the answer: "
                   f"{format_size(result.best.decisive.peak_reserved_bytes)}; {real}")
    for line in result.answer_lines()[:-1]:
        click.echo(f"  {line}")
    click.echo(result.answer())         # the recommendation, once, last


def _echo_table(result) -> None:
    """One row per setting. A run that finished under every setting, on no --memory, has no
    verdict to give (on a CPU profile, "fits" would mean nothing): its rows say what each
    setting saves against the one the run used. Otherwise each row's headroom and verdict."""
    from ..units import format_size

    def label(c) -> str:
        text = c.config.describe()
        if c.as_recorded:
            return f"{text} (as recorded)" if text else "(as recorded)"
        return text or "(PyTorch's default settings)"

    rows = result.in_order()
    if result.memory is None and all(c.finishes for c in rows):
        recorded = result.recorded.decisive.peak_reserved_bytes
        click.echo(f"{'settings':<52} {'peak reserved':>13} {'saving vs recorded':>19}")
        for c in rows:
            peak = c.decisive.peak_reserved_bytes
            saving = ("-" if c.as_recorded else format_size(recorded - peak)
                      if peak <= recorded else f"{format_size(peak - recorded)} more")
            click.echo(f"{label(c):<52} {format_size(peak):>13} {saving:>19}")
        return
    click.echo(f"{'settings':<52} {'peak reserved':>13} {'headroom':>10}  verdict")
    over = False
    for c in rows:
        headroom = format_size(c.headroom) if c.headroom is not None else "-"
        over |= c.headroom is not None and c.headroom < 0
        click.echo(f"{label(c):<52} "
                   f"{format_size(c.decisive.peak_reserved_bytes):>13} {headroom:>10}  {c.verdict()}")
    markers = {c.marker for c in result.candidates}
    click.echo("(" + "; ".join(text for marker, text in (
        ("recorded", "[recorded]: the recorded trace shows the verdict"),
        ("extended", "[extended]: the run played on past its end shows it")) if marker in markers)
        + ")")
    if over:            # (a fit above the limit: see torch_tune._spare)
        click.echo("(a negative headroom is a fit under a memory fraction: the fraction counts "
                   "the bytes asked for, while expandable segments map whole pages)")


def _tune_pool(trace, as_json, scheduler, workers) -> None:
    """npumem's pool settings, each candidate replayed where --scheduler says."""
    import json

    from ..whatif.tune import tune as run_tune
    from ..units import format_size

    result = run_replays("tune", as_json, lambda update: run_tune(
        trace, scheduler=scheduler, workers=workers, progress=update))
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
        sys.exit(2 if result.settings is None else 0)
    shared = [set(candidate.notes) for candidate in result.candidates]
    for note in result.candidates[0].notes if result.candidates else []:
        if all(note in notes for notes in shared):     # the trace's own (how it was read)
            click.echo(f"note: {note}")
    click.echo(f"{'settings':<62} {'peak reserved':>13} {'ratio':>6} {'dev allocs':>10}")
    for candidate in sorted(result.candidates, key=lambda r: (r.oom is not None,
                                                              r.peak_reserved_bytes)):
        if candidate.oom is not None:
            click.echo(f"{candidate.settings:<62} {'out of memory at event':>24} "
                       f"{candidate.oom['index']:,}")
            continue
        click.echo(f"{candidate.settings:<62} {format_size(candidate.peak_reserved_bytes):>13} "
                   f"{candidate.reserved_over_allocated:>6.3f} {candidate.device_allocs:>10}")
    if result.settings is None:
        raise CommandError(result.reason)
    click.echo(f"\npredicted peak reserved under the answer: "
               f"{format_size(result.predicted_peak_reserved_bytes)}")
    click.echo(f"  why: {result.reason}")
    # the recommendation, once, last (as for PyTorch's settings)
    click.echo(f"answer: export NPUMEM_ALLOC_CONF=\"{result.settings}\"" if result.settings else
               "answer: leave NPUMEM_ALLOC_CONF unset (the defaults)")
