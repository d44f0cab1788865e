"""The native model of PyTorch's allocator (alloc/torch_model/_native.c) against its oracle, the
Python model: random request streams under random settings and limits must make the same
segment events, put every block at the same address, and leave the same pools; replays of real
recordings must say the same, with and without --check."""

from __future__ import annotations

import glob
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from npumem.alloc.torch_model import (DEFAULT_POOL, DeviceMemory, TorchAllocatorModel,
                                      parse_config)
from npumem.trace.snapshot.columns import ACTION_CODE
from npumem.whatif import replay_cores
from npumem.whatif.replay_cores import NativeCore, PythonCore
from npumem.whatif.torch_replay import load_for_model, replay_recording

pytestmark = pytest.mark.skipif(replay_cores._native is None, reason="the native model is not built")

MiB = 1 << 20
KINDS = replay_cores.kinds("free_completed")
FRESH = 1 << 44
DATA = Path(__file__).parent / "data"

# the edges of the rules: a remainder of 512 bytes or of 1 MiB, requests of max_split_size (40,
# 80, 100 MiB here) and of a large segment
EDGES = [512, MiB - 512, MiB, MiB + 1, 3 * MiB, 10 * MiB, 19 * MiB, 20 * MiB, 20 * MiB + 1,
         40 * MiB, 80 * MiB, 100 * MiB]


def _size(rng: random.Random) -> int:
    pick = rng.random()
    if pick < 0.35:
        return rng.randint(1, 8192)
    if pick < 0.6:
        return rng.randint(1, 2 * MiB)
    if pick < 0.85:
        return rng.randint(MiB, 96 * MiB)
    return rng.choice(EDGES)


PRIVATE = [(1, 0), (2, 0), (0, 1)]          # two graph pools and a MemPool


def _ops(seed: int, count: int = 300, private: bool = False) -> list[tuple]:
    """A request stream: mostly allocs and frees, now and then the rarer calls; with `private`,
    requests (and the rare calls) routed to private pools, during captures or not, and pools
    released and emptied. Each op: (name, value, stream, pool, capturing)."""
    rng = random.Random(seed)
    ops = []
    for _ in range(count):
        pick = rng.random()
        route = (DEFAULT_POOL, False)
        if private and rng.random() < 0.4:
            route = (rng.choice(PRIVATE + [DEFAULT_POOL]), rng.random() < 0.5)
        if pick < 0.47:
            ops.append(("alloc", _size(rng), rng.choice([0, 0, 0, 1, 2]), *route))
        elif pick < 0.9:
            ops.append(("free", rng.randrange(1000), 0, *route))
        elif private and pick < 0.93:
            ops.append(("release_fully", 0, 0, rng.choice(PRIVATE), False))
        else:
            ops.append((rng.choice(["empty_cache", "oom", "would_reuse", "oversize", "collected"]),
                        _size(rng), rng.choice([0, 1]), *route))
    return ops


OPS = st.integers(0, 2 ** 32).map(_ops)
PRIVATE_OPS = st.integers(0, 2 ** 32).map(lambda seed: _ops(seed, private=True))
SETTINGS = st.sampled_from([
    "", "max_split_size_mb:40", "expandable_segments:True",
    "expandable_segments:True,max_split_size_mb:40,roundup_power2_divisions:4",
    "garbage_collection_threshold:0.6,per_process_memory_fraction:0.5",
    "garbage_collection_threshold:0.3,expandable_segments:True,per_process_memory_fraction:0.8", "max_split_size_mb:20,max_non_split_rounding_mb:24",
    "roundup_power2_divisions:4", "roundup_power2_divisions:[256:1,512:8,>:2]",
    "large_segment_size_mb:64,max_split_size_mb:80", "per_process_memory_fraction:0.5"])
NPU_SETTINGS = st.sampled_from(["", "page_size:1g", "max_split_size_mb:40",
                                "garbage_collection_threshold:0.5",
                                "expandable_segments:True", "expandable_segments:True,page_size:1g",
                                "expandable_segments:True,base_addr_aligned_kb:4",
                                "large_segment_size_mb:32"])


def _pair(config, capacity, allowed, expected):
    device = DeviceMemory(capacity, fresh_base=FRESH)
    for addr, size in expected:
        device.expect("malloc", addr, size)
    model = TorchAllocatorModel(config, device, allowed)
    python = PythonCore(model, {}, 0, {}, set())
    native = NativeCore(config, capacity, model.allowed, FRESH, expected, [], 0)
    return python, native


