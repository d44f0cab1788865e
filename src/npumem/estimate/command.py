"""The `npumem estimate` verb: parse, call run.estimate, print."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import sys

import click

from ..errors import CommandError
from ..units import format_size


def _assumptions(values: tuple) -> dict:
    """--assume's KIND=VALUE defaults and FILE:LINE=VALUE answers (the value read at a line)."""
    out: dict = {}
    for value in values:
        for part in value.split(","):
            key, _, text = part.partition("=")
            key, text = key.strip(), text.strip()
            if ":" in key and not text:
                raise click.BadParameter(f"{part!r}: give FILE:LINE=VALUE, for example "
                                         "train.py:12=0.5", param_hint="--assume")
            if ":" in key:
                name, _, line = key.rpartition(":")
                if not name or not line.isdigit():
                    raise click.BadParameter(f"{part!r}: give FILE:LINE=VALUE with a line number, "
                                             "for example train.py:12=0.5", param_hint="--assume")
                out.setdefault("lines", {})[key] = _literal(part, text)
                continue
            if key not in ("bool", "int", "float") or not text:
                raise click.BadParameter(f"{part!r}: give bool=True|False, int=N, float=X or "
                                         "FILE:LINE=VALUE", param_hint="--assume")
            try:
                out[key] = {"bool": lambda t: {"true": True, "false": False}[t.lower()],
                            "int": int, "float": float}[key](text)
            except (KeyError, ValueError):
                kind = {"bool": "True or False", "int": "an integer", "float": "a number"}[key]
                raise click.BadParameter(f"{part!r}: {key} takes {kind}, not {text!r}",
                                         param_hint="--assume") from None
    return out


def _literal(part: str, text: str):
    """A line's value: True or False, an integer or a number."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    raise click.BadParameter(f"{part!r}: a line's value is True, False or a number, not {text!r}",
                             param_hint="--assume")


def _versions(torch_version: str | None, cudnn_version: str | None) -> dict:
    """The target's versions the user named, checked (versions.py reads them in the fake run)."""
    from .versions import parse_cudnn, parse_version
    out = {}
    for name, text, parse, example in (("torch_version", torch_version, parse_version, "2.11"),
                                       ("cudnn_version", cudnn_version, parse_cudnn, "9.19.0")):
        if text is None:
            continue
        try:
            parse(text)
        except ValueError:
            raise click.BadParameter(f"{text!r} is not a version (for example {example})",
                                     param_hint="--" + name.replace("_version", "").replace(
                                         "torch", "torch-version")) from None
        out[name] = text
    return out


def _fit_values(text: str | None) -> tuple[str, list[str]] | None:
    if text is None:
        return None
    name, _, values = text.partition("=")
    choices = [v.strip() for v in values.split(",") if v.strip()]
    if not name.strip() or not choices:
        raise click.BadParameter(f"{text!r}: give NAME=V1,V2,... and use {{NAME}} in the "
                                 "script's arguments", param_hint="--fit")
    return name.strip(), choices


@click.command("estimate", context_settings={"ignore_unknown_options": True,
                                             "allow_interspersed_args": False})
@click.option("--device", type=click.Choice(["cuda", "npu"]), default=None,
              help="cuda (default): an NVIDIA GPU; npu: an Ascend NPU with torch_npu's allocator "
                   "(a script written for cuda runs as transfer_to_npu runs it). --gpu 910b "
                   "implies npu.")
@click.option("--gpu", default=None, help="The target: h100 (default for cuda), h100-pcie, h200, "
              "a100-80, a100-40, l4, rtx4090, 910b (default for npu).")
@click.option("--memory", default=None, help="The memory the script may use (default: the "
              "target's, less the CUDA context), e.g. 40GiB, or bytes (42949672960).")
@click.option("--set", "overrides", multiple=True, metavar="KEY:VALUE",
              help="An allocator setting on top of the environment's PYTORCH_CUDA_ALLOC_CONF "
                   "(repeatable), e.g. --set expandable_segments:True.")
@click.option("--assume", multiple=True, metavar="KIND=VALUE",
              help="Answers for data-dependent values: bool=True, int=8, float=0.5, or the value "
                   "read at one line of the script: train.py:12=0.5 (repeatable).")
@click.option("--fit", "fits", multiple=True, metavar="NAME=V1,V2,...",
              help="Run the script once per value, {NAME} in its arguments replaced; report "
                   "the largest that fits under the recommended setting with 5% of its peak "
                   "to spare.")
