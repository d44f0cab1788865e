"""`npumem replay`: allocation traces through allocators, side by side (a table, JSON or an
SVG chart), or with --check the torch model against what PyTorch's allocator recorded."""

from __future__ import annotations

import os
import sys
from dataclasses import replace

import click

from .errors import CommandError

from ..cli_sizes import device_memory
from ..device.address_space import DEVICE_SPAN, MAX_DEVICE_MEMORY
from ..units import format_size
from .common import (echo_recorded_ooms, npu_chip_options, npu_pad, profile_input, run_replays,
                     scheduler_options)
from .replay_settings import (check_check_options, check_planner_lag, check_steps, settings_for,
                              torch_environment)


@click.command()
@click.argument("traces", nargs=-1, required=True, type=click.Path())
@click.option("--allocator", "allocators", default=None,
              help="Comma-separated: pool (npumem), torch (PyTorch's caching allocator, CUDA or "
                   "the recording's own flavour), torch_npu (torch_npu's), device (no cache). "
                   "Default: torch for a PyTorch memory snapshot, else pool,torch,device.")
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
              help="An allocator setting, repeatable; each allocator takes the keys it has: "
                   "NPUMEM_ALLOC_CONF keys for pool (on top of $NPUMEM_ALLOC_CONF, if set), "
                   "PYTORCH_CUDA_ALLOC_CONF / PYTORCH_NPU_ALLOC_CONF keys for torch (on top of "
                   "what a snapshot recorded, or of $PYTORCH_CUDA_ALLOC_CONF / "
                   "$PYTORCH_ALLOC_CONF for other traces, read in PyTorch's order).")
@click.option("--sweep", "sweeps", multiple=True, metavar="KEY=V1,V2",
              help="Replay once per value (repeatable: every combination).")
@click.option("--memory", default=None, help="Device memory, e.g. 16GiB, or bytes (11198791680). Default: 64GiB for "
              "pool and device; for torch, what the recording shows the device had where it "
              "ran out (its OOM entry says how much it had), else no limit.")
@click.option("--check", is_flag=True, help="Compare the torch model's segment events and peak "
              "reserved with the recording's; print the first divergence; exit 1 on a mismatch.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Write an SVG bar chart of peak reserved per trace and setting (FILE.svg).")
@click.option("--planner-lag", default=0, show_default=True, type=int, metavar="REQUESTS",
              help="With predictive:True, hand each plan over this many requests after it "
                   "was asked for, as the program's planner thread would (a replay plans in "
                   "line: 0 is the soonest it could).")
@click.option("--steps", "steps", default=None, metavar="ANNOTATION",
              help="With predictive:True, mark a step where each annotation with this name "
                   "(or NAME#...) begins, in a memory snapshot or a profiler Chrome trace, as "
                   "npumem.memory.step() does: ProfilerStep for torch.profiler's steps, or a "
                   "torch.profiler.record_function name. Without it, a snapshot's "
                   "npumem.memory.step() marks are used.")
