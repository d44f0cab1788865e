"""The `npumem` command line: thin verbs that parse, call the library and print."""

from __future__ import annotations

import contextlib
import os
import sys

import click

from . import __version__
from .cli_sizes import device_memory as _device_memory, size_option as _size_option


class _Commands(click.Group):
    """Every command: an npumem error no command handled (a bad NPUMEM_* setting, say) and
    running out of host memory end in one line, never a traceback."""

    def invoke(self, ctx):
        from .environment_check import problems
        from .errors import AclError

        for problem in problems():
            click.echo(f"error: {problem}", err=True)
        if problems():
            sys.exit(2)
        try:
            return super().invoke(ctx)
        except AclError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        except MemoryError:
            click.echo("error: out of host memory (RAM); try a smaller input or --size", err=True)
            sys.exit(2)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="npumem")
def main() -> None:
    """npumem: accelerator device memory, on a simulated NPU or real hardware."""


@main.command()
@click.option("--device", default=None, help="Device backend: sim, torch:cpu, torch:cuda, torch:npu "
              "or torch (the best PyTorch device). Default: $NPUMEM_DEVICE, else sim.")
@click.option("--size", default="1M", show_default=True,
              help="float32 elements per vector (1M, 64K, 1000), or the bytes of each vector "
                   "(4MiB); the matrices are sqrt(size) square.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write the memory snapshot (snapshot.pickle) into this folder.")
def demo(device: str | None, size: str, out_dir: str | None) -> None:
    """Run the single-operator flow end to end (pool, H2D, two-phase Add and MatMul, D2H) and
    verify the result."""
    from .demo import run_demo
    from .device.select import default_spec
    from .errors import FeatureNotSupportedError, InvalidParamError

    elements = _size_option(size, "--size")
    if size.strip().lower().endswith("b"):          # bytes: 4 per float32 element
        elements //= 4
    if elements <= 0:
        raise click.BadParameter("must be at least one element (4 bytes)", param_hint="--size")
    try:
        passed = run_demo(elements, device=device or default_spec(), echo=click.echo,
                          out_dir=out_dir)
    except (InvalidParamError, FeatureNotSupportedError) as exc:
        raise click.UsageError(str(exc)) from None
    sys.exit(0 if passed else 1)


@main.command()
def info() -> None:
    """Show the devices and their memory."""
    from . import runtime as rt
    from .constants import MemAttr
    from .units import format_size

    rt.init()
    try:
        backend = rt.RUNTIME.backend
        click.echo(f"backend: {backend.name}, {backend.device_count} device(s)")
        for device in range(backend.device_count):
            for attr in MemAttr:
                free, total = backend.mem_info(device, attr)
                if total:
                    click.echo(f"  device {device} {attr.name:<15} {format_size(free):>12} free "
                               f"of {format_size(total)}")
    finally:
        rt.finalize()


def _scheduler_options(command):
    command = click.option("--scheduler", default="processes", show_default=True,
                           help="Where replays run: processes (local, one per core), serial, "
                                "dask (a local Dask cluster) or tcp://host:port (a Dask "
                                "scheduler).")(command)
    return click.option("--workers", type=click.IntRange(min=1), default=None,
                        help="Worker processes (default: one per core).")(command)


def _npu_chip_options(command):
    command = click.option("--cann", default=None, metavar="VERSION",
                           help="With --soc: the CANN version the run uses (e.g. 9.1.0). "
                                "Default: 8.5.0.")(command)
    return click.option("--soc", default=None, metavar="NAME",
                        help="The Ascend chip to replay torch_npu's allocator for (e.g. "
                             "Ascend910B3, Ascend950PR): torch_npu pads every request by 32 "
                             "bytes, except on an Ascend950 with CANN 9.1.0 or newer. "
                             "Default: Ascend910B3.")(command)


def _npu_pad(soc: str | None, cann: str | None, torch_npu: bool) -> int | None:
    """The request padding of --soc/--cann (None: the flavour's default)."""
    from .alloc.torch_model.config import npu_pad
    from .errors import InvalidParamError

    if soc is None and cann is None:
        return None
    if not torch_npu:
        raise click.BadParameter("the chip matters to torch_npu's allocator only; add "
                                 "--allocator torch_npu", param_hint="--soc/--cann")
    try:
        return npu_pad(soc or "Ascend910B3", cann or "8.5.0")
    except InvalidParamError as exc:
        raise click.BadParameter(exc.message, param_hint="--soc/--cann") from None


