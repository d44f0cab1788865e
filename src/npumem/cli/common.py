"""What several verbs share: the scheduler and NPU-chip options, the progress bar and error
handling of replays, and reading inputs (profile folders, snapshots, any trace) the same way
everywhere, so each verb says the same thing about the same file."""

from __future__ import annotations

import os

import click

from .errors import CommandError


def _scheduler(ctx, param, value: str) -> str:
    from ..whatif.sweep import check_scheduler
    try:
        check_scheduler(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return value


def scheduler_options(command):
    """--scheduler and --workers: where the replays of `replay` and `tune` run."""
    command = click.option("--scheduler", default="processes", show_default=True,
                           callback=_scheduler,
                           help="Where replays run: processes (local, one per core), serial, "
                                "dask (a local Dask cluster) or tcp://host:port (a Dask "
                                "scheduler).")(command)
    return click.option("--workers", type=click.IntRange(min=1), default=None,
                        help="Worker processes (default: one per core).")(command)


def npu_chip_options(command):
    """--soc and --cann: the Ascend chip whose request padding torch_npu's allocator uses."""
    command = click.option("--cann", default=None, metavar="VERSION",
                           help="With --soc: the CANN version the run uses (e.g. 9.1.0). "
                                "Default: 8.5.0.")(command)
    return click.option("--soc", default=None, metavar="NAME",
                        help="The Ascend chip to replay torch_npu's allocator for (e.g. "
                             "Ascend910B3, Ascend950PR): torch_npu pads every request by 32 "
                             "bytes, except on an Ascend950 with CANN 9.1.0 or newer. "
                             "Default: Ascend910B3.")(command)


def npu_pad(soc: str | None, cann: str | None, torch_npu: bool) -> int | None:
    """The request padding of --soc/--cann (None: the flavour's default)."""
    from ..alloc.torch_model.config import npu_pad as pad_for_chip
    from ..errors import InvalidParamError

    if soc is None and cann is None:
        return None
    if not torch_npu:
        raise click.BadParameter("the chip matters to torch_npu's allocator only; add "
                                 "--allocator torch_npu", param_hint="--soc/--cann")
    try:
        return pad_for_chip(soc or "Ascend910B3", cann or "8.5.0")
    except InvalidParamError as exc:
        raise click.BadParameter(exc.message, param_hint="--soc/--cann") from None


def run_replays(label: str, quiet: bool, work):
    """Call `work(progress)` with a progress bar of finished replays; bad traces exit 2 with
    their file and position, bad options exit as usage errors."""
    from ..alloc.caching_allocator import OutOfMemoryError
    from ..errors import InvalidParamError
    from ..progress import ProgressBar
    from ..trace import TraceFormatError
    from ..units import format_size

    bar = ProgressBar(None, label, "replays", enabled=not quiet)

    def update(done: int, total: int, events: int = 0) -> None:
        bar.total = total
        bar.unit = f"replays ({events:,} events into the current one)" if events else "replays"
        bar.update(done, force=not events)

    try:
        return work(update)
    except TraceFormatError as exc:
        raise CommandError(str(exc)) from None
    except InvalidParamError as exc:              # its sentence, without the ACL code
        raise click.UsageError(exc.message) from None
    except OutOfMemoryError as exc:
        raise CommandError(f"the trace needs more device memory than the "
                           f"{format_size(exc.capacity)} it was given (it asked for "
                           f"{format_size(exc.requested)} when the rest was taken); raise "
                           "--memory, or leave it out (64 GiB)") from None
    except (ValueError, RuntimeError, OSError) as exc:
        raise click.UsageError(str(exc)) from None
    finally:
        bar.close()


def profile_input(path: str) -> str:
    """The file to read for PATH: a profile folder's snapshot (folder.profile_snapshot), or
    PATH itself; a folder without one ends the command in one line."""
    from ..errors import InvalidParamError
    from ..profile.folder import profile_snapshot

    try:
        return profile_snapshot(path)
    except InvalidParamError as exc:
        raise CommandError(exc.message) from None


def is_operator_memory(path: str) -> bool:
    """An Ascend profiler operator_memory.csv (each allocation named by its operator)."""
    from ..profile.ascend import is_operator_file

    return os.path.isfile(path) and is_operator_file(path)


def load_as_snapshot(path: str):
    """A snapshot dict from a snapshot pickle, or from any trace format npumem reads (its
    allocations and frees, without segments)."""
    from ..profile import SnapshotError, load_snapshot
    from ..trace import TraceFormatError
    from ..trace.formats import holds_snapshot, read_mended
    from ..trace.snapshot import from_events

    try:
        if holds_snapshot(path):
            return load_snapshot(path)
        if is_operator_memory(path):            # msprof: each allocation named by its operator
            from ..trace.msprof import to_snapshot

            data, notes = to_snapshot(path)
            for note in notes:
                click.echo(f"note: {path}: {note}")
            return data
        mended = read_mended(path)
        data = from_events(mended.entries)
        data["npumem_notes"] = mended.notes              # what reading the trace changed
        return data
    except (SnapshotError, TraceFormatError) as exc:
        raise CommandError(str(exc)) from None


def echo_recorded_ooms(paths, loaded: dict | None = None, results=()) -> bool:
    """Each snapshot among `paths` whose run died: what it asked, had and held, and where.
    Whether any had died. `loaded`: the snapshot dicts the verb already read, by path, and
    `results`: its replays, whose `recorded_oom` says it without reading the file again."""
    from ..profile.oom import oom_lines, oom_lines_from
    from ..trace import TraceFormatError
    from ..trace.formats import holds_snapshot
    from ..trace.snapshot import load_recording, recording_from_data

    said = {r.trace: r.recorded_oom for r in results if getattr(r, "recorded_oom", None) is not None}
    died = False
    for path in paths:
        if path in said:
            lines = oom_lines_from(said[path])
        else:
            try:
                if not holds_snapshot(path):
                    continue
                data = (loaded or {}).get(path)
                recording = (load_recording(path) if data is None else
                             recording_from_data(data, path))
            except TraceFormatError:
                continue                          # the command itself has said what is wrong
            lines = oom_lines(recording)
        if lines:
            died = True
            click.echo(f"{path}: " + "\n".join(lines))
    return died