@npu_chip_options
@scheduler_options
def replay(traces, allocators, settings, sweeps, memory, check, as_json, plot_path, planner_lag,
           steps, scheduler, workers, soc, cann):
    """Replay allocation traces through allocators and compare what they reserve.

        npumem replay snapshot.pickle --allocator torch --set expandable_segments=True
        npumem replay --check snapshot.pickle

    Reads PyTorch snapshot pickles (replayed from the state at their first entry), npumem
    JSONL, PyTorch Chrome traces, RMM CSV logs and msprof operator_memory.csv (gzip or not),
    and `npumem profile` folders (their torch_snapshot.pickle, else snapshot.pickle).
    Several traces or settings replay in parallel.
    """
    import json

    from ..trace.formats import holds_snapshot
    from ..whatif.replay import ALLOCATORS
    from ..whatif.sweep import ReplayJob, run_jobs

    traces = tuple(profile_input(path) for path in traces)
    names = [name.strip() for name in (allocators or "pool,torch,device").split(",") if name.strip()]
    unknown = [name for name in names if name not in ALLOCATORS]
    if unknown or not names:
        raise click.BadParameter(f"unknown allocator(s) {unknown}; choose from {', '.join(ALLOCATORS)}",
                                 param_hint="--allocator")
    capacity = device_memory(memory)
    simulated = [name for name in names if name in ("pool", "device")]
    if capacity is not None and simulated and capacity > MAX_DEVICE_MEMORY:
        raise click.BadParameter(
            f"{format_size(capacity)} is more than the {' and '.join(simulated)} allocator(s) "
            f"replay on: at most {format_size(MAX_DEVICE_MEMORY)} (the simulated device has "
            f"{format_size(DEVICE_SPAN)} of addresses, and each stream's range takes as much as "
            f"the memory); the torch model alone takes any size",
            param_hint="--memory")
    pad = npu_pad(soc, cann, any(name in ("torch", "torch_npu") for name in names))
    _check_paths(traces, plot_path)
    if check:
        context = click.get_current_context()
        serial = (scheduler == "serial" or context.get_parameter_source("scheduler")
                  is click.core.ParameterSource.DEFAULT)        # it runs serially: honoured
        check_check_options(allocators, sweeps, plot_path, planner_lag, steps, not serial,
                            workers)
        _replay_check(traces, names, settings, capacity, as_json, pad)
        return
    snapshots = {path for path in traces if holds_snapshot(path)}
    # a snapshot is PyTorch's own recording: its question is what PyTorch's allocator would do
    per_trace = {path: ["torch"] if path in snapshots and not allocators else names
                 for path in traces}
    used = list(dict.fromkeys(name for path in traces for name in per_trace[path]))
    notes = [(path, "torch", "a PyTorch memory snapshot replays through the torch model only; "
              "--allocator torch,pool,device adds npumem's pool and the device")
             for path in traces if per_trace[path] != names]
    tunable = [name for name in used if name != "device"]
    if sweeps and not tunable:
        raise click.BadParameter("--sweep varies allocator settings; add pool or torch to --allocator",
                                 param_hint="--sweep")
    combos, ignored = settings_for(tunable, settings, sweeps)
    notes += ignored
    check_planner_lag(planner_lag, combos.get("pool", []))
    check_steps(steps, traces, combos.get("pool", []))
    environment, env_notes = torch_environment(used, traces, snapshots, combos)
    notes += env_notes
    jobs = []
    for path in traces:
        for name in per_trace[path]:
            for chosen in combos.get(name, [""]):
                jobs.append(ReplayJob(
                    path, name, ",".join(filter(None, [environment.get((path, name)), chosen])),
                    capacity, planner_lag, steps, pad if name in ("torch", "torch_npu") else None))
    jobs = _one_says_the_oom(jobs)
    results = run_replays("replay", as_json, lambda update: run_jobs(jobs, scheduler, workers, update))
    if plot_path:
        from ..output_files import written_whole
        from ..whatif.plot import sweep_svg
        with written_whole(plot_path) as partial, open(partial, "w", encoding="utf-8",
                                                            errors="replace") as out:
            out.write(sweep_svg(results))
    if as_json:
        for r in results:              # each row carries the notes that concern it
            r.notes[:0] = [text for trace, name, text in notes
                           if trace in (None, r.trace) and name in (None, r.allocator)]
        click.echo(json.dumps([r.as_dict() for r in results], indent=2))
        return
    _print_replay_table(results, memory_given=capacity is not None)
    for text in dict.fromkeys(text for _, _, text in notes):
        click.echo(f"note: {text}")
    echo_recorded_ooms(traces, results=results)
    if plot_path:
        click.echo(f"wrote {plot_path}")


