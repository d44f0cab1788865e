"""Fuzzing npumem's file readers: seed files, mutators and the reading paths the CLI takes.

A reader passes when, for any bytes, it returns or raises one of npumem's clear errors (which
the CLI prints as one line naming the file). Anything else (OverflowError, RecursionError,
KeyError, ...) is a bug. Used by tests/test_fuzz_readers.py (a few thousand inputs per reader)
and tests/fuzz_atheris.py (coverage-guided, for hours).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import pickle
import random
from typing import Callable

from npumem.errors import AclError
from npumem.planning.problem import ProblemFormatError
from npumem.trace.snapshot import SnapshotError
from npumem.trace.file_checks import TraceFormatError

CLEAR_ERRORS = (TraceFormatError, SnapshotError, ProblemFormatError, AclError)


# --- seeds: small files of every kind, as their tools write them ---------------------------

def _frames(i: int) -> list[dict]:
    return [{"filename": "train.py", "line": 10 + i, "name": "step"},
            {"filename": "torch/nn/modules/linear.py", "line": 125, "name": "forward"}]


def snapshot_seed() -> dict:
    """A two-segment snapshot with live and free blocks and a trace of every action."""
    base = 0x7F0000000000
    segments = [
        {"device": 0, "address": base, "total_size": 2 << 20, "stream": 0,
         "segment_type": "large", "allocated_size": 1 << 20, "active_size": 1 << 20,
         "requested_size": 1000000, "segment_pool_id": (0, 0), "is_expandable": False,
         "frames": _frames(0),
         "blocks": [{"address": base, "size": 1 << 20, "requested_size": 1000000,
                     "state": "active_allocated", "frames": _frames(1)},
                    {"address": base + (1 << 20), "size": 1 << 20, "state": "inactive"}]},
        {"device": 0, "address": base + (4 << 20), "total_size": 2 << 20, "stream": 0,
         "segment_type": "small", "allocated_size": 512, "active_size": 512,
         "requested_size": 500, "is_expandable": False,
         "blocks": [{"address": base + (4 << 20), "size": 512, "requested_size": 500,
                     "state": "active_allocated", "frames": _frames(2)},
                    {"address": base + (4 << 20) + 512, "size": (2 << 20) - 512,
                     "state": "inactive"}]},
    ]
    trace = [
        {"action": "segment_alloc", "addr": base, "size": 2 << 20, "stream": 0, "time_us": 10,
         "frames": _frames(3)},
        {"action": "alloc", "addr": base, "size": 1 << 20, "stream": 0, "time_us": 11,
         "frames": _frames(4)},
        {"action": "alloc", "addr": base + (1 << 20), "size": 1 << 20, "stream": 0,
         "time_us": 12, "frames": _frames(5)},
        {"action": "free_requested", "addr": base + (1 << 20), "size": 1 << 20, "stream": 0,
         "time_us": 13, "frames": _frames(6)},
        {"action": "free_completed", "addr": base + (1 << 20), "size": 1 << 20, "stream": 0,
         "time_us": 14, "frames": _frames(6)},
        {"action": "segment_alloc", "addr": base + (4 << 20), "size": 2 << 20, "stream": 0,
         "time_us": 15, "frames": []},
        {"action": "alloc", "addr": base + (4 << 20), "size": 512, "stream": 0, "time_us": 16,
         "frames": _frames(7)},
        {"action": "oom", "addr": 0, "size": 1 << 40, "stream": 0, "time_us": 17,
         "device_free": 1 << 20, "frames": _frames(8)},
    ]
    return {"segments": segments, "device_traces": [trace],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}}


def _events() -> list[tuple]:
    return [(0.0, "alloc", 4096, 1000), (1.5, "alloc", 8192, 2048), (2.0, "free", 4096, 1000),
            (3.25, "alloc", 4096, 512), (4.0, "free", 8192, 2048)]


def jsonl_seed() -> bytes:
    lines = [json.dumps({"t_us": t, "action": a, "addr": p, "size": s, "stream": 7 * (i % 2)})
             for i, (t, a, p, s) in enumerate(_events())]
    return ("\n".join(lines) + "\n").encode()


def jsonl_snapshot_seed() -> bytes:
    from npumem.trace import jsonl
    from npumem.trace.snapshot import json_form

    buffer = io.StringIO()
    header = {jsonl.SNAPSHOT_KEY: 1, **{k: v for k, v in snapshot_seed().items()
                                         if k != "device_traces"}}
    buffer.write(json.dumps(json_form._to_json(header)) + "\n")
    for entry in snapshot_seed()["device_traces"][0]:
        buffer.write(json.dumps({"device": 0, **entry}) + "\n")
    return buffer.getvalue().encode()


def chrome_seed() -> bytes:
    events, total = [], 0
    for t, action, addr, size in _events():
        signed = size if action == "alloc" else -size
        total += signed
        events.append({"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": t,
                       "args": {"Addr": addr, "Bytes": signed, "Total Allocated": total,
                                "Device Id": 0, "Device Type": 1}})
    events.append({"ph": "X", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0.5, "dur": 2})
    return json.dumps({"schemaVersion": 1, "traceEvents": events}).encode()


def chrome_steps_seed() -> bytes:
    """The Chrome seed with torch.profiler's step spans around its events."""
    data = json.loads(chrome_seed())
    data["traceEvents"] += [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}",
                             "pid": 1, "tid": 1, "ts": t, "dur": 1} for n, t in enumerate([0, 3, 6])]
    return json.dumps(data).encode()


