"""The allocator's state at a recording's first trace entry, rebuilt from the snapshot.

`torch.cuda.memory._record_memory_history()` keeps a ring buffer of the last N events, so a trace
usually starts mid-run, with weights, optimizer state and cached blocks already there. The
snapshot's `segments` are the state at the dump; walking the trace backwards from them undoes
its effects (an alloc un-allocates, a free re-allocates, segment_alloc/segment_free remove or
restore a segment) and gives the state at the first entry: which segments were reserved and
which blocks in them were live.

It also says which pool served each recorded segment and request: the default pools or a private
pool (a CUDA graph's, a MemPool's). The dump gives each segment's `segment_pool_id`; the newest
PyTorch gives each trace entry's `pool_id`. Without those, a segment's pool is inferred from the
releases: what a release kept tells private from default (empty_cache frees every idle default
segment, so an idle segment it kept is a pool's in use, and a release that kept an idle default
segment freed a pool's), and segments freed together with segments of one private pool alone
went back with that pool. A private pool known only so gets an id of its own, (-1, n). What is
still unknown is taken as the default pools.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ...alloc.torch_model.allocator import (DEFAULT_POOL, MIN_BLOCK, SMALL_BUFFER, SMALL_SIZE,
                                           expandable_page, round_size)
from ...alloc.torch_model.config import NO_LIMIT, TorchAllocatorConfig
from ..file_checks import TraceFormatError
from .columns import (_CHUNK, ACTIONS, ALLOC, DEVICE_BYTES_LIMIT, SEGMENT_ADD, SEGMENT_REMOVE,
                      arrays, having, impossible_range,
                      indices, native, natural, positions_where, rows)


@dataclass
class StartBlock:
    addr: int
    size: int
    requested: int
    allocated: bool
    frames: list = field(default_factory=list)


@dataclass
class StartSegment:
    addr: int
    size: int
    stream: int
    small: bool
    expandable: bool
    blocks: list[StartBlock] = field(default_factory=list)
    pool: tuple = DEFAULT_POOL           # MempoolId_t of the pool it belongs to
    lowest: int | None = None            # expandable: the lowest address its segment maps


@dataclass
class StartState:
    segments: list[StartSegment]
    live: dict[int, StartBlock]          # blocks live at the first entry, by address
    unplaced: int = 0                    # live blocks outside every start segment
    inconsistent: int = 0                # trace entries that contradict the segments
    contradicted: int = 0                # segments whose entries name two pools
    # entry index -> the private pool that served it (absent: the default pools)
    pools: dict[int, tuple] = field(default_factory=dict)
    captured: set[int] = field(default_factory=set)   # default requests made during a capture

    @property
    def reserved(self) -> int:
        return sum(segment.size for segment in self.segments)

    @property
    def allocated(self) -> int:
        return sum(block.requested for block in self.live.values())


class _Segments(dict):
    """Recorded segments by start address, [size, stream, small, expandable, pool node] (each
    value replaced whole, never changed in place), with a sorted index of the starts for
    finding the segment an address lies in, and its columns (`columns`)."""

    def __init__(self):
        super().__init__()
        self.starts: list[int] = []
        self._columns = None          # (starts, sizes, nodes) as arrays, kept up to date

    def __setitem__(self, start: int, value: list) -> None:
        position = bisect_left(self.starts, start)
        new = start not in self
        if new:
            self.starts.insert(position, start)
        super().__setitem__(start, value)
        if self._columns is None:
            return
        if not (0 <= start < 2**64 and 0 <= value[0] < 2**64):
            self._columns = None      # (rebuilt as Python numbers at the next call)
        elif new:
            self._columns = tuple(np.insert(column, position, item) for column, item in
                                  zip(self._columns, (start, value[0], value[4])))
        else:
            self._columns[1][position], self._columns[2][position] = value[0], value[4]

    def pop(self, start: int, *default):
        if start in self:
            position = bisect_left(self.starts, start)
            del self.starts[position]
            if self._columns is not None:
                self._columns = tuple(np.delete(column, position) for column in self._columns)
        return super().pop(start, *default)

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(starts, sizes, pool nodes) in order of start: kept from call to call, each change
        made to them (a segment entry changes one or two), not rebuilt."""
        if self._columns is not None:
            return self._columns
        starts = natural(self.starts)
        sizes = natural([self[start][0] for start in self.starts])
        nodes = np.array([self[start][4] for start in self.starts], dtype=np.int32)
        if starts.dtype != object and sizes.dtype != object:
            self._columns = (starts, sizes, nodes)
        return starts, sizes, nodes

    def containing(self, addr: int) -> int | None:
        index = bisect_right(self.starts, addr) - 1
        if index >= 0 and addr < self.starts[index] + self[self.starts[index]][0]:
            return self.starts[index]
        return None