@click.option("--torch-version", default=None, metavar="X.Y",
              help="The PyTorch the script will run under, where it differs from the installed "
                   "one (it decides the attention kernel), e.g. 2.11.")
@click.option("--cudnn", "cudnn_version", default=None, metavar="X.Y.Z",
              help="The cuDNN the script will run with (default 9.19.0), e.g. 9.10.2.")
@click.option("--devices", default=1, show_default=True, type=click.IntRange(1, 64),
              help="How many GPUs the script sees (device 0 is estimated).")
@click.option("--json", "as_json", is_flag=True, help="Print the estimate as JSON.")
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False),
              help="Write the predicted run's snapshot (open it with npumem report or "
                   "PyTorch's MemoryViz) and the estimate's JSON here.")
@click.option("--force", is_flag=True, help="Write into --out even if it holds files.")
@click.argument("script", type=click.Path())
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def estimate_command(device, gpu, memory, overrides, assume, fits, torch_version, cudnn_version,
                     devices, as_json, out_dir, force, script, script_args):
    """Predict a PyTorch script's GPU (or NPU) memory on a machine that has neither.

    Runs SCRIPT unchanged on fake device tensors, adds what the GPU's kernels allocate for
    themselves, and replays it through the model of PyTorch's caching allocator: peak live and
    peak reserved, whether it fits the target, the setting to use, and what dominates the peak.
    Exit status: 0 it fits (under your settings or the one recommended); 3 uncertain: the
    script took a branch on a value estimate had to assume (each is named with its line; give
    it with --assume FILE:LINE=VALUE); 4 nothing fits; 1 the script failed; 2 a usage error.

        npumem estimate --gpu a100-40 -- train.py --batch 32
    """
    from ..errors import InvalidParamError
    from ..profile.script_check import not_a_script
    from .run import settings_for
    from .targets import TARGETS, target as find_target

    if script.startswith("-") and not os.path.exists(script):
        raise click.NoSuchOption(script.partition("=")[0])   # an option estimate does not have
    problem = not_a_script(script)      # a recording, a binary, a folder: one line, nothing run
    if problem is not None:
        raise click.BadParameter(problem, param_hint="SCRIPT")
    try:
        chosen = find_target(gpu, device or "cuda")
    except KeyError as exc:
        raise click.BadParameter(exc.args[0], param_hint="--gpu") from None
    if device is not None and chosen.device != device:
        raise click.BadParameter(f"--gpu {gpu} is {'an NPU' if chosen.device == 'npu' else 'a GPU'}; "
                                 f"--device {device} takes " + ", ".join(
                                     k for k, t in TARGETS.items() if t.device == device),
                                 param_hint="--gpu")
    device = chosen.device
    for override in overrides:
        if ":" not in override and "=" not in override:
            raise click.BadParameter(f"{override!r}: give KEY:VALUE (or KEY=VALUE), for example "
                                     "expandable_segments:True", param_hint="--set")
    try:
        settings = settings_for(device, list(overrides))
    except InvalidParamError as exc:          # the environment's own, where no --set was given
        from ..alloc.torch_model.config import settings_variable
        variable = settings_variable("npu" if device == "npu" else "cuda")
        raise click.BadParameter(exc.message, param_hint="--set" if overrides else variable) \
            from None
    if len(fits) > 1:
        raise click.BadParameter("give one --fit (one name and its values)", param_hint="--fit")
    fit = fits[0] if fits else None
    from ..cli_sizes import device_memory      # the rule every --memory follows
    capacity = device_memory(memory)
    answers = _assumptions(assume)
    versions = _versions(torch_version, cudnn_version)
    fitting = _fit_values(fit)
    runs = [(None, list(script_args))] if fitting is None else \
        [(value, [a.replace("{" + fitting[0] + "}", value) for a in script_args]) for value in fitting[1]]
    if fitting is not None and not any("{" + fitting[0] + "}" in a for a in script_args):
        raise click.BadParameter(f"no {{{fitting[0]}}} in the script's arguments to replace",
                                 param_hint="--fit")
    if out_dir is not None:                    # before minutes of work, not after
        from ..output_files import OutputPathError, check_output
        from ..profile.folder import prepare_folder     # profile's rule for --out, --force
        try:
            prepare_folder(out_dir, force)
            check_output(os.path.join(out_dir, "estimate.json"))
        except (InvalidParamError, OutputPathError) as exc:
            raise click.BadParameter(str(exc), param_hint="--out") from None
    with _interrupted_by_sigterm():
        results, failed = _run_each(runs, fitting, script, device, gpu, capacity, settings,
                                    answers, devices, out_dir, as_json, versions)
    if fitting is not None and not results:
        if as_json:
            click.echo(json.dumps({"fit": None, "runs": [], "failed": [
                {fitting[0]: v, "error": f} for v, f in failed]}, indent=2))
        sys.exit(1)
    if out_dir is not None:
        _write(out_dir, results)
    if as_json:
        if fitting is None:
            click.echo(json.dumps(results[0][1].as_dict(), indent=2))
        else:
            runs = [dict(r.as_dict(), **{fitting[0]: v}) for v, r in results]
            click.echo(json.dumps({"fit": fit_answer(fitting[0], results), "runs": runs,
                                   "failed": [{fitting[0]: v, "error": f} for v, f in failed]},
                                  indent=2))
    elif fitting is not None:
        click.echo("\n".join(fit_lines(fitting[0], results)))
        if failed:
            click.echo(f"not judged: {', '.join(f'{fitting[0]}={v}' for v, _ in failed)} "
                       "(the script failed; see above)")
    sys.exit(exit_status([r for _, r in results]))