def _one(code: int, addr: int, size: int, stream: int):
    return (np.array([code], np.uint8), np.array([addr], np.uint64), np.array([size], np.uint64),
            np.array([stream], np.uint64))


def _python_blocks(model: TorchAllocatorModel) -> list[tuple]:
    return sorted((b.addr, b.size, b.requested if b.allocated else 0, b.allocated, b.stream,
                   b.pool.small, None if b.prev is None else b.prev.addr, b.mapped,
                   DEFAULT_POOL if b.pool.owner is None else b.pool.owner.id)
                  for b in model._all_blocks())


def _native_blocks(native: NativeCore) -> list[tuple]:
    ids = native.model.ids
    return sorted((a, s, r if alloc else 0, alloc, stream, small, prev, mapped, ids[slot])
                  for a, s, r, alloc, stream, small, prev, mapped, slot in native.model.blocks())


def _same_state(python: PythonCore, native: NativeCore) -> None:
    assert [(e.action, e.addr, e.size, e.stream, e.pool) for e in python.new_events()] == \
        [(e.action, e.addr, e.size, e.stream, e.pool) for e in native.new_events()]
    assert python.counts() == native.counts()
    for pool_id, slot in native.model.slots.items():       # each pool's uses and bytes
        private = python.model.pools.get(pool_id)
        if pool_id != DEFAULT_POOL:
            assert native.model.pool(slot) == (
                None if private is None else (private.use_count, private.reserved))


def _play(python: PythonCore, native: NativeCore, ops) -> None:
    live: list[int] = []
    for number, (op, value, stream, pool, capturing) in enumerate(ops):
        if op == "release_fully":
            python.model.release_fully(pool)
            native.model.release_fully(pool)
        else:
            with python.model.routed(pool, capturing), native.model.routed(pool, capturing):
                _call(python, native, live, number, op, value, stream)
        _same_state(python, native)
    assert _python_blocks(python.model) == _native_blocks(native)
    pools = []
    for pool_id in native.model.ids:            # the native model's slots, in order
        private = python.model.pools.get(pool_id)
        pools += ([python.model.small, python.model.large] if pool_id == DEFAULT_POOL else
                  [private.small, private.large] if private else [None, None])
    assert native.model.free_keys() == (
        [(number, *key) for number, pool in enumerate(pools) if pool for key in pool.keys],
        [(number, *key) for number, pool in enumerate(pools) if pool
         for key in pool.unmapped_keys])
    assert python.model.device.used == native.model.stats()["used"]


def _call(python: PythonCore, native: NativeCore, live: list[int], number: int, op: str,
          value: int, stream: int) -> None:
    """One call of the stream on both models, as a replay makes it."""
    if op == "alloc":
        addr = 0x1000 + number                     # the recorded address: any will do
        args = (KINDS, *_one(ACTION_CODE["alloc"], addr, value, stream), 0, 1, False)
        got = python.run(*args), native.run(*args)
        assert got[0] == got[1]
        if got[0][1] == replay_cores.OUT_OF_MEMORY:
            p, n = python.oom_error(), native.oom_error()
            assert (str(p), p.request, p.alloc_size, p.free, p.reserved, p.allocated,
                    p.largest_free) == (str(n), n.request, n.alloc_size, n.free, n.reserved,
                                        n.allocated, n.largest_free)
        else:
            live.append(addr)
    elif op == "free" and live:
        addr = live.pop(value % len(live))
        args = (KINDS, *_one(ACTION_CODE["free_completed"], addr, 0, 0), 0, 1, False)
        assert python.run(*args) == native.run(*args)
    elif op == "empty_cache":
        python.model.empty_cache()
        native.model.empty_cache()
    elif op == "oom":
        assert python.oom_request(0, value, stream) == native.oom_request(0, value, stream)
    elif op == "would_reuse":
        assert python.model.would_reuse(value, stream) == native.model.would_reuse(value, stream)
    elif op == "collected":
        assert python.model.collected(value, stream) == native.model.collected(value, stream)
    elif op == "oversize":
        dry = bool(stream)
        assert python.model.oversize_release(value, 0, dry_run=dry) == \
            native.model.oversize_release(value, 0, dry_run=dry)