def _check_paths(traces, plot_path) -> None:
    """Bad inputs and an unwritable output fail before any replay runs."""
    from ..output_files import OutputPathError, check_output
    from ..trace import TraceFormatError, detect_format

    for path in traces:
        try:
            detect_format(path)
        except TraceFormatError as exc:
            raise CommandError(str(exc)) from None
    if plot_path:
        if not plot_path.lower().endswith(".svg"):
            raise click.BadParameter(f"{plot_path}: the chart is SVG (vector, opens in any "
                                     "browser); name the file .svg", param_hint="--plot")
        try:
            check_output(plot_path)
        except OutputPathError as exc:
            raise click.BadParameter(str(exc), param_hint="--plot") from None


def _one_says_the_oom(jobs: list) -> list:
    """The jobs, one of each trace saying the recording's own OOM: a torch job with no settings
    of its own if there is one (the OOM is told with the replay under PyTorch's defaults, so
    that one is not made twice), else the trace's first job."""
    speakers = set()
    for path in dict.fromkeys(job.trace for job in jobs):
        mine = [job for job in jobs if job.trace == path]
        speakers.add(id(next((job for job in mine if job.allocator == "torch" and not job.settings),
                             mine[0])))
    return [replace(job, says_oom=True) if id(job) in speakers else job for job in jobs]


def _print_replay_table(results, memory_given: bool = False) -> None:
    """One row per replay, then what the rows cannot hold: the start state, what the real
    allocator did, out-of-memories and notes (each once)."""

    def name(trace: str) -> str:       # the file's own name, cut at the end if it must be
        base = os.path.basename(trace) or trace
        return base if len(base) <= 28 else base[:27] + "…"

    click.echo(f"{'trace':<28} {'allocator':<9} {'events':>10} {'peak live':>11} {'peak reserved':>13} "
               f"{'ratio':>6} {'dev allocs':>10} {'hit rate':>8} {'alloc us':>8}  settings")
    for r in results:
        click.echo(f"{name(r.trace):<28} {r.allocator:<9} {r.events:>10,} "
                   f"{format_size(r.peak_allocated_bytes):>11} {format_size(r.peak_reserved_bytes):>13} "
                   f"{r.reserved_over_allocated:>6.3f} {r.device_allocs:>10} {r.cache_hit_rate:>8.1%} "
                   f"{f'{r.mean_alloc_us:.2f}' if r.mean_alloc_us else '-':>8}  {r.settings}")
    counted: dict[str, dict[bool, int]] = {}     # trace -> torch model's or not -> events
    for r in results:
        counted.setdefault(r.trace, {})[r.allocator.startswith("torch")] = r.events
    for trace, events in counted.items():
        if len(set(events.values())) > 1:
            click.echo(f"{trace}: events: the torch model counts every trace entry "
                       f"({events[True]:,}); the pool and the device replay its allocs and "
                       f"frees ({events[False]:,}, with the blocks live when it began)")
    said = set()                      # once per trace
    for r in results:
        if r.start_reserved_bytes and r.trace not in said:
            said.add(r.trace)
            click.echo(f"{r.trace}: {format_size(r.start_reserved_bytes)} was reserved before the "
                       f"trace began (counted in peak reserved)")
    shown = set()
    if not memory_given and any(r.oom and not r.allocator.startswith("torch") for r in results):
        click.echo("(--memory sets the device the pool and device allocators replay on: 64 GiB "
                   "when left out)")
    for r in results:
        if r.recorded_peak_reserved_bytes is not None and r.allocator.startswith("torch") and \
                r.settings == "defaults":
            click.echo(f"{r.trace}: the real allocator reserved {format_size(r.recorded_peak_reserved_bytes)} "
                       f"at peak in {r.recorded_device_allocs} segment allocation(s)")
        if r.oom:
            where = (f"at entry {r.oom['index']:,}" if r.oom["index"] >= 0 else
                     "before the trace's first entry, with the blocks live when it began")
            click.echo(f"{r.trace} [{' '.join(filter(None, (r.allocator, r.settings)))}]: "
                       f"out of memory {where}: {r.oom['message']}")
        for note in r.notes:
            line = f"{r.trace} [{r.allocator}]: {note}"
            if line not in shown:            # sweep rows share most of their notes
                shown.add(line)
                click.echo(line)


