"""What `npumem view` opens: any input npumem reads (a snapshot pickle or its JSONL form, a
profile folder, estimate's predicted.pickle, an event trace, an msprof folder or its
operator_memory.csv), read the way `npumem report` reads it, as a snapshot dict whose device
traces are columns. `open_source` picks the device the report leads with (the one that ran
out of memory, else the first with entries) and hands it to `series.Series`, which precomputes
what every request slices.

Errors are `SourceError`: one line naming the file, which the command prints and the page
shows.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .errors import SourceError

KINDS = ("snapshot", "profile", "jsonl", "trace", "msprof", "predicted")


@dataclass
class Loaded:
    """A path read as a snapshot dict, before any analysis."""

    path: str                    # what the user gave
    file: str                    # the file read (a profile folder's snapshot, an msprof CSV)
    kind: str                    # one of KINDS
    data: dict                   # the snapshot dict (device traces as columns)
    notes: list[str] = field(default_factory=list)
    usage: str | None = None     # msprof: its memory_record.csv (each component's totals)


def load(path: str) -> Loaded:
    """Read `path` as npumem report would; SourceError for anything it cannot."""
    from ..file_paths import not_a_file

    if not (os.path.isfile(path) or os.path.isdir(path)):
        raise SourceError(f"{path}: {not_a_file(path)}")
    if os.path.isdir(path):
        return _folder(path)
    return _file(path, path)


def _folder(path: str) -> Loaded:
    """A profile folder (its torch snapshot, else npumem's), else an Ascend profiler output."""
    from ..profile.folder import SNAPSHOTS

    for name in SNAPSHOTS:
        inner = os.path.join(path, name)
        if os.path.isfile(inner):
            loaded = _file(inner, path)
            if name == "torch_snapshot.pickle" or loaded.kind == "snapshot":
                loaded.kind = "profile"
            return loaded
    from ..profile.ascend import find_outputs

    outputs = [files for files in find_outputs(path) if files.operator]
    if outputs:
        return _msprof(path, outputs[0].operator,
                       [f"{len(outputs) - 1} more profiler output(s) under {path} not shown"]
                       if len(outputs) > 1 else [], outputs[0].record)
    raise SourceError(f"{path} has neither torch_snapshot.pickle nor snapshot.pickle (an npumem "
                      "profile folder) nor an Ascend profiler's operator_memory.csv")


def _file(file: str, given: str) -> Loaded:
    from ..profile import SnapshotError, load_snapshot
    from ..trace import TraceFormatError
    from ..trace.formats import detect_format, holds_snapshot, read_mended
    from ..trace.snapshot import from_events
    from ..profile.ascend import is_operator_file

    try:
        if holds_snapshot(file):
            data = load_snapshot(file)
            meta = data.get("npumem")
            predicted = isinstance(meta, dict) and str(meta.get("source", "")).startswith(
                "npumem estimate")
            return Loaded(given, file, "predicted" if predicted else "snapshot", data)
        if is_operator_file(file):        # msprof: each allocation named by its operator
            from ..profile.ascend import files_beside

            return _msprof(given, file, [], files_beside(file).record)
        fmt = detect_format(file)
        mended = read_mended(file)
        data = from_events(mended.entries)
        return Loaded(given, file, "jsonl" if fmt == "jsonl" else "trace", data,
                      list(mended.notes))
    except (SnapshotError, TraceFormatError) as exc:
        raise SourceError(str(exc)) from None
    except MemoryError:
        raise SourceError(f"{file}: out of host memory (RAM) while reading it") from None


def _msprof(given: str, csv: str, notes: list[str], usage: str | None = None) -> Loaded:
    from ..trace import TraceFormatError
    from ..trace.msprof import to_snapshot
    from ..trace.snapshot.schema import check_snapshot

    try:
        data, more = to_snapshot(csv)
        # the lists of dicts become columns, as a pickle's are (one reader for every kind)
        data = check_snapshot(data, csv)
        data.setdefault("segments", [])
    except TraceFormatError as exc:
        raise SourceError(str(exc)) from None
    return Loaded(given, csv, "msprof", data, notes + list(more), usage)
