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
    from npumem.trace import TraceFormatError
    from npumem.trace.snapshot import from_events

    data = load_snapshot(path) if holds_snapshot(path) else from_events(read_mended(path).entries)
    try:
        format_report(build_report(data, path), 5)
    except TraceFormatError as exc:      # named by the file's data: the CLI adds the file's name
        raise TraceFormatError(path, exc.position, exc.reason) from None


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


def read_for_tune(path: str) -> None:
    """`npumem tune FILE`: every candidate setting replayed through the model, in-process."""
    from npumem.whatif.torch_replay import load_for_model
    from npumem.whatif.torch_tune import tune_recording

    tune_recording(load_for_model(path), steps=1, workers=1)


def read_for_python_replay(path: str) -> None:
    """`npumem replay --check FILE` through the Python model (the native one is the default
    where it covers the replay): its asserts are the invariants a damaged file must not reach."""
    from npumem.whatif.torch_replay import load_for_model, replay_recording

    replay_recording(load_for_model(path), check=True, native=False)


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
    # structure-aware hostile files (issue 64): each input made anew by mutate_hostile
    "hostile-report": (lambda: _pickled(snapshot_seed()), read_for_report, "hostile-pickle"),
    "hostile-replay": (lambda: _pickled(snapshot_seed()), read_for_replay, "hostile-pickle"),
    "hostile-python-replay": (lambda: _pickled(snapshot_seed()), read_for_python_replay,
                              "hostile-pickle"),
    "hostile-tune": (lambda: _pickled(snapshot_seed()), read_for_tune, "hostile-pickle"),
    "hostile-jsonl-snapshot": (jsonl_snapshot_seed, read_for_report, "hostile-jsonl-snapshot"),
    "hostile-jsonl-snapshot-replay": (jsonl_snapshot_seed, read_for_replay,
                                      "hostile-jsonl-snapshot"),
    "hostile-jsonl-report": (jsonl_seed, read_for_report, "hostile-jsonl"),
    "hostile-jsonl-replay": (jsonl_seed, read_for_replay, "hostile-jsonl"),
    "hostile-jsonl-pool": (jsonl_seed, read_for_pool_replay, "hostile-jsonl"),
    "hostile-plan": (plan_seed, read_plan, "hostile-csv"),
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
    """A mutated copy of a seed: half structure-aware, half blind; sometimes gzipped. For a
    "hostile-*" structure, a hostile file made anew (mutate_hostile), now and then with a few
    blind mutations on top."""
    if structure.startswith("hostile-"):
        data = mutate_hostile(rng, structure[len("hostile-"):])
        return mutate_bytes(rng, data) if rng.random() < 0.1 else data
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


# --- hostile snapshots and traces, structure-aware (issue 64) -------------------------------
#
# Mutations of PyTorch's snapshot shape that the value mutator above rarely reaches: addresses
# and sizes at the edges of 64 bits, segments that contradict their blocks and their trace,
# entries repeated, reordered and moved between pools, and, at the opcode level, the
# STACK_GLOBAL, memo and FRAME opcodes spliced in and strings that do not decode.

EDGE_ADDRS = [0, 512, 1 << 47, 1 << 48, (1 << 53) - 512, 1 << 62, (1 << 63) - 512, 1 << 63,
              (1 << 63) + 512, (1 << 64) - 512, (1 << 64) - 1]
EDGE_SIZES = [0, 1, 511, 512, 1 << 20, (1 << 20) + 1, 2 << 20, 20 << 20, 1 << 40, 1 << 47,
              (1 << 48) - 512, 1 << 48, 1 << 62, 1 << 63, (1 << 64) - 512, (1 << 64) - 1]