def _replay_check(traces, names, settings, memory, as_json, pad=None) -> None:
    """npumem replay --check: the torch model against what the real allocator recorded."""
    import json

    from ..errors import InvalidParamError
    from ..trace import TraceFormatError, detect_format
    from ..trace.formats import DESCRIPTIONS, holds_snapshot
    from ..whatif.sweep import replay_torch

    for path in traces:
        if not holds_snapshot(path):
            raise click.UsageError(f"--check compares with what PyTorch's allocator recorded, so it "
                                   f"needs a memory snapshot; {path} is "
                                   f"{DESCRIPTIONS[detect_format(path)]}")
    allocator = "torch_npu" if "torch_npu" in names else "torch"
    text = ",".join(item.replace("=", ":", 1) for item in settings)
    failed = False
    reports = []
    for path in traces:
        try:
            result = replay_torch(path, allocator, text, memory, check=True, pad=pad)
        except TraceFormatError as exc:
            raise CommandError(str(exc)) from None
        except InvalidParamError as exc:
            raise click.BadParameter(exc.message, param_hint="--set") from None
        if result.recorded_device_allocs is None:
            raise CommandError(f"{path} records allocations and frees but no caching-allocator "
                               "segments (a CPU recording, say), so there is nothing to check "
                               f"the model against; `npumem replay {path} --allocator torch` "
                               "shows what PyTorch's caching allocator would reserve for it")
        reports.append(result.as_dict())
        failed |= not result.faithful
        if as_json:
            continue
        verdict = "MATCH" if result.faithful else "MISMATCH"
        click.echo(f"{path}: {verdict} ({result.flavour} allocator, "
                   f"{result.settings or 'default settings'}, {result.events} entries, "
                   f"{result.seconds:.2f} s)")
        # a divergence stops the model there: its figures are of the entries before
        upto = (f" (up to entry {result.divergence.index}, where it diverged)"
                if result.divergence is not None else "")
        click.echo(f"  segment allocations: model {result.device_allocs}{upto}, recorded "
                   f"{result.recorded_device_allocs}; segment frees: model {result.device_frees}, "
                   f"recorded {result.recorded_device_frees}")
        click.echo(f"  peak reserved: model {format_size(result.peak_reserved_bytes)} "
                   f"({result.peak_reserved_bytes} bytes){upto}, recorded "
                   f"{format_size(result.recorded_peak_reserved_bytes or 0)} "
                   f"({result.recorded_peak_reserved_bytes} bytes); "
                   f"{format_size(result.start_reserved_bytes)} reserved at the first entry")
        why = ""
        if result.misplaced_blocks and "expandable_segments:True" in result.settings:
            why = (" (expandable segments: the model reserves each stream's range at an address "
                   "of its own, so blocks in ranges made during the trace sit at other addresses; "
                   "the check compares the segments' sizes and order)")
        click.echo(f"  blocks placed at another address than recorded: "
                   f"{result.misplaced_blocks:,}{why}")
        if result.divergence is not None:
            click.echo("  first divergence at " + result.divergence.describe())
        if result.oom is not None:
            click.echo(f"  the model ran out of memory at entry {result.oom['index']}: "
                       f"{result.oom['message']}")
        for note in result.notes:
            click.echo(f"  note: {note}")
        if settings and not result.faithful:
            click.echo("  note: --set departs from the recording's settings, so the model is "
                       "expected to decide otherwise than the recording; `npumem replay` "
                       "without --check plays the whole run under them")
    if as_json:
        click.echo(json.dumps(reports, indent=2))
    sys.exit(1 if failed else 0)