def snapshot_steps_seed() -> dict:
    """The snapshot seed with profiler steps and npumem's marks in external_annotations."""
    data = snapshot_seed()
    times = [entry.get("time_us", 0) for entry in data["device_traces"][0]]
    data["external_annotations"] = [
        {"device": 0, "name": f"ProfilerStep#{n}", "stage": stage, "time_us": t}
        for n, t in enumerate(times[::3]) for stage in ("START", "END")] + [
        {"device": 0, "name": "npumem.memory.step", "stage": "START", "time_us": times[-1],
         "npumem_entry": len(times) - 1}]
    return data


def _csv(rows: list[list]) -> bytes:
    out = io.StringIO()
    csv.writer(out).writerows(rows)
    return out.getvalue().encode()


def rmm_seed() -> bytes:
    rows = [["Thread", "Time", "Action", "Pointer", "Size", "Stream"]]
    for t, action, addr, size in _events():
        rows.append([140234, f"10:15:02.{int(t * 1000):06d}",
                     "allocate" if action == "alloc" else "free", hex(addr), size, "0x0"])
    rows.append([140234, "10:15:03.000000", "allocate failure", "0x0", 1 << 40, "0x0"])
    return _csv(rows)


def msprof_seed() -> bytes:
    rows = [["Name", "Size(KB)", "Allocation Time(us)", "Release Time(us)",
             "Active Release Time(us)", "Duration(us)", "Active Duration(us)",
             "Allocation Total Allocated(MB)", "Allocation Total Reserved(MB)",
             "Allocation Total Active(MB)", "Release Total Allocated(MB)",
             "Release Total Reserved(MB)", "Release Total Active(MB)", "Stream Ptr",
             "Device Type"],
            ["aten::empty", "4.0", "1700000000000001.5\t", "1700000000000009.0\t", "", "7.5",
             "", "0.1", "2.0", "0.1", "0.0", "2.0", "0.0", "187651130556512", "NPU:0"],
            ["aten::mm", "1024.0", "1700000000000002.0\t", "", "", "", "", "1.1", "4.0",
             "1.1", "", "", "", "187651130556512", "NPU:0"],
            ["aten::add", "-2.0", "1700000000000003.0\t", "", "", "", "", "1.0", "4.0", "1.0",
             "", "", "", "0", "NPU:0"]]
    return _csv(rows)


def memory_record_seed() -> bytes:
    rows = [["Component", "Timestamp(us)", "Total Allocated(MB)", "Total Reserved(MB)",
             "Total Active(MB)", "Stream Ptr", "Device Type"]]
    for i in range(6):
        rows.append(["PTA", f"17000000000000{i:02d}.5\t", f"{i * 1.5:.3f}", "8.0",
                     f"{i * 1.5:.3f}", "187651130556512", "NPU:0"])
    rows.append(["APP", "1700000000000009.0", "", "16.0", "", "", "NPU:0"])
    return _csv(rows)


def plan_seed() -> bytes:
    rows = [["id", "lower", "upper", "size"], ["a", 0, 4, 1024], ["b", 1, 3, 4096],
            ["c", 2, 6, 512], ["d", 5, 8, 2048]]
    return _csv(rows)


def stats_seed() -> bytes:
    stats = {"allocated_bytes.all.current": 1 << 20, "reserved_bytes.all.current": 2 << 20,
             "allocated_bytes.all.peak": 3 << 20, "reserved_bytes.all.peak": 4 << 20,
             "allocation.all.allocated": 100, "segment.all.allocated": 3,
             "num_alloc_retries": 0, "num_ooms": 0, "inactive_split_bytes.all.current": 4096}
    return json.dumps(stats).encode()


# --- the reading paths, as the CLI takes them ----------------------------------------------

def read_for_report(path: str) -> None:
    """`npumem report FILE`: load (any trace format, or a whole snapshot) and build the report."""
    from npumem.profile import load_snapshot
    from npumem.profile.report import build_report, format_report
    from npumem.trace.formats import holds_snapshot, read_mended
    from npumem.trace.snapshot import from_events

    data = load_snapshot(path) if holds_snapshot(path) else from_events(read_mended(path).entries)
    format_report(build_report(data, path), 5)


