"""A whole memory snapshot as JSONL, losslessly (the form jsonl.py's doc describes): a header
line with every top-level key but the trace, then each trace entry with its device, shared
stacks written once."""

from __future__ import annotations

import json

from ..file_checks import TraceFormatError, shown
from ..jsonl import SNAPSHOT_KEY, STACK_KEY
from ..textio import decode_json, open_for_writing, reading
from . import columns

_TUPLE = "__tuple__"          # JSON has only lists: tuples (segment_pool_id) are marked


def _to_json(value):
    if isinstance(value, tuple):
        return {_TUPLE: [_to_json(item) for item in value]}
    if isinstance(value, list):
        return [_to_json(item) for item in value]
    if isinstance(value, dict):
        return {key: _to_json(item) for key, item in value.items()}
    return value


def _from_json(value):
    if isinstance(value, list):
        return [_from_json(item) for item in value]
    if isinstance(value, dict):
        if len(value) == 1 and isinstance(value.get(_TUPLE), list):
            return tuple(_from_json(item) for item in value[_TUPLE])
        return {key: _from_json(item) for key, item in value.items()}
    return value


def write_snapshot(data: dict, path: str) -> int:
    """The whole snapshot dict `data` as JSONL; returns the number of trace entries."""
    header = {SNAPSHOT_KEY: 1, **{key: value for key, value in data.items()
                                  if key != "device_traces"}}
    count = 0
    stacks: dict[int, tuple[list, int]] = {}     # id(frames) -> (frames, its number)
    try:
        with open_for_writing(path) as out:
            out.write(json.dumps(_to_json(header), separators=(",", ":")) + "\n")
            for device, entries in enumerate(data.get("device_traces") or []):
                for entry in entries:
                    frames = entry.get("frames")
                    if isinstance(frames, list) and frames:
                        known = stacks.get(id(frames))
                        if known is None:
                            known = stacks[id(frames)] = (frames, len(stacks))
                            out.write(json.dumps({STACK_KEY: known[1], "frames": _to_json(
                                frames)}, separators=(",", ":")) + "\n")
                        entry = {**entry, "frames": {STACK_KEY: known[1]}}
                    out.write(json.dumps(_to_json({"device": device, **entry}),
                                         separators=(",", ":")) + "\n")
                    count += 1
    except RecursionError:
        raise TraceFormatError(path, "", "the snapshot nests too deeply to write") from None
    except (TypeError, ValueError) as exc:
        raise TraceFormatError(path, "", f"the snapshot holds something JSON cannot: {exc}") from None
    return count


def _decoded(path: str, where: str, line: str):
    try:
        return _from_json(decode_json(path, where, line))
    except RecursionError:
        raise TraceFormatError(path, where, "JSON nested too deeply to read") from None


def read_snapshot(path: str) -> dict:
    """The snapshot dict a JSONL file written by `write_snapshot` holds, its device traces read
    into columns a line at a time."""
    with reading(path) as handle:
        lines = (line for line in handle if line.strip())
        first = next(lines, None)
        if first is None:
            raise TraceFormatError(path, "1", "no snapshot header: the file is empty")
        header = _decoded(path, "1", first)
        if not isinstance(header, dict) or header.pop(SNAPSHOT_KEY, None) != 1:
            raise TraceFormatError(path, "1", f"the first line must be {{\"{SNAPSHOT_KEY}\": 1, ...}}")
        at = [1]                          # the line of the entry the reader has
        try:
            traces = columns.from_entry_stream(_entries(path, lines, at), shown)
        except columns.EntryError as exc:      # (that entry's: the reader takes one at a time)
            raise TraceFormatError(path, str(at[0]), f"{exc.where}: {exc.reason}") from None
    return {**header, "device_traces": traces}


def _entries(path: str, lines, at: list[int]):
    """(device, entry) of each line after the header, its stack reference resolved; at[0] is
    the line of the last one given."""
    stacks: dict[int, list] = {}
    for number, line in enumerate(lines, 2):
        at[0] = number
        entry = _decoded(path, str(number), line)
        if not isinstance(entry, dict):
            raise TraceFormatError(path, str(number), f"a trace entry must be an object, got "
                                   f"{shown(entry)}")
        if STACK_KEY in entry:
            stacks[entry[STACK_KEY]] = entry.get("frames")
            continue
        frames = entry.get("frames")
        if isinstance(frames, dict) and STACK_KEY in frames:
            if frames[STACK_KEY] not in stacks:
                raise TraceFormatError(path, str(number), f"frames refer to stack "
                                       f"{shown(frames[STACK_KEY])}, which no line before "
                                       "defines")
            entry["frames"] = stacks[frames[STACK_KEY]]
        device = entry.pop("device", 0)
        if type(device) is not int or not 0 <= device < 1024:
            raise TraceFormatError(path, str(number), f"a trace entry's device must be a whole "
                                   f"number from 0 to 1023, got {shown(device)}")
        yield device, entry
