"""Replay a trace file through npumem's pool, natively.

`npumem replay --allocator pool` without prediction (expandable arenas or segments) plays the
trace's columns through `alloc/_pool_replay.c`, which follows the pool's rules with every
stream idle, as a replay has it: a million events a second or more, memory with the live
blocks. The pool's own numbers (split sizes, limit, rounding, segment sizes) come from a pool
made on the same simulated device as `replay.replay` makes, so both replays answer alike; the
Python pool stays the oracle (tests/test_pool_replay.py). Prediction, an out-of-memory, more
streams than MAX_STREAMS (or than the device's address space holds arenas) and traces whose
numbers do not fit 64 bits replay through the Python pool (`replay.replay`).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ..alloc.caching_allocator import CachingAllocator
from ..alloc.settings import AllocatorSettings, describe_changes
from ..alloc.segments import garbage_limit, large_split_min, usable_below
from ..alloc.sizes import round_request, segment_size
from ..constants import MemAttr
from ..device.address_space import DEVICE_SPAN
from ..device.sim import SimBackend, SimConfig
from ..trace import jsonl
from ..trace.formats import detect_format, read_mended
from ..trace.snapshot.columns import (ACTION_CODE, ALLOC, FREE_COMPLETED, Entries, arrays,
                                      from_event_columns)
from .replay import ReplayResult

try:
    from ..alloc import _pool_replay
except ImportError:                 # a checkout not installed with `pip install -e .`
    _pool_replay = None

MAX_STREAMS = 1024                  # more streams than this: the Python pool's replay
SLICE = 1 << 20                     # events per call of the core, between progress reports

Part = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]      # action, addr, size, stream


class StoryHole(Exception):
    """A streamed trace has a hole in an address's story: it is read whole and mended."""


# why the native pool stopped, where a note should say it (an out-of-memory is the row's)
UNTAKEN = {} if _pool_replay is None else {
    _pool_replay.TOO_MANY_STREAMS: "more streams than its native replay takes",
    _pool_replay.ADDRESSES_USED: "more segments than the simulated device's addresses hold "
                                 "without going round them"}


def applies(settings: AllocatorSettings) -> bool:
    """Whether the native core replays a pool with these settings."""
    return _pool_replay is not None and not settings.predictive


