"""What `npumem replay`'s setting options ask for, checked before any replay runs: the
settings each allocator replays with (--set, --sweep, the environment's, as the program ran)
and the options only the predictive pool understands (--steps, --planner-lag)."""

from __future__ import annotations

import os

import click


def _needs_prediction(option: str, what: str, pool_settings: list[str]) -> None:
    """`option` only means something to a pool with predictive:True (`what` it does there)."""
    from ..alloc.settings import parse_settings

    if not any(parse_settings(chosen).predictive for chosen in pool_settings):
        raise click.BadParameter(f"only a pool with predictive:True {what}; add --allocator "
                                 "pool --set predictive=True", param_hint=option)


def check_steps(name: str | None, traces, pool_settings: list[str]) -> None:
    """--steps names annotations, which snapshots and Chrome traces carry, for the predictive
    pool."""
    from ..trace.formats import carries_annotations, detect_format

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


def check_planner_lag(lag: int, pool_settings: list[str]) -> None:
    """--planner-lag is a count of requests, and only the predictive pool has plans to hand over."""
    if lag < 0:
        raise click.BadParameter(f"{lag}: a number of requests, 0 or more",
                                 param_hint="--planner-lag")
    if lag:
        _needs_prediction("--planner-lag", "has plans to hand over", pool_settings)


def settings_for(names, settings, sweeps) -> tuple[dict[str, list[str]], list[tuple]]:
    """The settings strings to replay each of `names` with: the --set items and --sweep axes
    whose keys it has, every combination checked before any replay runs; and notes
    (trace, allocator, text) naming the keys an allocator went without. A key no allocator
    has, or a value one refuses, is an error that says which keys there are or what is wrong."""
    from ..alloc.settings import parse_settings
    from ..alloc.torch_model.config import parse_config
    from ..errors import InvalidParamError
    from ..whatif.sweep import split_for, sweep_settings

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


def torch_environment(names, traces, snapshots, combos) -> tuple[dict, list[tuple]]:
    """PyTorch's settings from the environment ({(trace, allocator): text}), which the torch
    model replays traces other than snapshots with, as the program ran (a snapshot records its
    own), read in PyTorch's order of variables and checked with each combination; and notes."""
    from importlib.metadata import PackageNotFoundError, version

    from ..alloc.torch_model.config import env_names, parse_config, read_env
    from ..errors import InvalidParamError

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


def check_check_options(allocators: str | None, sweeps, plot_path: str | None, planner_lag: int,
                        steps: str | None, scheduler_given: bool, workers: int | None) -> None:
    """--check replays each snapshot once, through the torch model under the recording's own
    settings, in this process: the options that vary settings, draw the replays, steer the
    predictive pool or spread replays over workers would be ignored, so they are refused."""
    unused = []
    if sweeps:
        unused.append(("--sweep", "it checks the recording's own settings, once"))
    if plot_path:
        unused.append(("--plot", "it draws no chart"))
    others = [name.strip() for name in (allocators or "").split(",")
              if name.strip() and name.strip() not in ("torch", "torch_npu")]
    if others:
        unused.append(("--allocator", f"it models PyTorch's allocator only, torch or torch_npu, "
                       f"not {', '.join(others)}"))
    if planner_lag:
        unused.append(("--planner-lag", "it steers the predictive pool, which the check does "
                       "not replay"))
    if steps is not None:
        unused.append(("--steps", "it steers the predictive pool, which the check does not "
                       "replay"))
    if scheduler_given or workers is not None:
        unused.append(("--scheduler/--workers", "the check replays one snapshot after another "
                       "in this process"))
    if unused:
        names = [name for name, _ in unused]
        one = len(names) == 1
        named = names[0] if one else ", ".join(names[:-1]) + " and " + names[-1]
        raise click.UsageError(f"{named} {'does' if one else 'do'} nothing with --check "
                               f"({'; '.join(why for _, why in unused)}): drop "
                               f"{'it' if one else 'them'}, or drop --check to replay under "
                               "each setting")