ACTIONS = ["alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "oom", "snapshot"]
BAD_STRINGS = ["\udcff", "\ud800x", "a\x00b", "\ufffe", "é" * 3, "", "x" * 300]


def _edge(rng: random.Random, values: list[int]) -> int:
    value = rng.choice(values)
    return max(0, min((1 << 64) - 1, value + rng.choice([0, 0, 0, -512, 512, 1])))


def _near(rng: random.Random, entries: list[dict]) -> int:
    """An address near one the trace already uses: inside, at or past the end of its block."""
    entry = rng.choice(entries)
    step = rng.choice([0, 512, 1 << 20, 2 << 20, 20 << 20, entry.get("size", 0)])
    return max(0, min((1 << 64) - 1, entry.get("addr", 0) + rng.choice([-1, 0, 1, 2]) * step))


def _hostile_entry(rng: random.Random, entries: list[dict], edges: float) -> dict:
    """An entry of any action at an address the trace uses (mostly) or at an edge of 64 bits,
    with a plausible size (mostly) or an edge one."""
    entry = {"action": rng.choice(ACTIONS),
             "addr": _near(rng, entries) if rng.random() >= edges else _edge(rng, EDGE_ADDRS),
             "size": rng.choice([512, 1024, 1 << 20, 2 << 20, 20 << 20, 3 << 20])
             if rng.random() >= edges else _edge(rng, EDGE_SIZES),
             "stream": rng.choice([0, 0, 0, 7, (1 << 64) - 1]), "time_us": rng.randrange(1 << 20)}
    if rng.random() < 0.2:
        entry["pool_id"] = rng.choice([(0, 0), (1, 1), (0, 5)])
    return entry


def _contradict_segment(rng: random.Random, segment: dict) -> None:
    """A segment whose numbers disagree with its blocks, or its blocks with one another."""
    blocks = segment.setdefault("blocks", [])
    kind = rng.randrange(7)
    if kind == 0:
        segment["total_size"] = _edge(rng, EDGE_SIZES)
    elif kind == 1:
        segment["address"] = _edge(rng, EDGE_ADDRS)
        for block in blocks:            # blocks moved along, so they lie inside it
            block["address"] = min((1 << 64) - 1, segment["address"] + block["address"] % 4096)
    elif kind == 2 and blocks:
        rng.choice(blocks)["size"] = _edge(rng, EDGE_SIZES)
    elif kind == 3 and blocks:          # overlapping blocks
        blocks.append(dict(rng.choice(blocks)))
    elif kind == 4 and blocks:
        rng.choice(blocks)["state"] = rng.choice(["active_allocated", "inactive",
                                                  "active_pending_free", "unmapped", "x"])
    elif kind == 5:
        segment["is_expandable"] = not segment.get("is_expandable")
        segment["segment_type"] = rng.choice(["large", "small"])
    else:
        segment["stream"] = rng.choice([1, 7, (1 << 64) - 1])
        segment["segment_pool_id"] = rng.choice([(0, 0), (1, 1), (0, 5), ((1 << 63), 0)])


def hostile_snapshot(rng: random.Random, entries: int = 60) -> dict:
    """A small snapshot whose segments and trace break the allocator's rules in ways a damaged
    or hostile file might: edge addresses and sizes, segments that contradict their blocks,
    entries repeated, shuffled, duplicated into other pools."""
    data = snapshot_seed()
    if rng.random() < 0.4:
        data["allocator_settings"] = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
        for segment in data["segments"]:
            segment["is_expandable"] = True
    trace = data["device_traces"][0]
    # how often a number is at an edge of 64 bits: in half the files never, as most such
    # files are refused at their first edge and the model's invariants lie past that
    edges = rng.choice([0, 0, 0.02, 0.1])
    for _ in range(rng.choice([0, 0, 1, 2])):     # (most contradictions are refused at once)
        _contradict_segment(rng, rng.choice(data["segments"]))
    while len(trace) < entries:
        kind = rng.random()
        if kind < 0.4:
            trace.append(_hostile_entry(rng, trace, edges))
        elif kind < 0.7:                 # a run of entries again (a loop, or a pickler gone wrong)
            at = rng.randrange(len(trace))
            trace.extend(dict(e) for e in trace[at:at + rng.randint(1, 8)])
        else:                            # an alloc and its free, mostly near other blocks
            addr = _near(rng, trace) if rng.random() >= edges else _edge(rng, EDGE_ADDRS)
            size = rng.choice([512, 1 << 20, 20 << 20]) if rng.random() >= edges else \
                _edge(rng, EDGE_SIZES)
            trace += [{"action": "alloc", "addr": addr, "size": size, "stream": 0},
                      {"action": "free_requested", "addr": addr, "size": size, "stream": 0},
                      {"action": "free_completed", "addr": addr, "size": size, "stream": 0}]
    for _ in range(rng.randint(0, 3)):   # a few entries moved
        i, j = rng.randrange(len(trace)), rng.randrange(len(trace))
        trace[i], trace[j] = trace[j], trace[i]
    if rng.random() < 0.2:
        trace[0]["frames"] = [{"filename": rng.choice(BAD_STRINGS), "line": 1,
                               "name": rng.choice(BAD_STRINGS)}]
    return data


def hostile_jsonl(rng: random.Random, events: int = 60) -> bytes:
    """npumem's JSONL events with each field, in turn, at an edge: addresses near 2**63 and
    2**64, sizes up to 2**64, times out of order, invalid strings for the action."""
    lines, live = [], []
    for i in range(events):
        if live and rng.random() < 0.45:
            addr, size = live.pop(rng.randrange(len(live)))
            event = {"t_us": i, "action": "free", "addr": addr, "size": size, "stream": 0}
        else:
            addr = _edge(rng, EDGE_ADDRS) if rng.random() < 0.5 else 4096 * i
            size = _edge(rng, EDGE_SIZES) if rng.random() < 0.5 else 512
            live.append((addr, size))
            event = {"t_us": i, "action": "alloc", "addr": addr, "size": size, "stream": 0}
        field = rng.choice(["t_us", "action", "addr", "size", "stream", None, None])
        if field == "action":
            event[field] = rng.choice(BAD_STRINGS + ["free", "alloc"])
        elif field == "t_us":
            event[field] = rng.choice([-1, 1e300, 2 ** 63, i * 1e-9])
        elif field:
            event[field] = _edge(rng, EDGE_ADDRS + EDGE_SIZES)
        lines.append(json.dumps(event))
    return ("\n".join(lines) + "\n").encode()


def hostile_plan(rng: random.Random, rows: int = 200) -> bytes:
    """A plan CSV whose sizes and times sit at the reader's caps, so that sums of them would
    pass 2**63."""
    out = [["id", "lower", "upper", "size"]]
    for i in range(rows):
        lower = rng.choice([0, i, rng.randrange(1 << 20), (1 << 48) - 2])
        upper = lower + rng.choice([1, 2, rows, 1 << 20])
        out.append([f"b{i}", lower, upper, rng.choice([1, 512, (1 << 48) - 1, 1 << 48])])
    return _csv(out)


def splice_opcodes(rng: random.Random, data: bytes) -> bytes:
    """A pickle's bytes with an opcode of PyTorch's snapshot shape spliced in at an opcode
    boundary: a STACK_GLOBAL of strings that do not decode, a memo get or put of an index far
    past the memo, a FRAME of a wrong length, a string of invalid UTF-8."""
    import pickletools

    bounds = [pos for _, _, pos in pickletools.genops(data)] or [0]
    at = rng.choice(bounds)
    text = rng.choice([b"\xed\xb3\xbf", b"\xff", b"\xc3", b"os", b"\x00", b"builtins"])
    pieces = [
        b"\x8c" + bytes([len(text)]) + text + b"\x8c\x01x\x93",               # STACK_GLOBAL
        b"\x8c" + bytes([len(text)]) + text,                                   # a bad string
        b"\x94", b"h\xff", b"j\xff\xff\xff\x7f", b"r\xff\xff\xff\x7f", b"g999999\n",  # memo
        b"\x95" + rng.choice([0, 1, 7, 1 << 40, (1 << 63) - 1]).to_bytes(8, "little"),  # FRAME
        b"X\xff\xff\xff\x7f", b"\x8d" + ((1 << 63) - 1).to_bytes(8, "little"),
        b"c" + text + b"\nx\n",
    ]
    return data[:at] + rng.choice(pieces) + data[at:]


def _as_jsonl_snapshot(data: dict) -> bytes:
    """A snapshot dict as npumem's JSONL form of one: a header line, then an entry a line."""
    from npumem.trace import jsonl
    from npumem.trace.snapshot import json_form

    header = {jsonl.SNAPSHOT_KEY: 1, **{k: v for k, v in data.items() if k != "device_traces"}}
    lines = [json.dumps(json_form._to_json(header))]
    lines += [json.dumps({"device": 0, **entry}) for entry in data["device_traces"][0]]
    return ("\n".join(lines) + "\n").encode()


def mutate_hostile(rng: random.Random, structure: str) -> bytes:
    """One hostile file of a structure: "pickle", "jsonl-snapshot", "jsonl" or "csv"."""
    if structure == "jsonl-snapshot":
        return _as_jsonl_snapshot(hostile_snapshot(rng, rng.choice([20, 60, 200])))
    if structure == "jsonl":
        return hostile_jsonl(rng, rng.choice([20, 60, 200]))
    if structure == "csv":
        return hostile_plan(rng, rng.choice([20, 200, 2000]))
    data = pickle.dumps(hostile_snapshot(rng, rng.choice([20, 60, 200])),
                        protocol=rng.choice([2, 4, 5]))
    return splice_opcodes(rng, data) if rng.random() < 0.15 else data


# --- the shapes the campaign of issue 64 found, built on purpose ---------------------------

def expandable_giant() -> dict:
    """A snapshot of expandable segments whose one mapped range is 2**47 bytes long, at an
    address near 2**62, with a recorded out-of-memory: every verb that explains the OOM
    replays it, and the model kept a list entry per 2 MiB page of that range (2**26 of them,
    gigabytes, from a 3 KB file)."""
    base, size = 1 << 62, 1 << 47
    data = snapshot_seed()
    data["allocator_settings"] = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    data["segments"] = [{
        "device": 0, "address": base, "total_size": size, "stream": 0, "segment_type": "large",
        "allocated_size": 2 << 20, "active_size": 2 << 20, "requested_size": 2 << 20,
        "is_expandable": True,
        "blocks": [{"address": base, "size": 2 << 20, "requested_size": 2 << 20,
                    "state": "active_allocated"},
                   {"address": base + (2 << 20), "size": size - (2 << 20), "state": "inactive"}]}]
    data["device_traces"] = [[
        {"action": "alloc", "addr": base + (4 << 20), "size": 2 << 20, "stream": 0},
        {"action": "free_requested", "addr": base + (4 << 20), "size": 2 << 20, "stream": 0},
        {"action": "free_completed", "addr": base + (4 << 20), "size": 2 << 20, "stream": 0},
        {"action": "oom", "addr": 0, "size": 1 << 40, "stream": 0, "device_free": 0}]]
    return data


def overlapping_segments() -> dict:
    """The seed with a trace that frees a 1 TiB segment at 0 (so one was there at the start)
    and a block inside it: two segments overlap once the trace is undone, and the model kept
    two free blocks at one address (a KeyError, or an assert in _try_merge)."""
    data = snapshot_seed()
    data["device_traces"][0][-1:-1] = [
        {"action": "alloc", "addr": 1024, "size": 20 << 20, "stream": 0},
        {"action": "free_requested", "addr": 1024, "size": 20 << 20, "stream": 0},
        {"action": "free_completed", "addr": 1024, "size": 20 << 20, "stream": 0},
        {"action": "segment_free", "addr": 0, "size": 1 << 40, "stream": 7},
        {"action": "segment_free", "addr": 1024, "size": 20 << 20, "stream": 0}]
    return data


def surrogate_pickles() -> list[bytes]:
    """Pickles that name a class with strings that have no UTF-8 form, or none at all: each must
    be refused with the name escaped, never a crash (the 12-byte segfault of issue 64 first)."""
    return [
        bytes.fromhex("80048c03edb3bf8c0178932e"),                   # a lone low surrogate
        b"\x80\x04\x8c\x03\xed\xa0\x80\x8c\x03\xed\xb3\xbf\x93.",      # both names surrogates
        b"\x80\x04\x8c\x01x\x8c\x03\xed\xa0\x80\x93.",                 # the name alone
        b"\x80\x02c\xff\xfe\n\xed\xb3\xbf\n.",                         # GLOBAL of raw bytes
        b"\x80\x04\x8c\x00\x8c\x00\x93.",                              # empty names
        b"\x80\x04\x8c\x03a\x00b\x8c\x01x\x93.",                       # a NUL inside
        b"\x80\x04X\x03\x00\x00\x00\xed\xb3\xbf\x8c\x01x\x93.",        # BINUNICODE
        b"\x80\x04\x8d\x03\x00\x00\x00\x00\x00\x00\x00\xed\xb3\xbf\x8c\x01x\x93.",  # BINUNICODE8
        b"\x80\x02V\\udcff\n\x8c\x01x\x93.",                           # UNICODE, escaped
        b"\x80\x04\x8c\x03\xed\xb3\xbf\x94\x8c\x01xh\x00\x93.",        # a memoized name
        b"\x80\x04K\x01\x8c\x01x\x93.",                                # a number as the module
    ]