# exit statuses besides 0 (fits), 1 (the script failed) and 2 (a usage error)
UNCERTAIN, DOES_NOT_FIT = 3, 4


def exit_status(results) -> int:
    """3 when any answer rests on a value estimate assumed for a branch, else 4 when nothing
    fits under any setting, else 0."""
    if any(r.uncertain for r in results):
        return UNCERTAIN
    if not any(r.fits or r.recommended is not None for r in results):
        return DOES_NOT_FIT
    return 0


def _run_each(runs, fitting, script, device, gpu, capacity, settings, answers, devices,
              out_dir, as_json, versions):
    """Each run's estimate, printed as it comes: (results, failed) as (value, result) and
    (value, failure) pairs; a failure without --fit ends the command."""
    from .native import BuildError
    from .run import ScriptFailed, estimate
    results, failed = [], []
    for value, args in runs:
        if value is not None:
            click.echo(f"== {fitting[0]}={value}: {script} {' '.join(args)}", err=True)
        try:
            result = estimate(script, args, device, gpu, capacity, settings, answers, devices,
                              keep_snapshot=out_dir is not None,
                              script_output=sys.stderr if as_json else None, versions=versions)
        except BuildError as exc:
            raise CommandError(str(exc)) from None
        except ScriptFailed as exc:
            click.echo(f"error: {_failure_line(exc)}", err=True)
            hint = _hint(exc.failure)
            if hint:
                click.echo("  " + hint, err=True)
            if fitting is None:
                if as_json:
                    click.echo(json.dumps({"error": exc.failure}, indent=2))
                sys.exit(1)
            failed.append((value, exc.failure))  # the other values still answer the fit
            continue
        results.append((value, result))
        for line in unused_assumptions(answers, result):
            click.echo(f"warning: {line}", err=True)
        if not as_json:
            click.echo("\n".join(summary_lines(result)))
    return results, failed


def _failure_line(exc) -> str:
    failure = exc.failure
    if failure.get("exited") is not None:
        return f"{failure['message']}, before estimate could judge it"
    if failure.get("ordinary") and failure.get("assumed"):
        return f"the script raised an error, after reading values estimate assumed: {exc}"
    if failure.get("ordinary"):
        return f"the script raised an error (a GPU run would too): {exc}"
    return f"the script stopped under fake tensors: {exc}"


def _hint(failure: dict) -> str:
    assumed = failure.get("assumed", [])
    if failure.get("ordinary") and assumed:
        return ("the script read values estimate could only assume (" + "; ".join(assumed[:3]) +
                "): if the error follows from one, give it with --assume")
    if failure.get("exited") is not None or failure.get("ordinary"):
        return ""
    text = f"{failure.get('type')} {failure.get('message')}"
    if "DataDependent" in text or "DynamicOutputShape" in text:
        return ("the script needs a value computed on the GPU: give it with --assume "
                "(bool=..., int=..., float=...), or skip that part when "
                "os.environ.get('NPUMEM_ESTIMATE') is set")
    if "RNN" in text or "no fake-device path" in text:
        return "estimate cannot run this layer yet (docs/estimate.md, 'What it cannot see yet')"
    return ("code that needs real data (numpy(), values printed or saved) can be skipped when "
            "os.environ.get('NPUMEM_ESTIMATE') is set; NPUMEM_ESTIMATE_TRACEBACK=1 shows where "
            "it stopped in full")