def make_core(settings: AllocatorSettings, memory: int):
    """A native pool with the numbers of the pool `replay.replay` makes for `memory` bytes
    (None where the device's addresses hold no stream's arena: the Python pool says so)."""
    backend = SimBackend(SimConfig(memory=memory))
    pool = CachingAllocator(backend, 0, settings)
    try:
        page = backend.page_granularity
        flavour, divisions, alignment = (pool.flavour, settings.roundup_power2_divisions,
                                         settings.block_alignment)
        segment_mb, max_split = settings.segment_size_mb, pool.max_split_bytes

        def rounding(nbytes: int) -> tuple[int, int, int]:
            size = round_request(nbytes, flavour, divisions, alignment)
            return size, segment_size(size, segment_mb), usable_below(size, max_split) or 0

        gc_below = garbage_limit(settings.garbage_collection_threshold, pool.limit)
        arena = -(-max(pool.capacity, 1) // page) * page          # a stream's reservation
        streams = min(MAX_STREAMS, DEVICE_SPAN // arena) if pool.expandable else MAX_STREAMS
        if not streams:
            return None
        return _pool_replay.Core(
            segments=not pool.expandable, page_shift=page.bit_length() - 1, arena_size=arena,
            split_min=pool.split_min, split_min_large=large_split_min(pool.split_min),
            limit=pool.limit, device_total=backend.mem_info(0, MemAttr.HBM_MEM)[1],
            huge_limit=backend.mem_info(0, MemAttr.HBM_MEM_HUGE)[1],
            gc_below=-1 if gc_below is None else gc_below, rounding=rounding,
            max_streams=streams)
    finally:
        pool.close()
        backend.close()


def replay_file(path: str, settings: Sequence[AllocatorSettings], memory: int, recording=None,
                progress: Callable[[int], None] | None = None) -> list[ReplayResult | str | None]:
    """The replays of `path` (`recording`: its snapshot, loaded) through the pool under each of
    `settings`, the trace read once; for each the Python pool must do (see the module's
    docstring), None, or why, where a note should say it."""
    native = [chosen for chosen in settings if applies(chosen)]
    results = iter(_replay_file(path, native, memory, recording, progress) if native else [])
    return [next(results) if applies(chosen) else None for chosen in settings]


def _replay_file(path: str, settings: list[AllocatorSettings], memory: int, recording,
                 progress) -> list[ReplayResult | str | None]:
    if recording is not None:
        source = _snapshot_columns(recording)
        return [None] * len(settings) if source is None else \
            replay_columns(*source, settings, memory, path, progress=progress)
    if detect_format(path) == "jsonl" and jsonl.in_columns():
        # streamed: memory stays with the live blocks. The pools see every hole in an
        # address's story (`holes`); at the first, the trace is read whole and mended.
        parts = (from_event_columns(raw).columns for raw in jsonl.column_chunks(path))
        try:
            return replay_columns(((c.action, c.addr, c.size, c.stream) for c in parts),
                                  FREE_COMPLETED, settings, memory, path, progress=progress,
                                  whole=True)
        except StoryHole:
            pass
    mended = read_mended(path)
    entries = mended.entries
    if not isinstance(entries, Entries):
        return [None] * len(settings)           # numbers past 64 bits
    c, span = entries.columns, slice(entries.start, entries.stop)
    return replay_columns([(c.action[span], c.addr[span], c.size[span], c.stream[span])],
                          FREE_COMPLETED, settings, memory, path, mended.notes, progress)


def replay_columns(chunks, free_code: int, settings: Sequence[AllocatorSettings], memory: int,
                   trace_name: str = "", notes=(), progress=None, whole: bool = False
                   ) -> list[ReplayResult | str | None]:
    """The replays of `chunks` (action, addr, size and stream columns, a part at a time; frees
    have action `free_code`) under each of `settings`: every part goes through each pool in
    turn. For each the Python pool must do: None where it ran out of memory (the Python
    replay's row says so), else why (`UNTAKEN`). With `whole`, the
    trace must tell every address's story whole (as `mending` reads it): StoryHole as soon as
    a pool meets a hole."""
    kinds = np.zeros(256, np.uint8)
    kinds[ALLOC], kinds[free_code] = 1, 2
    cores = [make_core(chosen, memory) for chosen in settings]
    results: list[ReplayResult | str | None] = [None] * len(cores)
    running = [index for index, core in enumerate(cores) if core is not None]
    if not running:
        return results
    for action, addr, size, stream in chunks:
        for begin in range(0, len(action), SLICE):
            span = slice(begin, begin + SLICE)
            for index in list(running):
                core = cores[index]
                why, _ = core.run(kinds, action[span], addr[span], size[span], stream[span])
                if whole and core.counts()["holes"]:
                    raise StoryHole
                if why != _pool_replay.DONE:     # the Python pool says what went wrong
                    running.remove(index)
                    results[index] = UNTAKEN.get(why)
            if not running:
                return results
            if progress is not None:
                progress(cores[running[0]].counts()["events"])
    for index in running:
        results[index] = _result(cores[index].counts(), settings[index], trace_name, notes)
    return results


def _result(counts: dict, settings: AllocatorSettings, trace_name: str, notes) -> ReplayResult:
    live, reserved, requests = counts["peak_allocated"], counts["peak_reserved"], counts["requests"]
    return ReplayResult(
        trace=trace_name, allocator="pool", events=counts["events"],
        peak_allocated_bytes=live, peak_reserved_bytes=reserved,
        reserved_over_allocated=reserved / live if live else 0.0,
        device_allocs=counts["device_allocs"],
        cache_hit_rate=1 - counts["cache_misses"] / requests if requests else 1.0,
        mean_alloc_us=None,         # the native core's time is not the pool's: no latency shown
        unmatched_frees=counts["unmatched"], settings=describe_changes(settings),
        notes=list(notes))


def _snapshot_columns(recording) -> tuple[list[Part], int] | None:
    """A snapshot's blocks live when its trace began (allocs on stream 0, as `snapshot.events`
    gives them), then its trace's allocs and frees."""
    entries = recording.entries
    if not entries:
        return None                  # the Python reader says there is nothing to replay
    a = arrays(entries)
    if a.addr.dtype != np.uint64 or a.size.dtype != np.uint64 or a.stream.dtype != np.uint64:
        return None
    live = list(recording.start_state(pools=False).live.values())
    try:
        start = (np.full(len(live), ALLOC, np.uint8),
                 np.array([block.addr for block in live], np.uint64),
                 np.array([block.requested for block in live], np.uint64),
                 np.zeros(len(live), np.uint64))
    except OverflowError:            # a segment's numbers past 64 bits
        return None
    return [start, (a.action, a.addr, a.size, a.stream)], ACTION_CODE[recording.free_action]