class _PoolNodes:
    """One node per recorded segment (ranges of one expandable segment joined): the pool it
    belongs to once known, None before; `guessed`: nodes only taken as default so far."""

    def __init__(self):
        self.parent: list[int] = []
        self.pool: list[tuple | None] = []
        self.guessed: set[int] = set()
        self.contradicted: set[int] = set()   # nodes whose entries named two pools

    def new(self, pool: tuple | None = None) -> int:
        self.parent.append(len(self.parent))
        self.pool.append(pool)
        return len(self.parent) - 1

    def find(self, node: int) -> int:
        while self.parent[node] != node:
            self.parent[node] = self.parent[self.parent[node]]
            node = self.parent[node]
        return node

    def of(self, node: int | None) -> tuple | None:
        return None if node is None else self.pool[self.find(node)]

    def seems(self, node: int) -> tuple | None:
        """Its pool, or the default one where that is a guess."""
        return self.of(node) or (DEFAULT_POOL if self.find(node) in self.guessed else None)

    def guess_default(self, node: int) -> bool:
        if self.seems(node) is not None:
            return False
        self.guessed.add(self.find(node))
        return True

    def learn(self, node: int | None, pool: tuple | None) -> bool:
        if node is None or pool is None or self.of(node) is not None:
            return False
        self.pool[self.find(node)] = pool
        return True

    def told(self, node: int | None, pool: tuple | None) -> None:
        """What the recording says of a node's pool (an entry's pool_id): learned, or where it
        already named another (the dump's segment_pool_id, a later entry), a contradiction."""
        known = self.of(node)
        if known is not None and pool is not None and known != pool:
            self.contradicted.add(self.find(node))
        self.learn(node, pool)

    def all_known(self) -> bool:
        """Whether every segment's pool is known (guesses aside): nothing left to infer."""
        return all(self.pool[node] is not None for node in range(len(self.parent))
                   if self.find(node) == node)

    def join(self, node: int, other: int) -> None:
        root, gone = self.find(node), self.find(other)
        if root != gone:
            self.parent[gone] = root
            if self.pool[root] is None:
                self.pool[root] = self.pool[gone]


def read_pool_id(value) -> tuple | None:
    """A MempoolId_t as a snapshot writes it (a pair of integers), else None."""
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(
            type(part) is int and 0 <= part < 1 << 64 for part in value):
        return tuple(value)
    return None


def _end_state(recording, nodes: _PoolNodes):
    ranges = _Segments()
    live: dict[int, StartBlock] = {}
    for segment in recording.segments:
        small = segment.get("segment_type") == "small"
        ranges[segment["address"]] = [segment["total_size"], int(segment.get("stream") or 0),
                                      small, bool(segment.get("is_expandable")),
                                      nodes.new(read_pool_id(segment.get("segment_pool_id")))]
        for block in segment.get("blocks") or []:
            if isinstance(block, dict) and block.get("state", "inactive") != "inactive":
                live[block["address"]] = StartBlock(
                    block["address"], block["size"], block.get("requested_size") or block["size"],
                    True, block.get("frames") or [])
    return ranges, live