@contextlib.contextmanager
def _interrupted_by_sigterm():
    """SIGTERM (`timeout`, a job scheduler) stops the estimate as Ctrl-C does: the fake run's
    process ends and its temporary folder goes (a bare SIGTERM would leave both)."""
    import signal
    import threading

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def summary_lines(result) -> list[str]:
    target, run = result.target, result.run
    models = f", modelling {run['versions']['text']}" if run.get("versions") else ""
    lines = [f"{result.script} on {target.describe()}: {format_size(result.capacity)} usable{models}",
             f"  fake run: {run['ops']:,} operator{'s' * (run['ops'] != 1)} in {run['seconds']:.1f} s, "
             f"{run['ops'] / max(run['op_seconds'], 1e-9):,.0f} per second inside the operators "
             f"({1e6 * run['op_seconds'] / max(run['ops'], 1):.0f} us each)"]
    kernels = {k: v for k, v in (run.get("attention") or {}).items() if k != "note"}
    if kernels:
        lines.append("  attention kernels: " + ", ".join(f"{k} x{v}" for k, v in kernels.items()))
    if (run.get("attention") or {}).get("note"):
        lines.append(f"  attention: {run['attention']['note']}")
    for note in run.get("answers", []):
        lines.append(f"  note: {note}")
    current = result.current
    if not current.peak_allocated_bytes:
        device = result.target.device
        lines.append(f"  note: the script put nothing on the {'NPU' if device == 'npu' else 'GPU'}"
                     f" (no .to(\"{device}\"), .{device}() or device=\"{device}\" reached a tensor)")
    verdict = "fits" if result.fits else "OUT OF MEMORY"
    settings = result.settings or "default settings"
    caveats = [f"UNCERTAIN: {len(result.uncertain)} decision{'s' * (len(result.uncertain) != 1)} "
               "on assumed values"] if result.uncertain else []
    caveats += ["not modelled: " + ", ".join(
        item["what"] + (f" ({item['count']:,} calls)" if item["count"] > 1 else "")
        for item in result.unmodelled)] if result.unmodelled else []
    lines.append(f"  with {settings}: peak live {format_size(current.peak_allocated_bytes)}, "
                 f"peak reserved {format_size(current.peak_reserved_bytes)} -> {verdict}"
                 + (f" ({format_size(result.capacity - current.peak_reserved_bytes)} to spare)"
                    if result.fits else
                    f" (short by {format_size(current.peak_reserved_bytes - result.capacity)})")
                 + "".join(f"; {caveat}" for caveat in caveats))
    lines += uncertain_lines(result.uncertain)
    if result.leaks is not None and result.leaks.leaks:    # the analysis report and tune show
        lines.append(f"  leak: {result.leaks.headline()} (the more steps it runs, the higher "
                     f"its peak; npumem report of --out's predicted.pickle gives the evidence)")
    convolutions = run.get("convolutions") or {}
    if convolutions.get("modelled"):
        measured = f"{convolutions['measured']:,} measured on an H200 and " \
            if convolutions.get("measured") else ""
        span = f": peak reserved between {format_size(result.low_peak_reserved)} and " \
               f"{format_size(result.high_peak_reserved)} as cuDNN's plans go (the likely " \
               f"workspaces are used above)" if result.high_peak_reserved is not None else ""
        lines.append(f"  cuDNN convolutions: {measured}{convolutions['modelled']:,} modelled "
                     f"(conv_workspace.py){span}")
    best = result.recommended
    if best is not None:
        lines.append(f"  recommended: {best.instruction}; peak reserved "
                     f"{format_size(best.decisive.peak_reserved_bytes)}")
    else:
        lines.append("  no setting fits: " + "; ".join(result.tuning.reasons or ["reduce the batch"]))
    composition = result.composition
    if composition.get("category"):
        lines.append("  live at the peak, by category: " + ", ".join(
            f"{name or 'other'} {format_size(size)}" for name, size in composition["category"].items()))
        if composition.get("kernels"):
            lines.append("  of which the kernels' own workspaces: " + ", ".join(
                f"{name} {format_size(size)}" for name, size in composition["kernels"].items()))
        lines.append("  by line:")
        lines += [f"    {format_size(row['bytes']):>10}  {row['line']}" for row in composition["line"][:5]]
    return lines


