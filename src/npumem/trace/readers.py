"""Readers: npumem JSONL and PyTorch Chrome-trace `[memory]` events, gzip or not, auto-detected.

npumem JSONL (one object per line, in time order):
    {"t_us": 12.5, "action": "alloc"|"free", "addr": 94205676378496, "size": 1048576, "stream": 0}
Chrome trace (torch.profiler with profile_memory=True): instant events named "[memory]" whose
args carry "Addr" and "Bytes" (negative on free); they are sorted by timestamp.
"""

from __future__ import annotations

import gzip
import io
import json
import os
from typing import Iterator

from .events import TraceEvent, TraceFormatError


def _open_text(path: str):
    with open(path, "rb") as probe:
        magic = probe.read(2)
    if magic == b"\x1f\x8b":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


def detect_format(path: str) -> str:
    """'jsonl' or 'chrome', from the first bytes of the file."""
    try:
        with _open_text(path) as handle:
            head = handle.read(4096)
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise TraceFormatError(path, "0", f"cannot read the file: {exc}") from None
    stripped = head.lstrip()
    if not stripped:
        raise TraceFormatError(path, "1", "the file is empty")
    if stripped.startswith("{") and ('"traceEvents"' in head or '"schemaVersion"' in head):
        return "chrome"
    if stripped.startswith("["):
        return "chrome"
    return "jsonl"


def read_trace(path: str | os.PathLike) -> Iterator[TraceEvent]:
    """The events of a trace file, in time order."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise TraceFormatError(path, "0", "no such file")
    if detect_format(path) == "chrome":
        return iter(_read_chrome(path))
    return _read_jsonl(path)


def _read_jsonl(path: str) -> Iterator[TraceEvent]:
    try:
        with _open_text(path) as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                yield _jsonl_event(path, number, line)
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise TraceFormatError(path, "end", f"the file is truncated or corrupt: {exc}") from None


def _jsonl_event(path: str, number: int, line: str) -> TraceEvent:
    where = f"{number}"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(path, where, f"not JSON ({exc.msg})") from None
    if not isinstance(record, dict):
        raise TraceFormatError(path, where, "expected a JSON object per line")
    action = record.get("action")
    if action not in ("alloc", "free"):
        raise TraceFormatError(path, where, f"action must be 'alloc' or 'free', got {action!r}")
    for key in ("addr", "size"):
        value = record.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise TraceFormatError(path, where, f"{key} must be a non-negative integer, got {value!r}")
    t_us = record.get("t_us", 0.0)
    stream = record.get("stream", 0)
    if not isinstance(t_us, (int, float)) or not isinstance(stream, int):
        raise TraceFormatError(path, where, "t_us must be a number and stream an integer")
    return TraceEvent(float(t_us), action, record["addr"], record["size"], stream)


def _read_chrome(path: str) -> list[TraceEvent]:
    try:
        with _open_text(path) as handle:
            document = json.load(handle)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(path, f"{exc.lineno}:{exc.colno}", f"not valid JSON ({exc.msg})") from None
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise TraceFormatError(path, "end", f"the file is truncated or corrupt: {exc}") from None
    events = document.get("traceEvents") if isinstance(document, dict) else document
    if not isinstance(events, list):
        raise TraceFormatError(path, "traceEvents", "no traceEvents list")
    out = []
    for index, event in enumerate(events):
        if not isinstance(event, dict) or event.get("name") != "[memory]":
            continue
        args = event.get("args") or {}
        nbytes, addr = args.get("Bytes"), args.get("Addr")
        if not isinstance(nbytes, int) or not isinstance(addr, int):
            raise TraceFormatError(path, f"traceEvents[{index}]", "[memory] event without integer "
                                   "args.Bytes and args.Addr")
        action = "alloc" if nbytes >= 0 else "free"
        out.append(TraceEvent(float(event.get("ts", 0.0)), action, addr, abs(nbytes), 0))
    if not out:
        raise TraceFormatError(path, "traceEvents", "no [memory] events; record the trace with "
                               "torch.profiler.profile(profile_memory=True)")
    out.sort(key=lambda e: e.t_us)
    return out