def _run_replays(label: str, quiet: bool, work):
    """Call `work(progress)` with a progress bar of finished replays; bad traces exit 2 with
    their file and position, bad options exit as usage errors."""
    from .alloc.caching_allocator import OutOfMemoryError
    from .errors import InvalidParamError
    from .progress import ProgressBar
    from .trace import TraceFormatError
    from .units import format_size

    bar = ProgressBar(None, label, "replays", enabled=not quiet)

    def update(done: int, total: int, events: int = 0) -> None:
        bar.total = total
        bar.unit = f"replays ({events:,} events into the current one)" if events else "replays"
        bar.update(done, force=not events)

    try:
        return work(update)
    except TraceFormatError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except InvalidParamError as exc:              # its sentence, without the ACL code
        raise click.UsageError(exc.message) from None
    except OutOfMemoryError as exc:
        click.echo(f"error: the trace needs more device memory than the {format_size(exc.capacity)} "
                   f"it was given (it asked for {format_size(exc.requested)} when the rest was "
                   "taken); raise --memory, or leave it out (64 GiB)", err=True)
        sys.exit(2)
    except (ValueError, RuntimeError, OSError) as exc:
        raise click.UsageError(str(exc)) from None
    finally:
        bar.close()


@main.command()
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
@click.option("--memory", default=None, help="Device memory, e.g. 16GiB. Default: 64GiB for "
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
@_npu_chip_options
@_scheduler_options
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

    from .trace.formats import holds_snapshot
    from .whatif.replay import ALLOCATORS
    from .whatif.sweep import ReplayJob, run_jobs

    traces = tuple(_profile_input(path) for path in traces)
    names = [name.strip() for name in (allocators or "pool,torch,device").split(",") if name.strip()]
    unknown = [name for name in names if name not in ALLOCATORS]
    if unknown or not names:
        raise click.BadParameter(f"unknown allocator(s) {unknown}; choose from {', '.join(ALLOCATORS)}",
                                 param_hint="--allocator")
    device_memory = _device_memory(memory)
    pad = _npu_pad(soc, cann, any(name in ("torch", "torch_npu") for name in names))
    _check_paths(traces, plot_path)
    if check:
        _replay_check(traces, names, settings, device_memory, as_json, pad)
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
    combos, ignored = _settings_for(tunable, settings, sweeps)
    notes += ignored
    _check_planner_lag(planner_lag, combos.get("pool", []))
    _check_steps(steps, traces, combos.get("pool", []))
    environment, env_notes = _torch_environment(used, traces, snapshots, combos)
    notes += env_notes
    jobs = [ReplayJob(path, name, ",".join(filter(None, [environment.get((path, name)), chosen])),
                      device_memory, planner_lag, steps,
                      pad if name in ("torch", "torch_npu") else None)
            for path in traces for name in per_trace[path]
            for chosen in combos.get(name, [""])]
    results = _run_replays("replay", as_json, lambda update: run_jobs(jobs, scheduler, workers, update))
    if plot_path:
        from .output_files import written_whole
        from .whatif.plot import sweep_svg
        with written_whole(plot_path) as partial, open(partial, "w", encoding="utf-8") as out:
            out.write(sweep_svg(results))
    if as_json:
        for r in results:              # each row carries the notes that concern it
            r.notes[:0] = [text for trace, name, text in notes
                           if trace in (None, r.trace) and name in (None, r.allocator)]
        click.echo(json.dumps([r.as_dict() for r in results], indent=2))
        return
    _print_replay_table(results)
    for text in dict.fromkeys(text for _, _, text in notes):
        click.echo(f"note: {text}")
    _echo_recorded_ooms(traces)
    if plot_path:
        click.echo(f"wrote {plot_path}")


def _needs_prediction(option: str, what: str, pool_settings: list[str]) -> None:
    """`option` only means something to a pool with predictive:True (`what` it does there)."""
    from .alloc.settings import parse_settings

    if not any(parse_settings(chosen).predictive for chosen in pool_settings):
        raise click.BadParameter(f"only a pool with predictive:True {what}; add --allocator "
                                 "pool --set predictive=True", param_hint=option)


def _check_steps(name: str | None, traces, pool_settings: list[str]) -> None:
    """--steps names annotations, which snapshots and Chrome traces carry, for the predictive
    pool."""
    from .trace.formats import carries_annotations, detect_format

    if name is None:
        return
    if not name.strip():
        raise click.BadParameter("an annotation name, e.g. ProfilerStep", param_hint="--steps")
    _needs_prediction("--steps", "follows marked steps", pool_settings)
    for path in traces:
        if not carries_annotations(path):
            raise click.BadParameter(f"{path} is a {detect_format(path)} trace; only memory "
                                     "snapshots (.pickle, or JSONL written from one) and "
                                     "profiler Chrome traces carry annotations",
                                     param_hint="--steps")


def _check_planner_lag(lag: int, pool_settings: list[str]) -> None:
    """--planner-lag is a count of requests, and only the predictive pool has plans to hand over."""
    if lag < 0:
        raise click.BadParameter(f"{lag}: a number of requests, 0 or more",
                                 param_hint="--planner-lag")
    if lag:
        _needs_prediction("--planner-lag", "has plans to hand over", pool_settings)


def _check_paths(traces, plot_path) -> None:
    """Bad inputs and an unwritable output fail before any replay runs."""
    from .output_files import OutputPathError, check_output
    from .trace import TraceFormatError, detect_format

    for path in traces:
        try:
            detect_format(path)
        except TraceFormatError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
    if plot_path:
        if not plot_path.lower().endswith(".svg"):
            raise click.BadParameter(f"{plot_path}: the chart is SVG (vector, opens in any "
                                     "browser); name the file .svg", param_hint="--plot")
        try:
            check_output(plot_path)
        except OutputPathError as exc:
            raise click.BadParameter(str(exc), param_hint="--plot") from None


def _settings_for(names, settings, sweeps) -> tuple[dict[str, list[str]], list[tuple]]:
    """The settings strings to replay each of `names` with: the --set items and --sweep axes
    whose keys it has, every combination checked before any replay runs; and notes
    (trace, allocator, text) naming the keys an allocator went without. A key no allocator
    has, or a value one refuses, is an error that says which keys there are or what is wrong."""
    from .alloc.settings import parse_settings
    from .alloc.torch_model.config import parse_config
    from .errors import InvalidParamError
    from .whatif.sweep import split_for, sweep_settings

    hint = "--sweep" if sweeps else "--set"
    try:
        texts, axes, ignored = split_for(names, settings, sweeps)
    except InvalidParamError as exc:
        raise click.BadParameter(exc.message, param_hint=hint) from None
    combos = {}
    for name in names:
        base = texts[name]
        if name == "pool":
            # the program's own settings, as it would run with them; --set goes on top
            program = os.environ.get("NPUMEM_ALLOC_CONF", "").strip()
            try:
                parse_settings(program)
            except InvalidParamError as exc:
                raise click.UsageError(f"the environment's NPUMEM_ALLOC_CONF={program!r}, which "
                                       f"the pool replays with: {exc.message}") from None
            base = ",".join(filter(None, [program, base]))
            validate, label = parse_settings, "pool (NPUMEM_ALLOC_CONF)"
        else:
            flavour = "npu" if name == "torch_npu" else "cuda"
            validate, label = (lambda text, flavour=flavour: parse_config(text, flavour)), name
        try:
            combos[name] = sweep_settings(base, axes[name], validate)
        except InvalidParamError as exc:
            raise click.BadParameter(f"{label}: {exc.message}", param_hint=hint) from None
    return combos, [(None, name, text) for name, text in ignored]


def _torch_environment(names, traces, snapshots, combos) -> tuple[dict, list[tuple]]:
    """PyTorch's settings from the environment ({(trace, allocator): text}), which the torch
    model replays traces other than snapshots with, as the program ran (a snapshot records its
    own), read in PyTorch's order of variables and checked with each combination; and notes."""
    from importlib.metadata import PackageNotFoundError, version

    from .alloc.torch_model.config import env_names, parse_config, read_env
    from .errors import InvalidParamError

    try:
        installed = version("torch")        # which variable wins depends on the version
    except PackageNotFoundError:
        installed = None
    environment, notes = {}, []
    for name in [name for name in names if name in ("torch", "torch_npu")]:
        flavour = "npu" if name == "torch_npu" else "cuda"
        variable = next((v for v in env_names(flavour, installed) if v in os.environ), "")
        if not variable:
            continue
        notes += [(path, name, f"{variable} from the environment is not applied to {path}: a "
                   "snapshot replays with the settings it recorded (--set tries others)")
                  for path in traces if path in snapshots]
        others = [path for path in traces if path not in snapshots]
        if not others:
            continue
        try:
            variable, text, shadowed = read_env(flavour, torch_version=installed)
            for combo in combos.get(name, [""]):
                parse_config(",".join(filter(None, [text, combo])), flavour,
                             source=f"{variable}={text!r} with --set/--sweep")
        except InvalidParamError as exc:
            raise click.UsageError(f"{exc.message} (the torch model replays traces with the "
                                   "environment's settings, as PyTorch runs with them)") from None
        environment.update({(path, name): text for path in others})
        notes += [(path, name, f"{name} replays with {variable}={text!r} from the environment, "
                   "as the program ran; --set goes on top") for path in others]
        notes += [(None, name, text) for text in shadowed]
    return environment, notes


def _print_replay_table(results) -> None:
    from .units import format_size

    click.echo(f"{'trace':<28} {'allocator':<9} {'events':>7} {'peak live':>11} {'peak reserved':>13} "
               f"{'ratio':>6} {'dev allocs':>10} {'hit rate':>8} {'alloc us':>8}  settings")
    for r in results:
        click.echo(f"{r.trace[-28:]:<28} {r.allocator:<9} {r.events:>7} "
                   f"{format_size(r.peak_allocated_bytes):>11} {format_size(r.peak_reserved_bytes):>13} "
                   f"{r.reserved_over_allocated:>6.3f} {r.device_allocs:>10} {r.cache_hit_rate:>8.1%} "
                   f"{f'{r.mean_alloc_us:.2f}' if r.mean_alloc_us else '-':>8}  {r.settings}")
    for r in results:
        if r.start_reserved_bytes:
            click.echo(f"{r.trace}: {format_size(r.start_reserved_bytes)} was reserved before the "
                       f"trace began (counted in peak reserved)")
            break
    shown = set()
    for r in results:
        if r.recorded_peak_reserved_bytes is not None and r.allocator.startswith("torch") and \
                r.settings == "defaults":
            click.echo(f"{r.trace}: the real allocator reserved {format_size(r.recorded_peak_reserved_bytes)} "
                       f"at peak in {r.recorded_device_allocs} segment allocation(s)")
        if r.oom:
            click.echo(f"{r.trace} [{r.allocator} {r.settings}]: out of memory at entry "
                       f"{r.oom['index']}: {r.oom['message']}")
        for note in r.notes:
            line = f"{r.trace} [{r.allocator}]: {note}"
            if line not in shown:            # sweep rows share most of their notes
                shown.add(line)
                click.echo(line)


def _replay_check(traces, names, settings, memory, as_json, pad=None) -> None:
    """npumem replay --check: the torch model against what the real allocator recorded."""
    import json

    from .errors import InvalidParamError
    from .trace import TraceFormatError, detect_format
    from .trace.formats import DESCRIPTIONS, holds_snapshot
    from .whatif.sweep import replay_torch
    from .units import format_size

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
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        except InvalidParamError as exc:
            raise click.BadParameter(exc.message, param_hint="--set") from None
        if result.recorded_device_allocs is None:
            click.echo(f"error: {path} records allocations and frees but no caching-allocator "
                       "segments (a CPU recording, say), so there is nothing to check the model "
                       f"against; `npumem replay {path} --allocator torch` shows what PyTorch's "
                       "caching allocator would reserve for it", err=True)
            sys.exit(2)
        reports.append(result.as_dict())
        failed |= not result.faithful
        if as_json:
            continue
        verdict = "MATCH" if result.faithful else "MISMATCH"
        click.echo(f"{path}: {verdict} ({result.flavour} allocator, "
                   f"{result.settings or 'default settings'}, {result.events} entries, "
                   f"{result.seconds:.2f} s)")
        click.echo(f"  segment allocations: model {result.device_allocs}, recorded "
                   f"{result.recorded_device_allocs}; segment frees: model {result.device_frees}, "
                   f"recorded {result.recorded_device_frees}")
        click.echo(f"  peak reserved: model {format_size(result.peak_reserved_bytes)} "
                   f"({result.peak_reserved_bytes} bytes), recorded "
                   f"{format_size(result.recorded_peak_reserved_bytes or 0)} "
                   f"({result.recorded_peak_reserved_bytes} bytes); "
                   f"{format_size(result.start_reserved_bytes)} reserved at the first entry")
        click.echo(f"  blocks placed at another address than recorded: {result.misplaced_blocks}")
        if result.divergence is not None:
            click.echo("  first divergence at " + result.divergence.describe())
        if result.oom is not None:
            click.echo(f"  the model ran out of memory at entry {result.oom['index']}: "
                       f"{result.oom['message']}")
        for note in result.notes:
            click.echo(f"  note: {note}")
    if as_json:
        click.echo(json.dumps(reports, indent=2))
    sys.exit(1 if failed else 0)


@main.command()
@click.argument("trace", type=click.Path())
@click.option("--allocator", default=None, help="torch (PyTorch's settings; the default for "
              "PyTorch snapshots), torch_npu, or pool (npumem's pool settings; the default for "
              "other traces).")
@click.option("--memory", default=None, help="Replay on a device of this size (e.g. 16GiB) and "
              "list the settings that finish: which settings would have avoided an OOM.")
@click.option("--json", "as_json", is_flag=True, help="Print the recommendation as JSON.")
@click.option("--steps", "steps", default=3, show_default=True, type=click.IntRange(0, 100),
              help="For a recording that ends in an out-of-memory: periods of what it repeats "
                   "to play on past the failed request, to judge each setting on the rest of "
                   "the run (0: judge on the recorded part only).")
@_npu_chip_options
@_scheduler_options
def tune(trace, allocator, memory, as_json, steps, scheduler, workers, soc, cann):
    """Recommend allocator settings for a recorded trace: replays every candidate and picks the
    one with the lowest peak reserved memory.

    For a PyTorch snapshot it sweeps PyTorch's own settings through the model of its allocator
    and prints the PYTORCH_CUDA_ALLOC_CONF (or PYTORCH_NPU_ALLOC_CONF) line to set. TRACE may
    be an `npumem profile` folder (its torch_snapshot.pickle, else snapshot.pickle).
    """
    from .trace import TraceFormatError
    from .trace.formats import holds_snapshot

    trace = _profile_input(trace)
    if allocator not in (None, "torch", "torch_npu", "pool"):
        raise click.BadParameter("choose torch, torch_npu or pool", param_hint="--allocator")
    try:
        snapshot = holds_snapshot(trace)
    except TraceFormatError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    device_memory = _device_memory(memory)
    pad = _npu_pad(soc, cann, allocator != "pool")
    if allocator == "pool" and device_memory is not None:
        raise click.BadParameter("--memory asks which of PyTorch's settings finish on a device "
                                 "that size; npumem's pool is tuned on 64 GiB. Drop --allocator "
                                 "pool, or --memory", param_hint="--memory")
    # --memory is the question of a run that died: PyTorch's settings answer it, for any trace
    if allocator in ("torch", "torch_npu") or (allocator is None and (snapshot or device_memory)):
        if scheduler not in ("processes", "serial"):
            click.echo(f"note: --scheduler {scheduler} is for pool tunes; PyTorch's settings "
                       "are replayed in local processes", err=True)
        _tune_torch(trace, allocator, device_memory, as_json, steps,
                    1 if scheduler == "serial" else workers, pad)
    else:
        _tune_pool(trace, as_json, scheduler, workers)


def _tune_torch(trace, allocator, memory, as_json, steps, workers, pad=None) -> None:
    import json

    from .profile.oom import oom_lines
    from .whatif.torch_replay import load_for_model
    from .whatif.torch_tune import tune_recording
    from .units import format_size

    recording = _run_replays("tune", as_json, lambda update: load_for_model(
        trace, "npu" if allocator == "torch_npu" else None, pad))
    if pad is not None and recording.flavour != "npu":
        raise click.BadParameter(f"{trace} is a CUDA recording: add --allocator torch_npu to "
                                 "replay it on an Ascend chip", param_hint="--soc/--cann")
    result = _run_replays("tune", as_json, lambda update: tune_recording(
        recording, memory, steps=steps, progress=update, workers=workers))
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
        return
    for line in oom_lines(recording, result.recorded.result):
        click.echo(line)
    click.echo(f"{'settings':<52} {'peak reserved':>13} {'headroom':>10}  verdict")
    for c in result.in_order():
        headroom = format_size(c.headroom) if c.headroom is not None else "-"
        click.echo(f"{c.config.describe() or '(as recorded)':<52} "
                   f"{format_size(c.decisive.peak_reserved_bytes):>13} {headroom:>10}  {c.verdict()}")
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
        click.echo(f"recommended: {result.best.line}: predicted peak reserved "
                   f"{format_size(result.best.decisive.peak_reserved_bytes)}; {real}")
    for line in result.answer_lines()[:-1]:
        click.echo(f"  {line}")
    if result.best is not None and result.best.config.describe():
        click.echo(f"use: export {result.best.variable}="
                   f"\"{result.best.config.describe()}\"")
    click.echo(result.answer())


def _tune_pool(trace, as_json, scheduler, workers) -> None:
    import json

    from .whatif.sweep import settings_label
    from .whatif.tune import tune as run_tune
    from .units import format_size

    result = _run_replays("tune", as_json, lambda update: run_tune(
        trace, scheduler=scheduler, workers=workers, progress=update))
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
        return
    click.echo(f"{'settings':<62} {'peak reserved':>13} {'ratio':>6} {'dev allocs':>10}")
    for candidate in sorted(result.candidates, key=lambda r: r.peak_reserved_bytes):
        click.echo(f"{candidate.settings:<62} {format_size(candidate.peak_reserved_bytes):>13} "
                   f"{candidate.reserved_over_allocated:>6.3f} {candidate.device_allocs:>10}")
    click.echo(f"\nrecommended: {settings_label(result.settings)} -> predicted peak reserved "
               f"{format_size(result.predicted_peak_reserved_bytes)}")
    click.echo(f"why: {result.reason}")
    if result.settings:
        click.echo(f"use: export NPUMEM_ALLOC_CONF={result.settings}")


@main.command()
@click.argument("source", type=click.Path(dir_okay=False))
@click.argument("target", type=click.Path(dir_okay=False))
@click.option("--to", "fmt", default=None, help="Output format (default: from TARGET's name): "
              "jsonl, chrome, snapshot, rmm, msprof.")
def convert(source, target, fmt):
    """Convert an allocation trace between formats (any readable format in; .jsonl, .json,
    .pickle, .csv (RMM) or operator_memory.csv out; add .gz to compress). A snapshot going to
    .pickle or .jsonl keeps everything; other formats keep each allocation and free."""
    from .output_files import OutputPathError, check_output, written_whole
    from .trace import FORMATS, TraceFormatError, detect_format
    from .trace.formats import convert as convert_file, format_for_output

    if fmt is not None and fmt not in FORMATS:
        raise click.BadParameter(f"choose from {', '.join(FORMATS)}", param_hint="--to")
    try:
        check_output(target, source)
        fmt = fmt or format_for_output(target)
        source_format = detect_format(source)
        notes: list[str] = []
        with written_whole(target) as partial:
            count = convert_file(source, partial, fmt, notes)
            if count == 0:
                _readable_or_refused(source, partial, fmt)
    except OutputPathError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except TraceFormatError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    except OSError as exc:
        click.echo(f"error: cannot write {target}: {exc.strerror}", err=True)
        sys.exit(2)
    click.echo(f"{source} ({source_format}) -> {target} ({fmt}): {count} events")
    for note in notes:
        click.echo(f"note: {source}: {note}")
    if _echo_recorded_ooms([source]) and fmt not in ("snapshot", "jsonl"):
        click.echo(f"note: {target} holds allocations and frees only: the out-of-memory, the "
                   f"segments and the settings stay in {source} (convert to .pickle or .jsonl "
                   "keeps them)")


def _readable_or_refused(source: str, written: str, fmt: str) -> None:
    """A conversion that wrote no event (a header-only input, say) must still give a file
    npumem reads back; otherwise nothing is written and the reason is given."""
    from .trace import TraceFormatError, read_trace
    from .trace.snapshot import load_data

    try:
        if fmt in ("snapshot", "jsonl"):
            load_data(written)
        else:
            list(read_trace(written))
    except TraceFormatError:
        raise TraceFormatError(source, "", "holds no allocation or free to convert (a header "
                               "only, or no events); nothing was written") from None


@main.command()
@click.argument("problem_file", metavar="FILE", type=click.Path(dir_okay=False))
@click.option("--algorithm", default="search", show_default=True,
              help="size, breadth, best (of the greedy orders) or search.")
@click.option("--time-limit", default=60.0, show_default=True, type=float,
              help="Seconds to spend after the first plan (a sweep over time, O(n log n)); "
                   "Ctrl-C stops early with the best plan so far.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Write the placement as CSV: id,lower,upper,size,offset.")
def plan(problem_file, algorithm, time_limit, as_json, out_path):
    """Place buffers with known lifetimes in one arena, as small as possible. FILE is an
    id,lower,upper,size CSV or any allocation trace (lifetimes from alloc/free order)."""
    import json

    from .output_files import OutputPathError, check_output, written_whole
    from .planning import ALGORITHMS, ProblemFormatError, plan as run_plan
    from .trace.lifetimes import load_problem
    from .trace import TraceFormatError
    from .units import format_size

    if algorithm not in ALGORITHMS:
        raise click.BadParameter(f"choose from {', '.join(ALGORITHMS)}", param_hint="--algorithm")
    if time_limit <= 0:
        raise click.BadParameter("must be positive", param_hint="--time-limit")
    try:
        if out_path:
            check_output(out_path, problem_file)
        problem = load_problem(problem_file)
    except OutputPathError as exc:
        raise click.BadParameter(str(exc), param_hint="--out") from None
    except (ProblemFormatError, TraceFormatError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except OSError as exc:
        click.echo(f"error: cannot read {problem_file}: {exc.strerror}", err=True)
        sys.exit(2)
    verbose = not as_json                   # a few lines: each better height

    def say(message: str) -> None:          # each better height, as the search finds it
        if verbose:
            click.echo(f"plan: {message}", err=True)

    result = run_plan(problem, algorithm, time_limit, progress=say)
    if out_path:
        with written_whole(out_path) as partial, open(partial, "w", encoding="utf-8") as out:
            out.write("id,lower,upper,size,offset\n")
            for i in range(len(problem)):
                out.write(f"{problem.ids[i]},{problem.lower[i]},{problem.upper[i]},"
                          f"{problem.size[i]},{result.offsets[i]}\n")
    summary = result.summary()
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    stopped = " (interrupted: the best plan so far)" if result.interrupted else ""
    click.echo(f"{summary['buffers']} buffers, load {format_size(summary['load_bytes'])}, "
               f"height {format_size(summary['height_bytes'])} ({summary['height_over_load']:.4f} "
               f"x load) by {summary['algorithm']} in {summary['seconds']:.1f} s; valid{stopped}")
    if out_path:
        click.echo(f"wrote {out_path}")


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
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
    from .errors import InvalidParamError
    from .profile import _stop_environment_session
    from .profile.folder import claim_folder
    from .profile.run import run_target
    from .profile.session import ProfileSession

    if interval_ms <= 0:
        raise click.BadParameter("must be positive", param_hint="--interval")
    sample = _size_option(sample_bytes, "--sample-bytes") if sample_bytes is not None else 0
    _stop_environment_session()          # NPUMEM_PROFILE=1 as well: this run is the profile
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
    from .units import format_size

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
    from .profile.report import build_report
    from .units import format_size

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
    for leak in report.step_leaks[:3]:
        click.echo(f"npumem profile: leak: {leak.describe()}", err=True)
    if not report.step_leaks and report.step_growth:
        click.echo("npumem profile: no leak: nothing grew step over step", err=True)
    elif not report.step_growth:
        click.echo(f"npumem profile: no steps (no optimizer.step(), profiler step or repeated "
                   f"step), so no leak can be told: {format_size(report.leaked_bytes)} was "
                   "still live at the end (summary.txt lists it by line)", err=True)
    pickle_path = folder / "torch_snapshot.pickle"
    replay = (f"npumem replay {pickle_path} --allocator torch" if recorder.device == "cpu" else
              f"npumem replay --check {pickle_path}")
    click.echo(f"npumem profile: report: {folder / 'report.html'}; {replay}; "
               f"npumem tune {pickle_path}", err=True)
    return True


def _load(path: str):
    """A snapshot dict from a snapshot pickle, or from any trace format npumem reads (its
    allocations and frees, without segments)."""
    from .profile import SnapshotError, load_snapshot
    from .trace import TraceFormatError, read_trace
    from .trace.formats import holds_snapshot
    from .trace.snapshot import from_events

    try:
        if holds_snapshot(path):
            return load_snapshot(path)
        if _is_operator_memory(path):           # msprof: each allocation named by its operator
            from .trace.msprof import to_snapshot

            data, notes = to_snapshot(path)
            for note in notes:
                click.echo(f"note: {path}: {note}")
            return data
        return from_events(read_trace(path))
    except (SnapshotError, TraceFormatError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)


@main.command()
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
def report(path, html_out, top, snapshot_path, device, window_text):
    """Report on a profile folder, a snapshot pickle (npumem's or PyTorch's
    torch.cuda.memory._snapshot()) or any allocation trace npumem reads: peak, top sites, leaks,
    fragmentation. A JSON file of PyTorch's memory_stats() prints its summary table with hit
    rate (and fragmentation); msprof's memory_record.csv, a summary of its usage curve."""
    import os

    from .output_files import OutputPathError, check_output
    from .profile.html import render_html
    from .profile.report import build_report, format_report
    from .file_paths import not_a_file

    if not (os.path.isfile(path) or os.path.isdir(path)):
        click.echo(f"error: {path}: {not_a_file(path)}", err=True)
        sys.exit(2)
    window = _window(window_text)
    if html_out:
        try:
            check_output(html_out, None if os.path.isdir(path) else path)
        except OutputPathError as exc:
            raise click.BadParameter(str(exc), param_hint="--html") from None
    if path.endswith(".json") and os.path.isfile(path) and not _is_chrome_trace(path):
        _no_window(window, "a memory_stats file")
        _report_torch_stats(path, snapshot_path)
        return
    if os.path.isfile(path) and _is_usage_curve(path):
        _no_window(window, "a usage curve")
        click.echo(_usage_summary(path), nl=False)
        if html_out:
            from .profile.html import render_usage_html
            from .trace.msprof import usage_curves

            _write_page(html_out, render_usage_html(f"npumem report of {path}", usage_curves(path)))
        return
    if os.path.isfile(path) and _is_operator_memory(path):
        from .profile.ascend import files_beside

        _no_window(window, "Ascend profiler output")
        _report_ascend([files_beside(path)], top, html_out)
        return
    if os.path.isdir(path):
        # A profile folder: npumem's memory, and PyTorch's own when the script used torch.
        found = [os.path.join(path, name) for name in ("snapshot.pickle", "torch_snapshot.pickle")
                 if os.path.exists(os.path.join(path, name))]
        if not found:
            from .profile.ascend import find_outputs

            outputs = find_outputs(path)
            if outputs:                           # a torch_npu (or msprof) profiler output
                _no_window(window, "Ascend profiler output")
                _report_ascend(outputs, top, html_out)
                return
            click.echo(f"error: {path} has neither torch_snapshot.pickle nor snapshot.pickle "
                       "(an npumem profile folder) nor "
                       "Ascend profiler memory files (operator_memory.csv, memory_record.csv, "
                       "npu_module_mem.csv, in <name>_ascend_pt/ASCEND_PROFILER_OUTPUT or "
                       "PROF_*/mindstudio_profiler_output)", err=True)
            sys.exit(2)
        snapshots = [(name, _load(name)) for name in found]
        if len(snapshots) == 2 and not any(snapshots[0][1].get("device_traces") or []):
            snapshots = snapshots[1:]             # a plain PyTorch script: npumem saw nothing
    else:
        snapshots = [(path, _load(path))]
    reports = [build_report(_part(data, device, window, name), f"npumem report of {name}")
               for name, data in snapshots]
    for result in reports:
        click.echo(format_report(result, top), nl=False)
    if html_out:
        _write_page(html_out, render_html(reports[-1]))


def _window(text: str | None):
    """--window's START:END, read (None without it); a bad one is a usage error."""
    if text is None:
        return None
    from .profile.window import WindowError, parse_window
    try:
        return parse_window(text)
    except WindowError as exc:
        raise click.BadParameter(str(exc), param_hint="--window") from None


def _no_window(window, what: str) -> None:
    if window is not None:
        raise click.BadParameter(f"{what} has no entries to cut: --window reads snapshots and "
                                 "traces", param_hint="--window")


def _cut(data: dict, window, path: str) -> dict:
    """`data` cut to --window; a window outside the recording exits 2 saying its extent."""
    if window is None:
        return data
    from .profile.window import WindowError, windowed
    try:
        return windowed(data, window)
    except WindowError as exc:
        click.echo(f"error: {path}: {exc}", err=True)
        sys.exit(2)


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
        click.echo(f"error: {path} holds no device {device}; its devices: "
                   f"{', '.join(map(str, held)) or 'none'}", err=True)
        sys.exit(2)
    data = _cut(data, window, path)
    traces = data.get("device_traces") or []
    return {**data, "device_traces": [trace if index == device else []
                                      for index, trace in enumerate(traces)],
            "segments": [segment for segment in data.get("segments") or []
                         if segment.get("device", 0) == device]}


def _report_ascend(outputs, top: int, html_out: str | None) -> None:
    """`report` of Ascend profiler outputs (profile.ascend): one report each; the page is the
    last one's."""
    from .profile.ascend import build, render_page
    from .trace import TraceFormatError

    results = []
    for files in outputs:
        try:
            results.append(build(files, top))
        except TraceFormatError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        click.echo(results[-1].text, nl=False)
    if html_out:
        _write_page(html_out, render_page(results[-1]))


def _is_operator_memory(path: str) -> bool:
    from .profile.ascend import is_operator_file

    return os.path.isfile(path) and is_operator_file(path)


def _write_page(path: str, page: str) -> None:
    from .output_files import written_whole

    try:
        with written_whole(path) as partial, open(partial, "w", encoding="utf-8") as out:
            out.write(page)
    except OSError as exc:
        click.echo(f"error: cannot write {path}: {exc.strerror}", err=True)
        sys.exit(2)
    click.echo(f"wrote {path}")


def _is_chrome_trace(path: str) -> bool:
    from .trace import TraceFormatError, detect_format

    try:
        return detect_format(path) == "chrome"
    except TraceFormatError:
        return False


def _is_usage_curve(path: str) -> bool:
    from .trace import TraceFormatError
    from .trace.msprof import is_module_memory, is_usage_curve
    from .trace.textio import read_head

    try:
        head = read_head(path)
        return is_usage_curve(head) or is_module_memory(head)
    except TraceFormatError:          # unreadable: the loader says why
        return False


def _usage_summary(path: str) -> str:
    from .trace import TraceFormatError
    from .trace.msprof import usage_summary

    try:
        return usage_summary(path)
    except TraceFormatError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)


def _report_torch_stats(path: str, snapshot_path: str | None) -> None:
    from .profile.torch_allocator import torch_memory_summary
    from .errors import AclError
    from .profile import SnapshotError

    try:
        click.echo(torch_memory_summary(path, snapshot_path), nl=False)
    except AclError as exc:
        click.echo(f"error: {exc.message}", err=True)          # the sentence, not the ACL code
        sys.exit(2)
    except SnapshotError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)