def unused_assumptions(answers: dict, result) -> list[str]:
    """--assume FILE:LINE=VALUE that no read matched: most often the line that decides was
    given, where the value is read on another (read_at says which)."""
    used = result.run.get("lines_given") or {}
    reads = sorted({d["read_at"] for d in result.uncertain})
    where = f"; values estimate assumed were read at {', '.join(reads)}" if reads else ""
    return [f"--assume {key}={value} matched no value read at that line{where}"
            for key, value in (answers.get("lines") or {}).items() if key not in used]


def uncertain_lines(uncertain: list[dict]) -> list[str]:
    """Each branch taken on an assumed value, and how to decide it."""
    if not uncertain:
        return []
    lines = ["  UNCERTAIN: the script's path depends on values only the GPU computes; estimate "
             "assumed them:"]
    for d in uncertain[:12]:
        read = "" if d["read_at"] == f"{d['file']}:{d['line']}" else f", read at {d['read_at']}"
        times = f", {d['count']:,} times" if d["count"] > 1 else ""
        lines.append(f"    {d['file']}:{d['line']}: {d['code'] or '?'}")
        inside = f" (in {d['inside']})" if d.get("inside") else ""
        lines.append(f"      {d['how']}{inside}; the {d['what']} assumed {d['assumed']}{read}{times}")
    if len(uncertain) > 12:
        lines.append(f"    ... and {len(uncertain) - 12} more (--json lists them all)")
    example = uncertain[0]["read_at"]
    lines.append(f"  to decide one, give the value read there: --assume {example}=VALUE (or skip "
                 "that part when os.environ.get('NPUMEM_ESTIMATE') is set)")
    return lines


# --fit keeps this share of the predicted peak free: the estimate's error out of sample
# (docs/estimate.md: within 3% on transformers, 10% on CNNs' convolution workspaces)
FIT_MARGIN = 0.05


def fit_answer(name: str, results) -> dict | None:
    """The largest value whose recommended setting fits with FIT_MARGIN of its peak to spare,
    with that setting and the margins; None when none does."""
    def fits(result) -> bool:
        best = result.recommended
        return best is not None and \
            best.decisive.peak_reserved_bytes * (1 + FIT_MARGIN) <= result.capacity
    fitting = [(v, r) for v, r in results if fits(r)]
    if not fitting:
        return None
    value, best = max(fitting, key=lambda item: float(item[0]) if _number(item[0]) else 0)
    chosen = best.recommended
    peak = chosen.decisive.peak_reserved_bytes
    return {"name": name, "value": value, "settings": chosen.config.describe(), "line": chosen.line,
            "peak_reserved_bytes": peak, "margin_bytes": best.capacity - peak,
            "safety_margin_bytes": int(peak * FIT_MARGIN), "capacity_bytes": best.capacity,
            "uncertain": any(r.uncertain for _, r in results)}


def fit_lines(name: str, results) -> list[str]:
    answer = fit_answer(name, results)
    if answer is None:
        return [f"no {name} fits with {FIT_MARGIN:.0%} of its peak to spare: the smallest tried "
                "needs more than the target's memory"]
    lines = [f"largest {name} that fits: {answer['value']}, with {answer['line']} (peak reserved "
             f"{format_size(answer['peak_reserved_bytes'])}; {format_size(answer['margin_bytes'])} "
             f"to spare of {format_size(answer['capacity_bytes'])}, at least "
             f"{format_size(answer['safety_margin_bytes'])} ({FIT_MARGIN:.0%}) kept as the margin)"]
    if answer["uncertain"]:
        lines.append("  UNCERTAIN: some runs branched on assumed values (above): give them with "
                     "--assume FILE:LINE=VALUE")
    return lines


def _number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _write(folder: str, results) -> None:
    from ..output_files import written_whole
    from .predicted import predicted_snapshot
    for value, result in results:
        suffix = f"-{value}" if value is not None else ""
        snapshot = predicted_snapshot(result.snapshot, result.config)
        with written_whole(os.path.join(folder, f"predicted{suffix}.pickle")) as path, \
                open(path, "wb") as handle:
            pickle.dump(snapshot, handle)
        with written_whole(os.path.join(folder, f"estimate{suffix}.json")) as path, \
                open(path, "w") as handle:
            json.dump(result.as_dict(), handle, indent=2)
    click.echo(f"wrote the predicted snapshot and estimate to {folder}/", err=True)