@settings(max_examples=200, deadline=None)
@given(OPS, SETTINGS, st.sampled_from([None, 64 * MiB, 200 * MiB, 1 << 30]),
       st.lists(st.tuples(st.integers(1, 64).map(lambda n: n * 2 * MiB),
                          st.sampled_from([2 * MiB, 20 * MiB, 22 * MiB])), max_size=6))
def test_random_streams_make_the_same_decisions(ops, text, capacity, expected):
    python, native = _pair(parse_config(text), capacity, None, expected)
    _play(python, native, ops)


@settings(max_examples=80, deadline=None)
@given(OPS, NPU_SETTINGS, st.sampled_from([None, 96 * MiB]),
       st.sampled_from([None, 40 * MiB, 100 * MiB]))
def test_npu_flavour_and_memory_fractions(ops, text, capacity, allowed):
    python, native = _pair(parse_config(text, "npu"), capacity, allowed, [])
    _play(python, native, ops)


@settings(max_examples=200, deadline=None)
@given(PRIVATE_OPS, SETTINGS, st.sampled_from([None, 96 * MiB, 1 << 30]))
def test_private_pools_make_the_same_decisions(ops, text, capacity):
    """Requests routed to graph pools and MemPools, during captures or not (the retry then
    spares every pool), pools released in an order of the recording's and emptied."""
    python, native = _pair(parse_config(text), capacity, None, [])
    _play(python, native, ops)


def test_the_native_model_refuses_what_it_does_not_model():
    columns = SimpleNamespace(addr=np.zeros(1, np.uint64), size=np.zeros(1, np.uint64),
                              stream=np.zeros(1, np.uint64))
    covers = replay_cores.native_covers
    assert covers(parse_config(""), None, columns, FRESH, None) == ""
    assert covers(parse_config("expandable_segments:True"), None, columns, FRESH, None) == ""
    assert covers(parse_config("garbage_collection_threshold:0.5"), 1 << 30, columns, FRESH,
                  None) == ""
    huge = SimpleNamespace(addr=columns.addr, stream=columns.stream,
                           size=np.array([1 << 63], np.uint64))
    assert covers(parse_config(""), None, huge, FRESH, None) == "numbers past 2**62"


def test_bad_columns_are_refused_and_the_model_stays_usable():
    _, native = _pair(parse_config(""), None, None, [])
    action, addr, size, stream = _one(ACTION_CODE["alloc"], 0x1000, 4096, 0)
    with pytest.raises(ValueError, match="column addr holds 4 bytes, not 8"):
        native.run(KINDS, action, addr.astype(np.uint32), size, stream, 0, 1, False)
    with pytest.raises(IndexError, match="entries 0:2 of 1"):
        native.run(KINDS, action, addr, size, stream, 0, 2, False)
    assert native.run(KINDS, action, addr, size, stream, 0, 1, False) == (1, replay_cores.DONE)
    assert native.counts().allocated == 4096


def _recordings():
    found = sorted(glob.glob(str(DATA / "**" / "*.pickle*"), recursive=True))
    return found[::7]                  # a spread of them: every one is in docs/benchmarks.md


@pytest.mark.parametrize("path", _recordings(), ids=lambda p: Path(p).name)
@pytest.mark.parametrize("text", ["", "max_split_size_mb:60,roundup_power2_divisions:2"])
def test_replays_of_real_recordings_say_the_same(path, text):
    recording = load_for_model(path)
    config = parse_config(text, base=recording.base_config()) if text else recording.base_config()
    for check in (False, True):
        python = replay_recording(recording, config, check=check, native=False).as_dict()
        native = replay_recording(recording, config, check=check, native=True).as_dict()
        python.pop("seconds"), native.pop("seconds")
        assert native == python


def test_progress_is_said_however_often_the_replay_stops_at_segment_events(monkeypatch):
    """It was said only after a whole stretch with no segment event: a trace with them more
    often than that (or --check, which stops at each alloc that makes one) said nothing."""
    from npumem.whatif import torch_replay
    monkeypatch.setattr(torch_replay, "CHUNK", 64)
    path = sorted(DATA.glob("cuda_snapshots/*.pickle.gz"))[0]
    recording = load_for_model(str(path))
    said = []
    replay_recording(recording, check=True, progress=said.append)
    assert len(recording.entries) > 128 and len(said) >= len(recording.entries) // 128
    assert said == sorted(said) and said[-1] < len(recording.entries)