def rebuild_start(recording, config: TorchAllocatorConfig, pools: bool = True) -> StartState:
    """The state at `recording`'s first entry (a Recording: start_state.py is below it). With
    `pools` False, which pool served each request is not inferred (the report draws blocks and
    segments only): `pools` is left empty, and segments are in the pools that the dump and the
    segment entries name."""
    if not recording.segments and not recording.recorded_segment_events():
        return StartState([], {})     # allocs and frees only (a CPU recording): nothing before
    # once per recording and settings: tune replays each setting a few times, and report's
    # OOM explanation runs tune (about 90 rebuilds of one state where the walk is the cost)
    known = vars(recording).setdefault("_start_states", {})    # (kept on the recording)
    key = (config, pools, len(recording.entries), len(recording.segments))
    if key not in known:
        wrong = impossible_range(recording.entries)
        if wrong is not None:
            raise TraceFormatError(recording.path, f"entry {wrong[0]}", wrong[1])
        state = _rebuild_start(recording, config, pools)
        _check_segments(recording.path, state.segments, config if pools else None)
        known[key] = state
    return known[key]


def _check_segments(path: str, segments: list[StartSegment],
                    config: TorchAllocatorConfig | None) -> None:
    """Refuse a start state the allocator model cannot hold: segments that overlap (the dump's
    and the trace's segment entries contradict one another), one past the address space, or
    more bytes in all than any device holds. Otherwise the model would keep two blocks at one
    address, and fail one of its own checks far from the cause (issue 64). With a `config`
    (the model's start: pools inferred, so each expandable segment is one group), also
    refuse a segment among an expandable segment's addresses or pages."""
    end = total = 0
    for segment in sorted(segments, key=lambda s: s.addr):
        total += segment.size
        where = f"the segment at 0x{segment.addr:x} ({segment.size} bytes) at the first entry"
        if segment.addr < end:
            raise TraceFormatError(path, "segments", f"{where} overlaps the one before it, "
                                   f"which ends at 0x{end:x}: the dump's segments and the "
                                   "trace's segment entries contradict one another")
        end = segment.addr + segment.size
        if end > 2**64:
            raise TraceFormatError(path, "segments", f"{where} runs past the end of the 64-bit "
                                   "address space")
        if total > DEVICE_BYTES_LIMIT:
            raise TraceFormatError(path, "segments", f"{where} brings the bytes held then to "
                                   f"{total}, more than any device holds (2**48)")
    # an expandable segment's addresses, from the lowest the trace maps to the end of its last
    # mapped range, are its own: no other segment lies among them (the model rebuilds it as one
    # range, its gaps unmapped blocks)
    if config is None:
        return
    groups: dict[tuple, list[StartSegment]] = {}
    for segment in segments:
        if segment.expandable:
            groups.setdefault((segment.stream, segment.pool, segment.small), []).append(segment)
    starts = sorted(segment.addr for segment in segments)
    for (stream, _, small), group in groups.items():
        low = min([s.addr for s in group] + [s.lowest for s in group if s.lowest is not None])
        high = max(s.addr + s.size for s in group)
        # it maps whole pages from its lowest address: those are its own too
        page = expandable_page(config, small)
        pages_end = low + -(-(high - low) // page) * page
        above = bisect_left(starts, high)
        if above < len(starts) and starts[above] < pages_end:
            raise TraceFormatError(path, "segments", f"the segment at 0x{starts[above]:x} at "
                                   f"the first entry lies inside the {page}-byte pages of an "
                                   f"expandable segment of stream {stream} ([0x{low:x}, "
                                   f"0x{pages_end:x})): the dump's segments and the trace's "
                                   "segment entries contradict one another")
        if above - bisect_left(starts, low) == len(group):
            continue                      # (only its own segments start in that span)
        for other in segments:
            if low <= other.addr < high and not any(other is s for s in group):
                raise TraceFormatError(path, "segments", f"the segment at 0x{other.addr:x} "
                                       f"({other.size} bytes) at the first entry lies inside "
                                       f"the addresses of an expandable segment of stream "
                                       f"{group[0].stream} ([0x{low:x}, 0x{high:x})): the "
                                       "dump's segments and the trace's segment entries "
                                       "contradict one another")


def _rebuild_start(recording, config: TorchAllocatorConfig, pools: bool) -> StartState:
    nodes = _PoolNodes()
    ranges, live = _end_state(recording, nodes)
    free_action = recording.free_action
    entries = recording.entries
    a = arrays(entries)
    inconsistent = _undo_blocks(a, live, free_action)
    # alloc and segment entries -> the segment's node (-1: none); with `pools` only
    entry_nodes = np.full(len(a), -1, dtype=np.int32) if pools else None    # (few nodes)
    mapped: list[tuple[int, int]] = []   # (node, address) of each page range (un)mapped
    above = len(a)
    # the trace backwards: segment entries one by one, the blocks between them at once
    segments = np.flatnonzero(having(a.action, *SEGMENT_ADD, *SEGMENT_REMOVE))
    for index in [*segments[::-1].tolist(), -1]:
        if pools:
            _block_nodes(a, ("alloc", free_action), index + 1, above, ranges, nodes, entry_nodes)
        above = index
        if index < 0:
            break
        action, addr, size = ACTIONS[a.action[index]], int(a.addr[index]), int(a.size[index])
        node = None
        if action == "segment_alloc":
            segment = ranges.pop(addr, None)
            if segment is None:
                inconsistent += 1
            else:
                node = segment[4]
        elif action == "segment_free":
            node = nodes.new()
            ranges[addr] = [size, int(a.stream[index]), size == SMALL_BUFFER, False, node]
        elif action == "segment_map":
            start = ranges.containing(addr)
            if start is None:
                inconsistent += 1
                continue
            total, stream, small, _, node = ranges.pop(start)
            if addr > start:
                ranges[start] = [addr - start, stream, small, True, node]
            if addr + size < start + total:
                ranges[addr + size] = [start + total - addr - size, stream, small, True, node]
        elif action == "segment_unmap":
            before = ranges.containing(addr - 1)
            small = ranges[before][2] if before is not None else size % (20 << 20) != 0
            start, total, node = addr, size, nodes.new()
            if before is not None and ranges[before][3]:     # the same expandable segment
                merged = ranges.pop(before)
                total, start = total + merged[0], before
                nodes.join(node, merged[4])
            after = ranges.get(addr + size)
            if after is not None and after[3]:
                total += ranges.pop(addr + size)[0]
                nodes.join(node, after[4])
            ranges[start] = [total, int(a.stream[index]), small, True, node]
        if node is not None:
            pool_id = a.extras[a.extra[index]].get("pool_id")       # PyTorch 2.12+ only
            if pool_id is not None:
                nodes.told(node, read_pool_id(pool_id))
            if pools:
                entry_nodes[index] = node
            if action in ("segment_map", "segment_unmap"):
                mapped.append((node, addr))
    lowest: dict[int, int] = {}       # expandable segment node -> the lowest address it maps
    for node, addr in mapped:
        lowest[nodes.find(node)] = min(addr, lowest.get(nodes.find(node), addr))
    if not pools:
        return _place_blocks(ranges, live, config, inconsistent, nodes, lowest)
    held, users = Counter(), Counter()   # each segment node's bytes and live blocks at the start
    for size, *_, node in ranges.values():
        held[nodes.find(node)] += size
    for addr in live:
        start = ranges.containing(addr)
        if start is not None:
            users[nodes.find(ranges[start][4])] += 1
    # oversize frees (max_split_size) and garbage collection free some idle segments only
    complete = config.max_split_size == NO_LIMIT and not config.garbage_collection_threshold
    if not nodes.all_known():     # (a dict of every entry's node: only when pools are unknown)
        noted = positions_where(entry_nodes >= 0)
        _infer_pools(entries, nodes, dict(zip(noted.tolist(), entry_nodes[noted].tolist())),
                     config.max_split_size, (held, users, free_action) if complete else None)
        del noted
    state = _place_blocks(ranges, live, config, inconsistent, nodes, lowest)
    # only the entries of private pools: a few segments' worth, where every entry is a million
    seen = np.zeros(len(nodes.parent), dtype=bool)        # (nodes are few: no sort of them)
    for begin in range(0, len(entry_nodes), _CHUNK):      # (bounded temporaries)
        part = entry_nodes[begin:begin + _CHUNK]
        seen[part[part >= 0]] = True
    pool_of = {node: nodes.of(node) or DEFAULT_POOL for node in np.flatnonzero(seen).tolist()}
    private = [node for node, pool in pool_of.items() if pool != DEFAULT_POOL]
    state.pools = {}
    if private:
        mine = positions_where(np.isin(entry_nodes, private))
        state.pools = {index: pool_of[node]
                       for index, node in zip(mine.tolist(), entry_nodes[mine].tolist())}
    del entry_nodes
    ooms = indices(entries, "oom")
    between = _between(a, state.pools, ooms) if ooms else {}
    for index in ooms:                        # a refused request: no segment to tell
        pool = read_pool_id(entries[index].get("pool_id")) or between.get(index)
        if pool not in (None, DEFAULT_POOL):
            state.pools[index] = pool
    state.captured = _during_captures(entries, state.pools)
    return state




def _undo_blocks(a, live: dict[int, StartBlock], free_action: str) -> int:
    """Undo the trace's allocs and frees (`free_action`) on `live`, the blocks live at the dump
    by address, last first: each address is left as its first move found it (before an alloc
    not live; before a free live, the block that free names). Returns how many moves contradict
    the state they undo: an alloc of a block not live after it, a free of one live after it."""
    freed, allocated, inconsistent = first_moves(a, free_action, sorted(live))
    for addr in allocated:
        live.pop(addr, None)
    for addr, size, stack in zip(a.addr[freed].tolist(), a.size[freed].tolist(),
                                 a.stack_at(freed).tolist()):
        live[addr] = StartBlock(addr, 0, size, True, a.stacks[stack] or [])
    return inconsistent


def first_moves(a, free_action: str, at_dump: list[int]) -> tuple[np.ndarray, list[int], int]:
    """The positions of the frees that first name an address, the addresses an alloc names
    first, and how many moves contradict the state they undo (two allocs or two frees of an
    address in a row; a last move against `at_dump`, the addresses live at the dump, sorted):
    one pass of the C reader; of Python numbers past 64 bits, `_first_moves` (its oracle)."""
    free_code = ACTIONS.index(free_action)
    if native is None or a.addr.dtype != np.uint64 or (at_dump and not (
            0 <= at_dump[0] and at_dump[-1] < 2**64)):      # (numpy 1.x wraps, not raises)
        return _first_moves(a.action.tolist(), a.addr.tolist(), free_code, at_dump)
    freed, allocated, inconsistent = native.first_moves(
        np.ascontiguousarray(a.action), np.ascontiguousarray(a.addr), ALLOC, free_code,
        np.array(at_dump, dtype=np.uint64))
    return (np.frombuffer(freed, np.int64), np.frombuffer(allocated, np.uint64).tolist(),
            inconsistent)


def _first_moves(actions: list[int], addrs: list[int], free_code: int, at_dump: list[int]
                 ) -> tuple[np.ndarray, list[int], int]:
    last: dict[int, bool] = {}            # address -> its last move is an alloc
    freed, allocated, inconsistent = [], [], 0
    for position, (code, addr) in enumerate(zip(actions, addrs)):
        if code != ALLOC and code != free_code:
            continue
        allocating = code == ALLOC
        if addr in last:
            inconsistent += last[addr] == allocating
        elif allocating:
            allocated.append(addr)
        else:
            freed.append(position)
        last[addr] = allocating
    dumped = set(at_dump)
    inconsistent += sum(allocating != (addr in dumped) for addr, allocating in last.items())
    return np.array(freed, dtype=np.int64), allocated, inconsistent


def _block_nodes(a, actions: tuple[str, str], low: int, high: int, ranges: _Segments,
                 nodes: _PoolNodes, entry_nodes: np.ndarray) -> None:
    """The node of the segment that holds each alloc and free (`actions`) in entries
    [low, high), between two segment entries (so in one state of the segments), and what their
    pool_id fields say (the latest first, as the walk back meets them)."""
    if high <= low or not ranges.starts:
        return
    starts, sizes, node_at = ranges.columns()
    told = a.cache.get("pool_ids")
    if told is None:
        told = a.cache["pool_ids"] = np.array(
            [extra.get("pool_id") is not None for extra in a.extras], dtype=bool)
    telling = told.any()                       # (no entry names its pool before PyTorch 2.12)
    kept, held = [], []                        # the entries that name their pool, and nodes
    for begin in range(low, high, _CHUNK):     # (a chunk at a time: bounded temporaries)
        part = begin + np.flatnonzero(having(a.action[begin:min(begin + _CHUNK, high)], *actions))
        addrs = a.addr[part]
        index = np.searchsorted(starts, addrs, side="right") - 1
        inside = index >= 0
        inside[inside] = addrs[inside] - starts[index[inside]] < sizes[index[inside]]
        part, node = part[inside], node_at[index[inside]]
        entry_nodes[part] = node
        if telling:
            said = told[a.extra[part]]
            kept.append(part[said])
            held.append(node[said])
    if not telling or not kept:
        return
    run, held = np.concatenate(kept)[::-1], np.concatenate(held)[::-1]
    if not len(run):
        return
    # learning is idempotent per (node, fields): the first of each pair decides
    _, first = np.unique(held.astype(np.int64) * len(a.extras) + a.extra[run], return_index=True)
    for position, node in zip(run[np.sort(first)].tolist(), held[np.sort(first)].tolist()):
        nodes.told(node, read_pool_id(a.extras[a.extra[position]].get("pool_id")))


def _between(a, pools: dict[int, tuple], ooms: list[int]) -> dict[int, tuple]:
    """For each entry of `ooms`, the pool of the requests just before and after it on its
    stream, where they agree: by a bisect in each stream's requests (a walk from each OOM to
    its neighbours cost entries times OOMs, minutes on a trace of refused requests)."""
    allocs = np.flatnonzero(a.action == ALLOC)
    streams = a.stream[allocs]
    by_stream = {}
    for stream in np.unique(a.stream[ooms]).tolist():
        by_stream[stream] = allocs[streams == stream]
    out = {}
    for index, stream in zip(ooms, a.stream[ooms].tolist()):
        mine = by_stream[stream]
        at = int(np.searchsorted(mine, index))
        before = pools.get(int(mine[at - 1])) if at else None
        after = pools.get(int(mine[at])) if at < len(mine) else None   # (an oom is no alloc)
        if before == after:
            out[index] = before
    return out


def _during_captures(entries, pools: dict[int, tuple]) -> set[int]:
    """Requests to the default pools made while a capture was under way: between two requests of
    one private pool on a stream with no default request there between (c10 then skips the
    release of cached segments in the out-of-memory retry)."""
    a = arrays(entries)
    private = {index: pool for index, pool in pools.items()
               if pool != DEFAULT_POOL and 0 <= index < len(a)}
    if not private:
        return set()                        # no private pool: no capture
    requests = positions_where(having(a.action, "alloc", "oom")).astype(np.int64)
    if not len(requests):
        return set()
    codes = np.zeros(len(requests), np.int64)          # each request's pool: 0 the default
    named = np.fromiter(private, np.int64, len(private))
    at = np.minimum(np.searchsorted(requests, named), len(requests) - 1)
    hit = requests[at] == named
    numbers: dict[tuple, int] = {}
    codes[at[hit]] = [numbers.setdefault(private[index], len(numbers) + 1)
                      for index in named[hit].tolist()]
    # each stream's requests in order, cut in runs of one pool: a private run is a span
    _, streams = np.unique(a.stream[requests], return_inverse=True)
    order = np.argsort(streams, kind="stable")
    run_codes, run_streams, run_requests = codes[order], streams[order], requests[order]
    first = np.flatnonzero(np.r_[True, (run_codes[1:] != run_codes[:-1]) |
                                 (run_streams[1:] != run_streams[:-1])])
    last = np.r_[first[1:], len(order)] - 1
    spans = run_codes[first] != 0
    low = np.searchsorted(requests, run_requests[first[spans]], side="right")
    high = np.searchsorted(requests, run_requests[last[spans]], side="left")
    inside = np.zeros(len(requests) + 1, np.int64)    # the requests strictly inside a span
    np.add.at(inside, low[high > low], 1)
    np.add.at(inside, high[high > low], -1)
    return set(requests[(np.cumsum(inside[:-1]) > 0) & (codes == 0)].tolist())


def _infer_pools(entries: list[dict], nodes: _PoolNodes, entry_nodes: dict[int, int],
                 max_split_size: int, start=None) -> None:
    """Learn the pools the dump and the entries left unknown, until nothing more is learned.
    `start`: (bytes, live blocks) of each segment node at the first entry and the action that
    frees a block, when every release frees all idle segments it may."""
    requests: list[tuple[int, int, int]] = []   # (entry index, stream, node) of each request
    runs, run = [], []                      # each run of segment frees: its entry indices
    for index, (action, _, _, stream, *_) in enumerate(rows(entries)):
        node = entry_nodes.get(index)
        if action in SEGMENT_REMOVE:
            if node is not None:
                run.append(index)
            continue
        if run:
            runs.append(run)
            run = []
        if action == "alloc" and node is not None:
            requests.append((index, stream, node))
    if run:
        runs.append(run)
    freed = [[entry_nodes[index] for index in run] for run in runs]
    first_free: dict[int, int] = {}         # node -> the entry that first frees it
    for index in (index for run in runs for index in run):
        if entries[index].get("size", 0) < max_split_size:      # an oversize free: any time
            first_free.setdefault(nodes.find(entry_nodes[index]), index)
    last_use: dict[tuple, int] = {}

    def fits(node: int, pool: tuple) -> bool:
        """A private pool's segment goes back only once the pool is released, and a released
        pool serves no request after: a segment freed before a pool's last request is not
        that pool's (unless an oversize free, with max_split_size, took it)."""
        freed_at = first_free.get(nodes.find(node))
        return pool == DEFAULT_POOL or freed_at is None or last_use.get(pool, -1) < freed_at

    while True:
        last_use.clear()
        last_use.update((nodes.of(node), index) for index, _, node in requests)
        if not (_by_neighbours(nodes, requests) | _by_release(nodes, freed, fits)
                | (start is not None and _by_what_releases_kept(entries, nodes, entry_nodes, runs,
                                                                *start))):
            return


def _by_neighbours(nodes: _PoolNodes, requests: list[tuple[int, int, int]]) -> bool:
    """A segment whose requests lie between default requests on their stream (and none between
    two of a private pool's) is taken as default, by a guess: a capture can lie between two
    default requests, and one pool's captures can have default requests between them, so
    neighbours tell no private pool."""
    by_stream: dict[int, list[tuple[int, int]]] = {}
    for index, stream, node in requests:
        by_stream.setdefault(stream, []).append((index, node))
    node_at = {index: node for index, _, node in requests}
    votes: dict[int, set] = {}
    for sequence in by_stream.values():
        for index, pool in _brackets(nodes, sequence).items():
            votes.setdefault(nodes.find(node_at[index]), set()).add(pool)
    learned = False
    for root, pools in votes.items():
        if pools == {DEFAULT_POOL}:
            learned |= nodes.guess_default(root)
    return learned


def _brackets(nodes: _PoolNodes, sequence: list[tuple[int, int]]) -> dict[int, tuple]:
    """Each request of unknown pool in `sequence` ((entry index, node), in order) whose nearest
    requests of known pool on both sides agree: that pool."""
    known = [nodes.of(node) for _, node in sequence]
    before, previous = None, []
    for pool in known:
        previous.append(before)
        before = pool or before
    found, after = {}, None
    for position in range(len(sequence) - 1, -1, -1):
        pool = known[position]
        if pool is None and after is not None and previous[position] == after:
            found[sequence[position][0]] = after
        after = pool or after
    return found


def _by_what_releases_kept(entries, nodes: _PoolNodes, entry_nodes: dict[int, int], runs,
                           held: Counter, users: Counter, free_action: str) -> bool:
    """A run of segment frees that freed a default segment was a whole release (empty_cache or
    the out-of-memory retry: release_cached_blocks), which frees every idle segment of the
    default and the released pools: an idle segment it kept belongs to a pool in use. A run
    that kept an idle default segment released a pool (emptyCache(id) of a deleted MemPool,
    or a release during a capture): what it freed was private."""
    if not runs:
        return False                        # no release: nothing kept to tell by
    held, users = Counter(held), Counter(users)
    learned = False
    ends = {run[0]: run for run in runs}
    for index, (action, _, size, *_) in enumerate(rows(entries)):
        node = entry_nodes.get(index)
        root = None if node is None else nodes.find(node)
        run = ends.get(index)
        if run is not None:
            freed = {nodes.find(entry_nodes[i]) for i in run}
            idle = [n for n, size in held.items() if size > 0 and not users[n] and n not in freed]
            for label in (nodes.of, nodes.seems):       # what is known first, then guesses
                whole = any(label(n) == DEFAULT_POOL for n in freed)
                kept_default = any(label(n) == DEFAULT_POOL for n in idle)
                if whole != kept_default:
                    for n in idle if whole else freed:
                        learned |= nodes.learn(n, (-1, index))
                    break
                if whole:                               # both: a guess is wrong, but which
                    break
        if root is None:
            continue
        if action == "alloc":
            users[root] += 1
        elif action == free_action:
            users[root] -= 1
        elif action in SEGMENT_ADD:
            held[root] += size
        elif action in SEGMENT_REMOVE:
            held[root] -= size
    return learned


def _by_release(nodes: _PoolNodes, runs: list[list[int]], fits) -> bool:
    """Segments freed in one run with segments of one private pool, and none known to be
    default, went back with that pool when it was released."""
    learned = False
    for run in runs:
        known = {nodes.of(node) for node in run} - {None}
        if len(known) == 1 and DEFAULT_POOL not in known:
            pool = known.pop()
            for node in run:
                if fits(node, pool):
                    learned |= nodes.learn(node, pool)
    return learned


def _place_blocks(ranges, live, config, inconsistent, nodes: _PoolNodes,
                  lowest: dict[int, int]) -> StartState:
    """Lay the live blocks into their segments; the gaps between them are cached free blocks."""
    starts = sorted(ranges)
    by_segment: dict[int, list[StartBlock]] = {start: [] for start in starts}
    unplaced = 0
    for block in sorted(live.values(), key=lambda b: b.addr):
        index = bisect_right(starts, block.addr) - 1
        if index < 0 or block.addr >= starts[index] + ranges[starts[index]][0]:
            unplaced += 1
            continue
        by_segment[starts[index]].append(block)
    segments = []
    for start in starts:
        size, stream, small, expandable, node = ranges[start]
        end = start + size
        blocks, cursor = [], start
        placed = by_segment[start]
        for position, block in enumerate(placed):
            if block.addr < cursor:           # overlaps the block before it: drop it
                unplaced += 1
                continue
            if block.addr > cursor:
                blocks.append(StartBlock(cursor, block.addr - cursor, 0, False))
            limit = placed[position + 1].addr if position + 1 < len(placed) else end
            block.size = _start_block_size(block, limit, small, expandable, config)
            blocks.append(block)
            cursor = block.addr + block.size
        if cursor < end:
            blocks.append(StartBlock(cursor, end - cursor, 0, False))
        segments.append(StartSegment(start, size, stream, small, expandable, blocks,
                                     nodes.of(node) or DEFAULT_POOL,
                                     lowest.get(nodes.find(node)) if expandable else None))
    placed_live = {b.addr: b for s in segments for b in s.blocks if b.allocated}
    return StartState(segments, placed_live, unplaced, inconsistent,
                      len({nodes.find(node) for node in nodes.contradicted}))


def _start_block_size(block: StartBlock, limit: int, small: bool, expandable: bool,
                      config: TorchAllocatorConfig) -> int:
    """A block allocated before the trace: its rounded size, plus the rest of the gap when
    the allocator would not have split that rest off."""
    room = limit - block.addr
    if block.size:
        return min(block.size, room)
    size = min(round_size(block.requested, config), room)
    remaining = room - size
    if small or expandable:
        keep = remaining < MIN_BLOCK
    else:
        keep = size >= config.max_split_size or remaining <= SMALL_SIZE
    return room if keep else size