@main.command("diff")
@click.argument("before", type=click.Path())
@click.argument("after", type=click.Path())
@click.option("--top", default=20, show_default=True, type=click.IntRange(min=1),
              help="Sites to list.")
def diff_command(before, after, top):
    """What grew between two snapshots (pickles or profile folders), by allocation site."""
    import os

    from .profile import diff

    def resolve(path):
        """A profile folder's snapshot (torch_snapshot.pickle, else snapshot.pickle), else the
        folder's Ascend profiler operator_memory.csv."""
        from .profile.folder import SNAPSHOTS

        if not os.path.isdir(path) or any(os.path.isfile(os.path.join(path, name))
                                          for name in SNAPSHOTS):
            return _profile_input(path)
        from .profile.ascend import find_outputs

        operators = [files.operator for files in find_outputs(path) if files.operator]
        return operators[0] if len(operators) == 1 else _profile_input(path)

    before, after = resolve(before), resolve(after)
    click.echo(diff(_load(before), _load(after), top))
    _echo_recorded_ooms([before, after])


def _profile_input(path: str) -> str:
    """The file to read for PATH: a profile folder's snapshot (folder.profile_snapshot), or
    PATH itself; a folder without one ends the command in one line."""
    from .errors import InvalidParamError
    from .profile.folder import profile_snapshot

    try:
        return profile_snapshot(path)
    except InvalidParamError as exc:
        click.echo(f"error: {exc.message}", err=True)
        sys.exit(2)


def _echo_recorded_ooms(paths) -> bool:
    """Each snapshot among `paths` whose run died: what it asked, had and held, and where.
    Whether any had died."""
    from .profile.oom import oom_lines
    from .trace import TraceFormatError
    from .trace.formats import holds_snapshot
    from .trace.snapshot import first_oom, load_recording

    died = False
    for path in paths:
        try:
            if not holds_snapshot(path):
                continue
            recording = load_recording(path)
        except TraceFormatError:
            continue                          # the command itself has said what is wrong
        if first_oom(recording.entries) is not None:
            died = True
            click.echo(f"{path}: " + "\n".join(oom_lines(recording)))
    return died


from .estimate.command import estimate_command  # noqa: E402 (a verb of its own module)

main.add_command(estimate_command)
