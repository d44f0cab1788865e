"""The native replay of the default pool (alloc/_pool_replay.c) against its oracle, the pool
itself (CachingAllocator in expandable mode, every stream idle): random request streams must
leave the same blocks at the same places, map and unmap the same pages, and stop at the same
request for want of memory; replays of files must say the same as the Python pool's."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from npumem.alloc.caching_allocator import CachingAllocator, OutOfMemoryError
from npumem.alloc.settings import AllocatorSettings, describe_changes, parse_settings
from npumem.device.sim import SimBackend, SimConfig
from npumem.trace import write_trace
from npumem.trace.snapshot.columns import ALLOC, FREE_COMPLETED
from npumem.events import TraceEvent
from npumem.whatif import pool_replay
from npumem.whatif.sweep import ReplayJob, batches, run_jobs

pytestmark = pytest.mark.skipif(pool_replay._pool_replay is None,
                                reason="the native pool is not built (pip install -e .)")
MiB = 1 << 20
DATA = Path(__file__).parent / "data"
KINDS = np.zeros(256, np.uint8)
KINDS[ALLOC], KINDS[FREE_COMPLETED] = 1, 2


def _size(rng: random.Random) -> int:
    kind = rng.random()
    if kind < 0.5:
        return rng.randrange(0, 4096)
    if kind < 0.8:
        return rng.randrange(4096, 3 * MiB)
    return rng.randrange(3 * MiB, 40 * MiB)


def _events(seed: int, count: int, streams: int = 3) -> list[tuple[str, int, int, int]]:
    """(action, addr, size, stream): frees of live blocks mostly, an alloc over a live block and
    a free of an unknown address now and then."""
    rng = random.Random(seed)
    live, out, next_addr = {}, [], 1
    for _ in range(count):
        roll = rng.random()
        if live and roll < 0.45:
            addr = rng.choice(list(live))
            out.append(("free", addr, live.pop(addr), 0))
        elif roll < 0.47:
            out.append(("free", 10 ** 9 + rng.randrange(100), 64, 0))
        elif live and roll < 0.49:
            addr = rng.choice(list(live))
            size = _size(rng)
            live[addr] = size
            out.append(("alloc", addr, size, rng.randrange(streams)))
        else:
            size = _size(rng)
            live[next_addr] = size
            out.append(("alloc", next_addr, size, rng.randrange(streams)))
            next_addr += 1
    return out


def _columns(events):
    action = np.array([ALLOC if e[0] == "alloc" else FREE_COMPLETED for e in events], np.uint8)
    addr, size, stream = (np.array([e[k] for e in events], np.uint64) for k in (1, 2, 3))
    return action, addr, size, stream


def _python_pool(events, pool_settings: AllocatorSettings, memory: int):
    """The events through the pool as `replay.replay` plays them; (pool, backend, the index
    of the request it could not serve or None)."""
    backend = SimBackend(SimConfig(memory=memory))
    pool = CachingAllocator(backend, 0, pool_settings)
    live = {}
    for index, (action, addr, size, stream) in enumerate(events):
        if action == "free":
            if addr in live:
                pool.deallocate(live.pop(addr))
            continue
        if addr in live:
            pool.deallocate(live.pop(addr))
        try:
            live[addr] = pool.allocate(size, stream)
        except OutOfMemoryError:
            return pool, backend, index
    return pool, backend, None


def _python_layout(pool) -> list[tuple]:
    """What Core.layout says, of the Python pool: its arenas or segments, oldest first."""
    strategy = pool._strategy
    if pool.expandable:
        places = [(arena.stream, False, arena.reservation.size, arena.base, arena.blocks())
                  for arena in strategy.arenas.values()]
    else:
        places = [(segment.stream, segment.small, segment.size, segment.start, segment.blocks())
                  for segment in strategy.segments.values()]
    return [(stream, small, size, [(block.start - base, block.size, block.allocated)
                                   for block in blocks])
            for stream, small, size, base, blocks in places]


EXPANDABLE = ["", "roundup_power2_divisions:4", "block_alignment:128",
              "per_process_memory_fraction:0.5"]
SEGMENTS = ["expandable_segments:False", "expandable_segments:False,max_split_size_mb:24",
            "expandable_segments:False,segment_size_mb:4.5,roundup_power2_divisions:2",
            "expandable_segments:False,garbage_collection_threshold:0.5",
            "expandable_segments:False,garbage_collection_threshold:0.8,max_split_size_mb:30,"
            "per_process_memory_fraction:0.7"]


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10 ** 6), st.integers(1, 400), st.sampled_from(EXPANDABLE + SEGMENTS),
       st.sampled_from([64 * MiB, 200 * MiB, 1 << 30]), st.integers(1, 3))
def test_random_streams_leave_the_same_pool(seed, count, text, memory, streams):
    events = _events(seed, count, streams)
    pool_settings = parse_settings(text)
    core = pool_replay.make_core(pool_settings, memory)
    why, stopped = core.run(KINDS, *_columns(events))
    pool, backend, refused = _python_pool(events, pool_settings, memory)
    try:
        if refused is not None:
            assert (why, stopped) == (pool_replay._pool_replay.OUT_OF_MEMORY, refused)
            return
        assert (why, stopped) == (pool_replay._pool_replay.DONE, len(events))
        counts, stats = core.counts(), pool.stats
        assert counts["reserved"] == stats.current("reserved_bytes")
        assert counts["peak_reserved"] == stats.peak("reserved_bytes")
        assert counts["device_allocs"] == stats.counters["num_device_alloc"]
        assert counts["device_frees"] == stats.counters["num_device_free"]
        assert counts["cache_misses"] == stats.counters["num_cache_misses"]
        assert counts["alloc_retries"] == stats.counters["num_alloc_retries"]
        assert counts["requests"] == stats.stat("allocation").allocated
        assert counts["allocated"] == stats.current("requested_bytes")
        assert core.layout() == _python_layout(pool)
    finally:
        pool.close()
        backend.close()


def _file_replays(path: str, text: str = ""):
    native = ReplayJob(path, "pool", text).run()
    saved, pool_replay._pool_replay = pool_replay._pool_replay, None
    try:
        python = ReplayJob(path, "pool", text).run()
    finally:
        pool_replay._pool_replay = saved
    return native, python


FIGURES = ("events", "peak_allocated_bytes", "peak_reserved_bytes", "device_allocs",
           "cache_hit_rate", "unmatched_frees", "notes", "settings")
RECORDINGS = sorted([*(DATA / "cuda_snapshots").glob("*.pickle.gz"),
                     *(DATA / "cpu_recordings").glob("*.jsonl.gz")])


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.name)
@pytest.mark.parametrize("text", ["roundup_power2_divisions:2",
                                  "expandable_segments:False,max_split_size_mb:64"])
def test_replays_of_recordings_say_what_the_pool_says(path, text):
    native, python = _file_replays(str(path), text)
    assert {k: getattr(native, k) for k in FIGURES} == {k: getattr(python, k) for k in FIGURES}
    assert native.mean_alloc_us is None and python.mean_alloc_us > 0    # no latency to show


def test_a_trace_with_holes_is_replayed_mended(tmp_path):
    path = str(tmp_path / "holes.jsonl")
    write_trace([TraceEvent(0, "free", 0x900, 4096, 0),            # allocated before the trace
                 TraceEvent(1, "alloc", 0x100, 3 * MiB, 0),
                 TraceEvent(2, "alloc", 0x100, 1 * MiB, 1),        # its free was missed
                 TraceEvent(3, "free", 0x100, 1 * MiB, 1),
                 TraceEvent(4, "free", 0x100, 1 * MiB, 1)], path)  # a double free
    native, python = _file_replays(path)
    assert {k: getattr(native, k) for k in FIGURES} == {k: getattr(python, k) for k in FIGURES}
    assert len(native.notes) == 3 and native.events == 6     # the block from before, put first


HOLES = {"before the trace": TraceEvent(5, "free", 0x900, 4096, 0),
         "double free": TraceEvent(5, "free", 0x200, 1 * MiB, 0),
         "missed free": TraceEvent(5, "alloc", 0x300, 2 * MiB, 0),
         "another size": TraceEvent(5, "free", 0x300, 12345, 0),
         "size not said": TraceEvent(5, "free", 0x300, 0, 0)}


@pytest.mark.parametrize("hole", sorted(HOLES))
@pytest.mark.parametrize("at", [0, 3, 7])
def test_each_hole_in_a_streamed_trace_is_read_as_mending_reads_it(tmp_path, hole, at):
    """The pools see a hole as they meet it, wherever it is: the replay then reads the trace
    whole and mended, with the notes every other command gives."""
    story = [TraceEvent(0, "alloc", 0x200, 1 * MiB, 0), TraceEvent(1, "free", 0x200, 1 * MiB, 0),
             TraceEvent(2, "alloc", 0x300, 3 * MiB, 1), TraceEvent(3, "alloc", 0x400, 64, 0),
             TraceEvent(4, "free", 0x400, 64, 0), TraceEvent(6, "alloc", 0x500, 5 * MiB, 1),
             TraceEvent(7, "free", 0x500, 5 * MiB, 1)]
    path = str(tmp_path / "hole.jsonl")
    events = story[:at] + [HOLES[hole]] + story[at:]
    write_trace(events, path)
    native, python = _file_replays(path)
    assert {k: getattr(native, k) for k in FIGURES} == {k: getattr(python, k) for k in FIGURES}


def test_what_the_native_pool_does_not_replay_goes_to_the_python_pool(tmp_path, monkeypatch):
    path = str(DATA / "cpu_recordings" / "lstm.jsonl.gz")
    assert pool_replay.replay_file(path, [parse_settings("predictive:True")], 64 << 30) == [None]
    # more streams than the native pool takes, and a device too small: the pool's own replay
    monkeypatch.setattr(pool_replay, "MAX_STREAMS", 1)
    many = str(tmp_path / "streams.jsonl")
    write_trace([TraceEvent(i, "alloc", i + 1, 512, i) for i in range(3)], many)
    assert pool_replay.replay_file(many, [AllocatorSettings()], 64 << 30) == \
        ["more streams than its native replay takes"]
    result = ReplayJob(many, "pool").run()
    assert result.events == 3 and "through the pool itself (slower)" in result.notes[-1]
    assert pool_replay.replay_file(path, [AllocatorSettings()], 4 * MiB) == [None]
    result = ReplayJob(path, "pool", memory=4 * MiB).run()       # the Python pool's row
    assert result.oom["index"] < result.events and "4.00 MiB device" in result.oom["message"]


def test_progress_is_said_as_the_replay_goes(monkeypatch):
    monkeypatch.setattr(pool_replay, "SLICE", 1000)
    seen = []
    path = str(DATA / "cpu_recordings" / "cnn_accum.jsonl.gz")
    [result] = pool_replay.replay_file(path, [AllocatorSettings()], 64 << 30,
                                       progress=seen.append)
    assert len(seen) >= result.events // 1000 and seen[-1] == result.events
    assert seen == sorted(seen)


SWEEP = ["", "roundup_power2_divisions:4", "expandable_segments:False",
         "expandable_segments:False,max_split_size_mb:64", "predictive:True",
         "per_process_memory_fraction:0.001"]


def test_jobs_of_one_trace_share_a_read_as_the_workers_allow():
    jobs = [ReplayJob("a", "pool", text) for text in SWEEP] + [ReplayJob("a", "torch"),
                                                               ReplayJob("b", "pool")]
    def shape(workers):
        return sorted(positions for _, positions in batches(jobs, workers))

    # alone: prediction, the torch model; "a"'s five native jobs and "b"'s share the rest
    assert shape(1) == shape(4) == [[0, 1, 2, 3, 5], [4], [6], [7]]
    assert shape(6) == [[0, 2, 5], [1, 3], [4], [6], [7]]           # two workers each
    assert shape(8) == [[0, 3], [1, 5], [2], [4], [6], [7]]
    assert shape(64) == [[0], [1], [2], [3], [4], [5], [6], [7]]


@pytest.mark.parametrize("scheduler", ["serial", "processes"])
def test_a_batch_says_what_each_job_says_alone(scheduler):
    path = str(DATA / "cuda_snapshots" / "gpt_train.pickle.gz")
    jobs = [ReplayJob(path, "pool", text, memory=1 << 30) for text in SWEEP[:5]]
    jobs.append(ReplayJob(path, "torch"))
    seen = []
    together = run_jobs(jobs, scheduler, workers=2, progress=lambda *done: seen.append(done))
    alone = [job.run() for job in jobs]
    for job, mine, its in zip(jobs, together, alone):
        for result in (mine, its):                          # (times)
            result.mean_alloc_us = result.prediction_planning_seconds = 0.0
        assert mine == its, job.settings
    assert seen[-1] == (len(jobs), len(jobs))


def test_a_job_a_batch_cannot_replay_natively_replays_alone_in_it():
    path = str(DATA / "cpu_recordings" / "lstm.jsonl.gz")
    small = [ReplayJob(path, "pool", text, memory=64 * MiB) for text in ("", SWEEP[-1])]
    fits, refused = run_jobs(small, "serial")       # one out of memory loses no other row
    assert fits.oom is None and fits.peak_reserved_bytes == small[0].run().peak_reserved_bytes
    assert refused.oom == small[1].run().oom and "per_process_memory_fraction leaves the pool" \
        in refused.oom["message"]


@pytest.mark.parametrize("text, memory, said", [
    ("", 1 << 30, "is more than the whole 1.00 GiB device"),
    ("expandable_segments:False,segment_size_mb:1e9", 64 << 30,
     "needs a segment of 953.67 TiB (segment_size_mb), more than the pool may reserve"),
    ("", 1 << 50, "range of address space left"),        # no room for a stream's arena
])
def test_an_out_of_memory_row_says_why_in_the_replays_terms(tmp_path, text, memory, said):
    path = str(tmp_path / "big.jsonl")
    write_trace([TraceEvent(0, "alloc", 1, 1 << 20, 0), TraceEvent(1, "alloc", 2, 3 << 30, 0)],
                path)
    result = ReplayJob(path, "pool", text, memory=memory).run()
    assert said in result.oom["message"] and result.oom["index"] in (0, 1)


def test_bad_calls_are_refused_and_a_stopped_core_is_not_reused():
    core = pool_replay.make_core(AllocatorSettings(), 64 * MiB)
    action, addr, size, stream = _columns([("alloc", 1, 100, 0), ("free", 1, 100, 0)])
    with pytest.raises(ValueError, match="addr holds 8 bytes, not 16"):
        core.run(KINDS, action, addr[:1], size, stream)
    with pytest.raises(ValueError, match="kinds has 256 entries"):
        core.run(KINDS[:10], action, addr, size, stream)
    with pytest.raises(ValueError, match=r"kinds are 0 \(skip\), 1 \(alloc\) or 2 \(free\)"):
        core.run(np.full(256, 3, np.uint8), action, addr, size, stream)
    assert core.run(KINDS, action, addr, size, stream) == (0, 2)      # still usable
    assert core.counts()["requests"] == 1
    action, addr, size, stream = _columns([("alloc", 2, 100 * MiB, 0)])
    assert core.run(KINDS, action, addr, size, stream) == (pool_replay._pool_replay.OUT_OF_MEMORY, 0)
    with pytest.raises(RuntimeError, match="stopped short"):
        core.run(KINDS, action, addr, size, stream)
    with pytest.raises(ValueError, match="page_shift"):
        _core(abs, page_shift=3)


def _core(rounding, **changes):
    numbers = dict(segments=False, page_shift=21, arena_size=64 * MiB, split_min=64,
                   split_min_large=MiB + 1, limit=64 * MiB, device_total=64 * MiB,
                   huge_limit=64 * MiB, gc_below=-1, rounding=rounding, max_streams=4)
    return pool_replay._pool_replay.Core(**{**numbers, **changes})


def test_a_rounding_rule_that_fails_stops_the_replay_with_its_error():
    def broken(nbytes):
        raise ArithmeticError(f"cannot round {nbytes}")

    alloc = _columns([("alloc", 1, 100, 0)])
    with pytest.raises(ArithmeticError, match="cannot round 100"):
        _core(broken).run(KINDS, *alloc)
    for wrong in (lambda n: n, lambda n: (n, -1, 0), lambda n: (n, 2 * MiB)):
        with pytest.raises(ValueError, match="three whole numbers"):
            _core(wrong, segments=True).run(KINDS, *alloc)


def test_the_command_keeps_every_row_and_says_which_ran_out(tmp_path):
    from click.testing import CliRunner
    from npumem.cli import main

    path = str(DATA / "cpu_recordings" / "lstm.jsonl.gz")
    result = CliRunner().invoke(main, ["replay", "--allocator", "pool,device", "--memory", "64M",
                                       "--sweep", "per_process_memory_fraction=1,0.2", path])
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if line.startswith("lstm.jsonl.gz")]
    assert len(rows) == 3 and "Traceback" not in result.output
    assert "[pool per_process_memory_fraction:0.2]: out of memory at entry" in result.output
    assert "[device]: out of memory at entry" in result.output
    assert "(--memory sets the device" not in result.output     # (said only without it)
    # nothing fits: tune says so in one line and exits 2 (its table shows each refusal)
    huge = str(tmp_path / "huge.jsonl")
    write_trace([TraceEvent(0, "alloc", 1, 1 << 47, 0)], huge)
    result = CliRunner().invoke(main, ["tune", huge, "--scheduler", "serial"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "error: no candidate setting replays the trace" in result.output
    assert "out of memory at event 0" in result.output


def test_settings_read_as_written():
    assert describe_changes(parse_settings("expandable_segments:False,max_split_size_mb:64,"
                                           "garbage_collection_threshold:0.5")) == \
        "expandable_segments:False,max_split_size_mb:64,garbage_collection_threshold:0.5"


def test_progress_never_goes_back_when_a_trace_is_read_again(tmp_path, monkeypatch):
    monkeypatch.setattr(pool_replay, "SLICE", 2)
    path = str(tmp_path / "hole_late.jsonl")       # the hole comes late: read again, mended
    events = [TraceEvent(i, "alloc" if i % 2 == 0 else "free", 0x100 + i // 2, 64, 0)
              for i in range(10)] + [TraceEvent(11, "free", 0x999, 64, 0)]
    write_trace(events, path)
    seen = []
    result = ReplayJob(path, "pool").run(seen.append)
    assert seen == sorted(set(seen)) and result.notes     # (mended: a note says what)


SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
WRITTEN_BY_OTHERS = ([*(SHARED / "snapshots").glob("*.pickle"), *(SHARED / "traces").glob("*.gz"),
                      *(SHARED / "formats").glob("operator_memory*.csv"),
                      *(SHARED / "formats").glob("rmm_*.csv"), SHARED / "formats" / "memory_log.csv.dev0"]
                     if SHARED.is_dir() else [])


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data not beside the repo")
@pytest.mark.parametrize("path", WRITTEN_BY_OTHERS, ids=lambda p: p.name)
@pytest.mark.parametrize("text", ["", "expandable_segments:False,garbage_collection_threshold:0.6"])
def test_files_others_wrote_replay_as_the_pool_replays_them(path, text):
    """Users' PyTorch snapshots, the profiler's Chrome trace, msprof's and torch_npu's
    operator_memory.csv, RMM's logs: the same figures and notes from both pools."""
    native, python = _file_replays(str(path), text)
    assert {k: getattr(native, k) for k in FIGURES} == {k: getattr(python, k) for k in FIGURES}
    assert native.events > 0
