"""Private memory pools (CUDA graph captures, torch.cuda.MemPool) in the model of PyTorch's
caching allocator, and replays of recordings that use them: the pool rules of c10's
CUDACachingAllocator.cpp, and `--check` matching what was recorded."""

from __future__ import annotations

import pickle

import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

from npumem.alloc.torch_model import (DEFAULT_POOL, DeviceMemory, ModelOutOfMemory,
                                      TorchAllocatorModel, parse_config)
from npumem.cli import main
from npumem.trace.snapshot import recording_from_data
from npumem.whatif.torch_replay import load_for_model, replay_recording

from .torch_recorder import record

MiB = 1 << 20
GRAPH, SHARED, MEMPOOL = (1, 0), (2, 0), (0, 1)       # graph_pool_handle ids, a MemPool's id


def actions(model, start=0):
    return [(e.action, e.size // MiB, e.pool) for e in model.stats.events[start:]]


def test_a_capture_is_served_from_its_own_pools():
    model = TorchAllocatorModel()
    cached = {}
    for stream in (0, 7):
        block = model.malloc(3 * MiB, stream)
        cached[stream] = block.addr
        model.free(block)                               # cached default 20 MiB segments
    model.begin_allocate_to_pool(GRAPH, streams=[0])
    inside = model.malloc(3 * MiB)
    small = model.malloc(1000)
    beside = model.malloc(3 * MiB, stream=7)            # a stream the capture does not take
    model.end_allocate_to_pool(GRAPH)
    assert inside.addr != cached[0] and beside.addr == cached[7]
    assert inside.pool is model.pools[GRAPH].large and small.pool is model.pools[GRAPH].small
    model.free(inside)
    after = model.malloc(3 * MiB)                       # not the graph's cached block
    assert after.addr == cached[0]
    assert actions(model) == [("segment_alloc", 20, DEFAULT_POOL)] * 2 + [
        ("segment_alloc", 20, GRAPH), ("segment_alloc", 2, GRAPH)]


def test_a_pool_keeps_its_segments_until_it_is_released():
    model = TorchAllocatorModel()
    model.begin_allocate_to_pool(GRAPH)
    kept, split = model.malloc(30 * MiB), model.malloc(3 * MiB)
    model.end_allocate_to_pool(GRAPH)
    model.free(kept)
    model.empty_cache()
    assert model.stats.reserved == 50 * MiB             # the graph still uses its pool
    model.release_pool(GRAPH)                           # the graph is reset: use_count 0
    assert model.stats.reserved == 50 * MiB             # nothing freed until a release
    model.empty_cache()
    assert actions(model, 2) == [("segment_free", 30, GRAPH)]
    model.free(split)                                   # its last block comes back
    model.empty_cache()
    assert model.stats.reserved == 0 and GRAPH not in model.pools   # then c10 forgets the pool


def test_a_shared_pool_counts_its_users():
    model = TorchAllocatorModel()
    for _ in range(2):                                  # two graphs captured into one pool
        model.begin_allocate_to_pool(SHARED)
        model.free(model.malloc(30 * MiB))
        model.end_allocate_to_pool(SHARED)
    assert model.pools[SHARED].use_count == 2 and model.stats.num_device_alloc == 1
    model.release_pool(SHARED)
    model.empty_cache()
    assert model.stats.reserved == 30 * MiB
    model.release_pool(SHARED)
    model.empty_cache()
    assert model.stats.reserved == 0
    with pytest.raises(ValueError, match="already allocating"):
        model.begin_allocate_to_pool(GRAPH)
        model.begin_allocate_to_pool(GRAPH)


def test_the_out_of_memory_retry_spares_pools_in_use_and_skips_during_a_capture():
    model = TorchAllocatorModel(device=DeviceMemory(64 * MiB))
    model.begin_allocate_to_pool(GRAPH)
    model.free(model.malloc(30 * MiB))                  # cached in the graph's pool
    model.end_allocate_to_pool(GRAPH)
    model.free(model.malloc(20 * MiB))                  # cached in the default pool
    with pytest.raises(ModelOutOfMemory):
        model.malloc(40 * MiB)                          # the retry frees the default 20 only
    assert actions(model, 2) == [("segment_free", 20, DEFAULT_POOL), ("oom", 40, DEFAULT_POOL)]
    model.begin_allocate_to_pool(GRAPH)
    with pytest.raises(ModelOutOfMemory):
        model.malloc(40 * MiB)                          # capturing: no release at all
    assert actions(model, 4) == [("oom", 40, GRAPH)]


def test_a_mempool_deleted_frees_its_own_segments_only():
    model = TorchAllocatorModel()
    model.create_pool(MEMPOOL)                          # torch.cuda.MemPool()
    model.free(model.malloc(30 * MiB))                  # cached in the default pool
    model.begin_allocate_to_pool(MEMPOOL)               # with use_mem_pool(pool): every stream
    block = model.malloc(3 * MiB, stream=5)
    model.end_allocate_to_pool(MEMPOOL)
    model.release_pool(MEMPOOL)
    model.free(block)
    model.empty_cache(MEMPOOL)                          # the MemPool still lives: nothing
    assert model.stats.num_device_free == 0
    model.release_pool(MEMPOOL)                         # ~MemPool: releasePool, emptyCache(id)
    model.empty_cache(MEMPOOL)
    assert actions(model, 2) == [("segment_free", 20, MEMPOOL)]
    assert model.stats.reserved == 30 * MiB


def test_expandable_segments_in_a_private_pool():
    model = TorchAllocatorModel(parse_config("expandable_segments:True"))
    outside = model.malloc(30 * MiB)
    model.begin_allocate_to_pool(GRAPH)
    inside = model.malloc(30 * MiB)                     # its own address range
    model.end_allocate_to_pool(GRAPH)
    assert inside.segment is not outside.segment
    model.free(outside), model.free(inside)
    model.empty_cache()
    assert actions(model) == [("segment_map", 40, DEFAULT_POOL), ("segment_map", 40, GRAPH),
                              ("segment_unmap", 40, DEFAULT_POOL)]
    model.release_pool(GRAPH)
    model.empty_cache()
    assert model.stats.reserved == 0 and not model.expandable


def test_segments_name_their_pool():
    model = TorchAllocatorModel()
    model.malloc(1000)
    model.begin_allocate_to_pool(GRAPH)
    model.malloc(1000)
    assert [s["segment_pool_id"] for s in model.segment_list()] == [DEFAULT_POOL, GRAPH]


# --- replays ----------------------------------------------------------------------------------

# torch.cuda.graph: a warm-up on the default pools, empty_cache() on entering, a capture on
# stream 0 while stream 9 allocates as usual; the graph lives on to the dump.
CAPTURE = [("alloc", "w", 50 * MiB), ("alloc", "a", 3000), ("free", "a"), ("alloc", "b", 8 * MiB),
           ("free", "b"), ("empty_cache",), ("pool_begin", GRAPH, [0]),
           ("alloc", "x1", 4000), ("alloc", "x2", 6 * MiB), ("alloc", "y", 2000, 9),
           ("free", "x1"), ("alloc", "x3", 3000), ("alloc", "x4", 30 * MiB), ("free", "x4"),
           ("pool_end", GRAPH), ("alloc", "d1", 6 * MiB), ("alloc", "d2", 3000), ("free", "d1"),
           ("empty_cache",), ("alloc", "d3", 3000), ("free", "y"), ("alloc", "d4", 12 * MiB)]
# the graph reset, its pool freed at the next empty_cache()
RESET = CAPTURE + [("pool_release", GRAPH), ("free", "x2"), ("free", "x3"), ("empty_cache",),
                   ("alloc", "d5", 100)]
# torch.cuda.MemPool with use_mem_pool, then deleted
MEMPOOL_USE = [("pool_create", MEMPOOL), ("alloc", "a", 3 * MiB), ("pool_begin", MEMPOOL),
               ("alloc", "m1", 3000), ("alloc", "m2", 12 * MiB), ("free", "m1"),
               ("pool_end", MEMPOOL), ("pool_release", MEMPOOL), ("free", "a"),
               ("alloc", "b", 3000), ("free", "m2"), ("pool_release", MEMPOOL),
               ("empty_cache", MEMPOOL), ("alloc", "c", 5000)]


def replay(tmp_path, snapshot):
    """The replay through the native model, which says what its oracle, the Python model,
    says of it."""
    path = tmp_path / "pools.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    recording = load_for_model(str(path))
    native, python = (replay_recording(recording, recording.base_config(), check=True,
                                       native=native)
                      for native in (True, False))
    assert {**native.as_dict(), "seconds": 0} == {**python.as_dict(), "seconds": 0}
    assert not any("name another pool" in note for note in native.notes)   # (all agree)
    return native


@pytest.mark.parametrize("settings_text", ["", "expandable_segments:True"])
@pytest.mark.parametrize("keep", [None, 24, 9])
@pytest.mark.parametrize("steps, entry_ids", [(CAPTURE, False), (CAPTURE, True), (RESET, True),
                                              (MEMPOOL_USE, False), (MEMPOOL_USE, True)],
                         ids=["capture", "capture-ids", "reset-ids", "mempool", "mempool-ids"])
def test_recordings_with_private_pools_replay_exactly(tmp_path, steps, entry_ids, keep,
                                                      settings_text):
    result = replay(tmp_path, record(steps, settings_text, keep=keep, entry_pool_ids=entry_ids))
    assert result.divergence is None, result.divergence.describe()
    assert result.faithful
    if not settings_text:
        assert result.misplaced_blocks == 0


def test_the_start_state_keeps_each_segments_pool():
    snapshot = record(CAPTURE, keep=12)
    start = recording_from_data(snapshot).start_state()
    assert {segment.pool for segment in start.segments} == {DEFAULT_POOL, GRAPH}
    assert {s["segment_pool_id"] for s in snapshot["segments"]} == {DEFAULT_POOL, GRAPH}


@pytest.mark.parametrize("steps", [CAPTURE, MEMPOOL_USE], ids=["capture", "mempool"])
def test_pools_are_inferred_where_entries_do_not_name_them(steps):
    """Entries before the newest PyTorch carry no pool_id: the dump's segments, the requests
    around each one and what releases kept say which pool served it."""
    truth = record(steps, entry_pool_ids=True)["device_traces"][0]
    pools = recording_from_data(record(steps)).start_state().pools     # private pools only
    named = {index: entry["pool_id"] for index, entry in enumerate(truth)
             if entry["action"] in ("alloc", "free_completed", "segment_alloc", "segment_free",
                                    "oom") and entry.get("pool_id") not in (None, DEFAULT_POOL)}
    inferred = {index: pool if pool[0] != -1 else MEMPOOL for index, pool in pools.items()}
    assert named and inferred == named          # (a pool no entry names gets an id of its own)


@pytest.mark.parametrize("keep", [4, 5])
def test_an_expandable_segment_mapped_below_its_start_pages(tmp_path, keep):
    """The trace maps pages below those mapped at its first entry (empty_cache unmapped them
    before): the start state reaches down to them, as c10 maps the lowest room first."""
    steps = [("alloc", "a", 33 * MiB, 9), ("alloc", "b", MiB + 1, 9), ("free", "a"),
             ("empty_cache",), ("alloc", "c", 3 * MiB, 9), ("alloc", "d", 11 * MiB, 9),
             ("alloc", "e", 11 * MiB, 9)]
    result = replay(tmp_path, record(steps, "expandable_segments:True", keep=keep))
    assert result.faithful, result.divergence


def test_check_cli_matches_a_capture(tmp_path):
    path = tmp_path / "graph.pickle"
    path.write_bytes(pickle.dumps(record(CAPTURE, keep=20)))
    result = CliRunner().invoke(main, ["replay", "--check", str(path)])
    assert result.exit_code == 0 and "MATCH" in result.output, result.output


@st.composite
def pool_workloads(draw, releases: bool, stream_captures: bool = True):
    """What a program may do: requests on two streams, graph captures (into new or shared
    pools) of one stream (the captured region allocates first and last) or, without
    `stream_captures`, of all, use_mem_pool on a MemPool; with `releases`, graph resets and
    MemPools deleted."""
    steps, live, users = [], [], {}           # users: pool -> use_count
    current, captured, mempools = None, None, set()
    for key in range(draw(st.integers(5, 70))):
        kind = draw(st.sampled_from(["alloc"] * 5 + ["free"] * 3 + ["empty", "begin", "end",
                                                                     "release"]))
        in_use = sorted(pool for pool, count in users.items() if count)
        if kind == "free" and live:
            steps.append(("free", live.pop(draw(st.integers(0, len(live) - 1)))))
        elif kind == "empty" and current is None:
            steps.append(("empty_cache",))
        elif kind == "begin" and current is None:
            pool = draw(st.sampled_from(in_use + [(key + 1, 0), (0, key + 1)]))
            if pool[0] == 0 and pool not in users:
                steps.append(("pool_create", pool))
                users[pool] = 1
                mempools.add(pool)
            one_stream = stream_captures and pool not in mempools
            streams = [draw(st.sampled_from([0, 9]))] if one_stream else None
            steps.append(("pool_begin", pool, streams))
            users[pool] = users.get(pool, 0) + 1
            current, captured = pool, streams
            if streams:                       # a captured region starts and ends allocating
                steps.append(("alloc", f"{key}b", 1000, streams[0]))
        elif kind == "end" and current is not None:
            if captured:
                steps.append(("alloc", f"{key}e", 1000, captured[0]))
            steps.append(("pool_end", current))
            if current in mempools:               # use_mem_pool's exit releases
                steps.append(("pool_release", current))
                users[current] -= 1
            current = None
        elif kind == "release" and releases and [p for p in in_use if p != current]:
            pool = draw(st.sampled_from([p for p in in_use if p != current]))
            steps.append(("pool_release", pool))
            users[pool] -= 1
            if pool in mempools and not users[pool]:
                steps.append(("empty_cache", pool))       # ~MemPool
        else:
            size = draw(st.sampled_from([100, 4000, 700_000, 1 << 20, 3 << 20, 11 << 20, 33 << 20]))
            steps.append(("alloc", key, size + draw(st.integers(0, 5000)),
                          draw(st.sampled_from([0, 9]))))
            live.append(key)
    return steps


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([None, 200 << 20, 90 << 20]).flatmap(lambda capacity: st.tuples(
           st.just(capacity), pool_workloads(releases=True, stream_captures=capacity is None))),
       st.sampled_from(["", "expandable_segments:True"]), st.integers(1, 250))
def test_any_recording_with_pool_ids_replays_exactly(tmp_path_factory, workload, settings_text,
                                                     keep):
    """The newest PyTorch names each entry's pool: any workload replays exactly. Under a cap,
    captures take every stream: a default request on another stream while a capture is under
    way skips the retry's release, and the trace shows that only between the capture's own
    requests."""
    capacity, steps = workload
    snapshot = record(steps, settings_text, capacity=capacity, keep=keep, entry_pool_ids=True)
    if not snapshot["device_traces"][0]:
        return
    result = replay(tmp_path_factory.mktemp("pools"), snapshot)
    assert result.divergence is None, result.divergence.describe()
    assert result.peak_reserved_bytes == result.recorded_peak_reserved_bytes


@settings(max_examples=60, deadline=None)
@given(pool_workloads(releases=False), st.sampled_from(["", "expandable_segments:True"]),
       st.integers(1, 250))
def test_any_recording_whose_pools_outlive_it_replays_exactly(tmp_path_factory, steps,
                                                              settings_text, keep):
    """Without pool ids in the entries: pools still in use at the dump name every segment they
    hold (a pool in use never frees one), so every request is routed right."""
    snapshot = record(steps, settings_text, keep=keep)
    if not snapshot["device_traces"][0]:
        return
    result = replay(tmp_path_factory.mktemp("pools"), snapshot)
    assert result.divergence is None, result.divergence.describe()
    assert result.peak_reserved_bytes == result.recorded_peak_reserved_bytes


def test_the_report_tells_private_pools_segments_from_the_default_ones(tmp_path):
    """They were counted as cached segments any request could reuse and empty_cache() frees."""
    path = tmp_path / "graph.pickle"
    path.write_bytes(pickle.dumps(record(CAPTURE, keep=20)))
    result = CliRunner().invoke(main, ["report", str(path)])
    assert result.exit_code == 0, result.output
    assert "segment(s) of private pools (CUDA graphs, MemPools)" in result.output
    assert ", private pool (1, 0)" in result.output


def test_entries_that_name_another_pool_than_their_segment_are_said(tmp_path):
    """The entries and the dump disagree (a damaged or hand-made file): replayed in the pool the
    dump names, with a note; it was silent."""
    snapshot = record(CAPTURE, keep=20, entry_pool_ids=True)
    for entry in snapshot["device_traces"][0]:
        if entry["action"] == "alloc" and tuple(entry["pool_id"]) == GRAPH:
            entry["pool_id"] = (3, 0)
    path = tmp_path / "other.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    result = CliRunner().invoke(main, ["replay", "--check", str(path)])
    assert "the trace's pool_id fields name another pool than the snapshot's segment_pool_id" in \
        result.output, result.output