def read_for_replay(path: str) -> None:
    """`npumem replay --check FILE`: PyTorch's allocator modelled over the recording."""
    from npumem.whatif.torch_replay import replay_file

    replay_file(path, check=True)


def read_for_pool_replay(path: str) -> None:
    """`npumem replay --allocator pool FILE`, in both modes on a small device: the native pool
    and the Python pool must say the same (an AssertionError is a crash)."""
    from npumem.whatif import pool_replay
    from npumem.whatif.sweep import ReplayJob

    def outcome(job):
        result = job.run()
        result.mean_alloc_us = None         # the one figure they do not share
        return result

    for text in ("", "expandable_segments:False,max_split_size_mb:24,"
                     "garbage_collection_threshold:0.5"):
        job = ReplayJob(path, "pool", text, memory=256 << 20)
        native = outcome(job)
        built, pool_replay._pool_replay = pool_replay._pool_replay, None
        try:
            python = outcome(job)
        finally:
            pool_replay._pool_replay = built
        assert native == python, f"{text or 'defaults'}: native {native} python {python}"


def read_with_marked_steps(path: str) -> None:
    """`npumem replay FILE --steps ProfilerStep`: the events and where steps begin."""
    from npumem.trace.formats import read_with_steps

    events, marks, _ = read_with_steps(path, "ProfilerStep")
    count = len(list(events))
    assert marks == sorted(set(marks)) and all(0 <= mark <= count for mark in marks)


def read_usage_curve(path: str) -> None:
    from npumem.trace.msprof import usage_summary
    usage_summary(path)


def read_plan(path: str) -> None:
    from npumem.planning.problem import read_problem
    read_problem(path)


def read_stats(path: str) -> None:
    from npumem.profile.torch_allocator import torch_memory_summary
    torch_memory_summary(path)


def _pickled(data: dict, protocol: int = 4) -> bytes:
    return pickle.dumps(data, protocol=protocol)


# name -> (seed bytes, reading path, structure: "json", "jsonl", "csv", "pickle")
TARGETS: dict[str, tuple[Callable[[], bytes], Callable[[str], None], str]] = {
    "jsonl": (jsonl_seed, read_for_report, "jsonl"),
    "jsonl-replay": (jsonl_seed, read_for_replay, "jsonl"),
    "jsonl-pool": (jsonl_seed, read_for_pool_replay, "jsonl"),
    "jsonl-snapshot": (jsonl_snapshot_seed, read_for_report, "jsonl"),
    "chrome": (chrome_seed, read_for_report, "json"),
    "pickle": (lambda: _pickled(snapshot_seed()), read_for_report, "pickle"),
    "pickle-replay": (lambda: _pickled(snapshot_seed()), read_for_replay, "pickle"),
    "pickle-steps": (lambda: _pickled(snapshot_steps_seed()), read_with_marked_steps, "pickle"),
    "chrome-steps": (chrome_steps_seed, read_with_marked_steps, "json"),
    "rmm": (rmm_seed, read_for_report, "csv"),
    "msprof": (msprof_seed, read_for_report, "csv"),
    "memory-record": (memory_record_seed, read_usage_curve, "csv"),
    "plan": (plan_seed, read_plan, "csv"),
    "stats": (stats_seed, read_stats, "json"),
}


# --- mutators ------------------------------------------------------------------------------

# Values that broke readers before: huge, negative, non-finite, wrong types, deep.
INTERESTING = [0, -1, -5, 1 << 31, 1 << 53, 1 << 63, 1 << 64, 1 << 70, 10 ** 400, 1e308,
               float("inf"), float("-inf"), float("nan"), 0.5, "", "x", "0x" + "f" * 20,
               None, True, [], [1], [1, 2], {}, {"a": 1}, "\udcff"]
CSV_CELLS = ["", "-1", "-5", "0", "inf", "-inf", "nan", "1e999", "9" * 400, "0x" + "f" * 20,
             "1" + "0" * 30, "abc", "1.5", " ", "\t", "18446744073709551616", "2**70"]


def _walk(value, path=()):
    yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(item, path + (key,))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _walk(item, path + (index,))


def _replace(value, path, new):
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, tuple):
        value = list(value)
    value[head] = _replace(value[head], rest, new)
    return value


def _deep(depth: int):
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def mutate_value(rng: random.Random, value):
    """Replace one node of a decoded structure with an interesting value (or a deep one)."""
    paths = [p for p, _ in _walk(value)]
    path = rng.choice(paths)
    choice = rng.random()
    new = _deep(rng.choice([100, 900])) if choice < 0.05 else rng.choice(INTERESTING)
    return _replace(value, path, new)


def _json_text(rng: random.Random, value) -> str:
    text = json.dumps(value)          # Infinity and NaN tokens too, as Python writes them
    if rng.random() < 0.05:            # deep nesting as raw text, past what json can decode
        depth = rng.choice([1000, 100000])
        return text[:-1] + ', "deep": ' + "[" * depth + "]" * depth + "}" \
            if text.endswith("}") else "[" * depth + text + "]" * depth
    return text


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    """Blind mutations: flip, insert, delete, repeat, truncate, splice a number."""
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        if not data:
            data += b"\x80"
        kind = rng.randrange(6)
        at = rng.randrange(len(data))
        if kind == 0:
            data[at] ^= 1 << rng.randrange(8)
        elif kind == 1:
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif kind == 2:
            del data[at:at + rng.randint(1, 16)]
        elif kind == 3:
            data[at:at] = data[at:at + rng.randint(1, 64)] * rng.randint(2, 8)
        elif kind == 4:
            del data[at:]
        else:
            data[at:at] = rng.choice([b"9" * 400, b"-5", b"1e999", b"NaN", b"\xff\xfe",
                                      b"\x00", b"\r\n", b'"', b",", b"\n"])
    return bytes(data)


def _mutate_jsonl(rng, data: bytes) -> bytes:
    lines = data.decode().splitlines()
    at = rng.randrange(len(lines))
    value = mutate_value(rng, json.loads(lines[at]))
    lines[at] = _json_text(rng, value)
    return ("\n".join(lines) + "\n").encode()


def _mutate_csv(rng, data: bytes) -> bytes:
    rows = list(csv.reader(io.StringIO(data.decode())))
    for _ in range(rng.randint(1, 3)):
        row = rng.choice(rows[1:] or rows)
        kind = rng.random()
        if kind < 0.7 and row:
            row[rng.randrange(len(row))] = rng.choice(CSV_CELLS)
        elif kind < 0.85 and row:
            del row[rng.randrange(len(row)):]              # a short row
        else:
            row.extend(rng.choice(CSV_CELLS) for _ in range(rng.randint(1, 4)))
    return _csv(rows)


def _mutate_pickle(rng, data: bytes) -> bytes:
    value = mutate_value(rng, pickle.loads(data))
    try:
        return pickle.dumps(value, protocol=rng.choice([2, 3, 4, 5]))
    except RecursionError:
        return data


HOSTILE_PICKLES = [
    b"\x80\x02]r\xff\xff\xff\x7f.",                       # memo index 2**31: 16 GiB of memo
    b"\x80\x02]q\x00h\x00h\x00\x86q\x01.",                # shared references
    b"\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\x7f.",     # a frame of 2**63 bytes
    b"\x80\x02" + b"(" * 100000 + b"l" * 100000 + b".",   # 100k nested lists
    b"\x80\x02]" + b"(" * 3 + b".",                       # an unclosed mark
    b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00trueq\x00\x85R.",   # calls os.system
    b"\x80\x05\x8e\xff\xff\xff\xff\xff\xff\xff\x7f.",     # bytes of 2**63
]


def mutate(rng: random.Random, data: bytes, structure: str) -> bytes:
    """A mutated copy of a seed: half structure-aware, half blind; sometimes gzipped."""
    try:
        if rng.random() < 0.5:
            if structure == "json":
                data = _json_text(rng, mutate_value(rng, json.loads(data))).encode()
            elif structure == "jsonl":
                data = _mutate_jsonl(rng, data)
            elif structure == "csv":
                data = _mutate_csv(rng, data)
            elif rng.random() < 0.2:
                data = rng.choice(HOSTILE_PICKLES)
            else:
                data = _mutate_pickle(rng, data)
        else:
            data = mutate_bytes(rng, data)
    except (ValueError, UnicodeDecodeError, pickle.UnpicklingError, EOFError):
        data = mutate_bytes(rng, data)
    if rng.random() < 0.05:
        data = gzip.compress(data, compresslevel=1)
        damage = rng.random()
        if damage < 0.3:
            data = data[:rng.randrange(len(data))]            # a truncated gzip stream
        elif damage < 0.6:
            data = data[:10] + mutate_bytes(rng, data[10:])   # a corrupt deflate stream
    return data


class ReaderCrash(AssertionError):
    """A reader raised something other than a clear error."""


def check_one(read: Callable[[str], None], path: str, data: bytes) -> None:
    """Write `data` to `path` and read it; ReaderCrash on anything but a clear error."""
    with open(path, "wb") as out:
        out.write(data)
    try:
        read(path)
    except CLEAR_ERRORS as exc:
        if path not in str(exc) and "stats dict" not in str(exc):
            raise ReaderCrash(f"the error does not name the file: {exc}") from exc
    except Exception as exc:        # noqa: BLE001 - any other exception is the bug we look for
        raise ReaderCrash(f"{type(exc).__name__}: {exc}"[:500]) from exc
