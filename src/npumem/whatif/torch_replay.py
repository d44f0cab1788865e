"""Replay a PyTorch recording through the model of PyTorch's allocator, from the recording's
start state, and compare what the model did with what the real allocator did.

Each trace entry becomes a call on the model: `alloc` -> malloc, the free that makes a block
reusable -> free, `oom` -> a request the real allocator refused, and a run of segment frees that
no failed allocation caused -> empty_cache(). The device's capacity matters only where the
recording ran into it (a retry that freed cached segments, or an OOM); it is then inferred from
the trace, so the model meets the same wall at the same place: a full device as the device's
capacity, a cap below the device (set_per_process_memory_fraction) as that fraction's limit,
which c10 checks otherwise (the allocator model says how).

Each request goes to the pool that served it (the start state says which, recording.py): the
default pools or a CUDA graph's or MemPool's private pool. Frees of a private pool's segments
mean it had been released (graph reset, MemPool deleted): the replay releases it there.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from ..alloc.torch_model import (DEFAULT_POOL, DeviceMemory, ModelOutOfMemory,
                                 TorchAllocatorConfig, TorchAllocatorModel)
from ..units import format_size
from ..alloc.torch_model.allocator import allowed_bytes, round_size
from ..alloc.torch_model.config import settings_variable
from ..trace.snapshot import SEGMENT_ADD, SEGMENT_REMOVE, Recording, first_oom, read_pool_id
from ..trace.snapshot.columns import arrays, highest_address, indices, rows, take
from ..trace.snapshot.schema import oom_device_free
from . import replay_cores


@dataclass
class Divergence:
    index: int                 # trace entry where the model first did something else
    request: str               # what was asked there
    recorded: list[str]        # what the real allocator did for it
    model: list[str]           # what the model did

    def describe(self) -> str:
        return (f"entry {self.index}: {self.request}\n"
                f"  recorded: {'; '.join(self.recorded) or 'no segment event'}\n"
                f"  model:    {'; '.join(self.model) or 'no segment event'}")


@dataclass
class TorchReplay:
    trace: str
    flavour: str
    settings: str                         # the allocator settings replayed ("" = defaults)
    capacity: int | None                  # the bytes the model could hold: the device's, or a
                                          # memory fraction's limit (None: no limit)
    events: int
    start_reserved_bytes: int
    start_allocated_bytes: int
    peak_allocated_bytes: int             # requested bytes live at the peak, start state included
    peak_reserved_bytes: int              # start state included
    device_allocs: int                    # segment allocations during the trace
    device_frees: int
    recorded_peak_reserved_bytes: int | None
    recorded_device_allocs: int | None
    recorded_device_frees: int | None
    unmatched_frees: int = 0
    oom: dict | None = None               # the first request the model could not serve
    divergence: Divergence | None = None
    misplaced_blocks: int = 0             # allocs the model put at another address
    cache_hit_rate: float = 0.0           # requests served from cached blocks
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    # the recording's own first OOM (oom_facts), so whoever shows it need not read the file
    # again: {} where the run did not die, None where this replay did not look
    recorded_oom: dict | None = None
    variable: str = ""                    # the one the recording's PyTorch reads its settings from

    @property
    def faithful(self) -> bool:
        return (self.divergence is None and self.recorded_peak_reserved_bytes is not None
                and self.peak_reserved_bytes == self.recorded_peak_reserved_bytes
                and self.device_allocs == self.recorded_device_allocs)

    def as_dict(self) -> dict:
        data = asdict(self)
        del data["recorded_oom"]                 # for the command's own lines, not a figure
        data["faithful"] = self.faithful
        return data


def _describe(entry: dict) -> str:
    action = entry["action"]
    if action in ("alloc", "oom"):
        return f"{action} {format_size(entry.get('size', 0))} ({entry.get('size', 0)} bytes) " \
               f"on stream {entry.get('stream', 0)}"
    return f"{action} 0x{entry.get('addr', 0):x} ({entry.get('size', 0)} bytes)"


def _event_text(action: str, addr: int, size: int) -> str:
    if action == "oom":                 # addr: the free bytes (the model's and PyTorch's)
        return f"oom ({format_size(addr)} free)"
    return f"{action} 0x{addr:x} {format_size(size)} ({size} bytes)"


def plan_calls(recording: Recording, pools: dict[int, tuple] | None = None):
    """(index, call, entry) for each entry the model must act on, and the recorded segment
    events (each_call's), as two lists."""
    recorded: list = []
    return list(each_call(recording, pools or {}, recorded)), recorded


def each_call(recording: Recording, pools: dict[int, tuple], recorded: list, start: int = 0):
    """Yield (index, call, entry) for each entry the model must act on, where call is alloc,
    free, oom, empty_cache or frees_before, one at a time (a replay holds the live state, not a
    list of every call). The recorded segment events go on `recorded`, as (index of the call
    they belong to, entry), before that call is yielded. `pools` (entry index -> pool,
    StartState.pools) gives the pool of each segment freed: the calls that free segments carry
    them, in order, as `free_pools`. `start`: the first entry to look at (one where no call is
    under way: a replay's plain entries end there)."""
    entries = recording.entries
    free_action = recording.free_action
    pending: list[int] = []              # segment events waiting for the request they serve
    run_start = None

    def frees() -> tuple[list[dict], list[tuple]]:
        freed = [i for i in pending if entries[i]["action"] in SEGMENT_REMOVE]
        return [entries[i] for i in freed], [pools.get(i, DEFAULT_POOL) for i in freed]

    for index, (action, addr, size, stream, time_us, *_) in enumerate(_rows_from(entries, start),
                                                                     start):
        if action in SEGMENT_REMOVE:
            if run_start is None:
                run_start = index
            pending.append(index)
            continue
        if run_start is not None and action not in SEGMENT_ADD and action != "oom":
            # a run of frees that no failed allocation caused: empty_cache()
            call = (run_start, "empty_cache", dict(entries[run_start], free_pools=frees()[1]))
            recorded += [(run_start, entries[i]) for i in pending]
            pending = []
            yield call
        run_start = None
        if action in SEGMENT_ADD:
            pending.append(index)
            continue
        # what the model reads of a request or a free (a whole entry dict costs more to make)
        entry = {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": time_us}
        if action in ("alloc", "oom"):
            freed, free_pools = frees() if pending else ((), ())
            if pending:
                recorded += [(index, entries[i]) for i in pending]
                pending = []
            if action == "oom":
                recorded.append((index, entries[index]))     # with its device_free
            if freed:
                # frees right before a request: empty_cache() then the request, or the
                # request's own retry; the replay tells them apart
                yield index, "frees_before", dict(entry, frees=freed, free_pools=free_pools)
            yield index, action, entry
        elif action == free_action:
            yield index, "free", entry
    if run_start is not None:
        call = (run_start, "empty_cache", dict(entries[run_start], free_pools=frees()[1]))
        recorded += [(run_start, entries[i]) for i in pending]
        yield call


def _rows_from(entries, start: int):
    """`rows` of the entries from `start` on, a few at a time at first: where a replay hands
    over mid-trace, the calls it wants are a handful of entries."""
    if not start:
        yield from rows(entries)
        return
    step = 16
    while start < len(entries):
        yield from rows(entries[start:start + step])
        start += step
        step = min(step * 2, 1 << 16)


UNLIMITED = -1          # replay_recording's capacity: no limit, even where the recording ran out


@dataclass
class CapacityBounds:
    """What a recording that ran out of memory says of the device bytes PyTorch could use:
    every segment it got fitted, the segment it asked for at the OOM did not. `low` is the
    most it ever held, `high` the most consistent with the failure. When the driver's free bytes
    (`device_free`) were too few for the segment, the device was full and the limit is exact;
    otherwise a cap such as set_per_process_memory_fraction stopped it, somewhere in
    [low, high]."""

    low: int
    high: int
    device_full: bool
    exact: bool = False                   # the limit itself, not a range judged at its low end

    def caveat(self) -> str:
        """Why the limit judged on is not known exactly ("" when it is)."""
        if self.exact:
            return ""
        if self.device_full:
            return (f"judged on {format_size(self.low)}, the most the run held: the device had "
                    f"less free at the OOM, so other memory use grew meanwhile")
        if self.low == self.high:
            return (f"judged on {format_size(self.low)}: the run failed before holding anything, "
                    f"so a cap (set_per_process_memory_fraction?) lay below that; --memory sets it")
        return (f"the limit was a cap below the device (set_per_process_memory_fraction?): judged "
                f"on {format_size(self.low)}, the most the run held; it lay between that and "
                f"{format_size(self.high)} (--memory sets it)")


def capacity_bounds(recording: Recording, start_reserved: int) -> CapacityBounds | None:
    """None when the trace never ran out (a retry's frees are replayed as recorded; they need
    no limit)."""
    sizer = TorchAllocatorModel(recording.base_config())
    reserved = most = start_reserved
    low, highs, full = 0, [], False
    entries = recording.entries
    for index in indices(entries, *SEGMENT_ADD, *SEGMENT_REMOVE, "oom"):
        entry = entries[index]
        action = entry["action"]
        if action in SEGMENT_ADD:
            reserved += entry.get("size", 0)
            most = max(most, reserved)
        elif action in SEGMENT_REMOVE:
            reserved -= entry.get("size", 0)
        elif action == "oom":
            low = max(low, most)
            free = oom_device_free(entry)
            size = round_size(entry.get("size", 0), sizer.config)
            if free < sizer.segment_size(size):     # the device itself was full
                highs.append(reserved + free)
                full = True
            else:                                   # a memory fraction stopped it: its check
                highs.append(reserved + sizer.allocation_size(size) - 1)    # counts this
    if not highs:
        return None
    limits = recording.limits
    if limits is not None and limits["allowed"] < limits["device_total"]:
        # the OOM observer was told the fraction's limit: the cap, exactly
        return CapacityBounds(limits["allowed"], limits["allowed"], False, exact=True)
    high = min(highs)
    if full:
        # exact, unless the run held more before than the device had at the OOM (something
        # else took memory meanwhile): then the most it held, which it certainly had
        return CapacityBounds(max(low, high), max(low, high), True, exact=high >= low)
    # a run that held nothing before its first request failed: judge on the most it could
    return CapacityBounds(min(low, high) or high, high, False)


def device_total(recording: Recording) -> int | None:
    """The device's memory as the OOM observer reported it (None: not kept)."""
    return recording.limits["device_total"] if recording.limits is not None else None


CHUNK = 1 << 18                      # entries played between progress reports


def replay_recording(recording: Recording, config: TorchAllocatorConfig | None = None,
                     capacity: int | None = None, check: bool = False,
                     progress=None, allowed: int | None = None,
                     native: bool | None = None, events: list | None = None) -> TorchReplay:
    """Run the recording through the model. `capacity` None: inferred where the recording hit
    a limit (the device's, or a memory fraction's: then as `allowed`), else unlimited;
    UNLIMITED: no limit whatever the recording shows. `allowed`: a memory fraction's limit in
    bytes (c10's allowed_memory_maximum), on the device the recording ran on (`capacity`
    None) or on `capacity`. `check` stops at the first divergence from the recorded segment
    events. `native` None: the native model where it covers the recording and the settings
    (replay_cores), False: the Python model. `events`: a list that receives the model's
    segment events as (entry position, event), for a curve of what it reserves."""
    config = config or TorchAllocatorConfig(recording.flavour)
    started = time.perf_counter()
    start = recording.start_state(config)
    notes = list(recording.read_notes)
    if capacity == UNLIMITED:
        capacity = None
    elif capacity is not None and capacity < start.reserved:
        notes.append(f"the device of {format_size(capacity)} is smaller than the "
                     f"{format_size(start.reserved)} PyTorch had reserved before the trace "
                     f"began: it cannot hold even that (free memory shows below 0)")
    elif capacity is None and allowed is None:
        bounds = capacity_bounds(recording, start.reserved)
        if bounds is not None:
            if bounds.device_full:
                capacity = bounds.low
            else:
                allowed = bounds.low
            notes.append(f"the recording ran out of memory; replayed with the "
                         f"{format_size(bounds.low)} it could use"
                         + ("" if bounds.device_full else " under a memory fraction")
                         + (f" ({bounds.caveat()})" if bounds.caveat() else ""))
    if allowed is not None and capacity is None:
        capacity = device_total(recording)
    core = _core(recording, config, start, capacity, allowed, native)
    a = arrays(recording.entries)
    kinds = replay_cores.kinds(recording.free_action)
    recorded: list = []
    model_events: list[tuple[int, object]] = []
    oom = divergence = None
    compared = 0
    index, length = 0, len(a)
    stopped = None                        # the call a replay stopped at (an OOM, a divergence)
    said = 0                              # where progress was last said: every CHUNK entries,
    while index < length and stopped is None:   # whatever stops each run
        if progress is not None and index >= said + CHUNK:
            progress(index)
            said = index
        at, why = core.run(kinds, a.action, a.addr, a.size, a.stream, index,
                           min(length, index + CHUNK), check or events is not None)
        if why == replay_cores.DONE:
            index = at
        elif why == replay_cores.OUT_OF_MEMORY:
            oom = _oom_record(at, core.oom_error())
            model_events += [(at, e) for e in core.new_events()]
            stopped = at
        elif why == replay_cores.EVENTS:       # (check or events) an alloc that made segments
            model_events += [(at - 1, e) for e in core.new_events()]
            index = at
            if check:
                divergence, compared = _compare(recording, recorded, model_events, at - 1,
                                                compared)
                if divergence is not None:
                    stopped = at - 1
        else:
            index, oom, divergence, compared, stopped = _irregular(
                recording, core, a, kinds, at, check, recorded, model_events, compared, oom, notes)
    if check and divergence is None and oom is None:
        divergence, compared = _compare(recording, recorded, model_events, len(recording.entries),
                                        compared)
    if events is not None:
        events += model_events
    counts = core.counts()                    # (a replay that stopped: of what it played)
    recorded_peak, recorded_allocs, recorded_frees = _recorded_totals(recording, start.reserved)
    if not recording.segments and not recording.recorded_segment_events():
        recorded_peak = recorded_allocs = recorded_frees = None     # not a PyTorch recording
    if start.reserved and recording.continues is None:
        notes.append(f"the trace begins mid-run: {format_size(start.reserved)} was reserved and "
                     f"{format_size(start.allocated)} live before its first entry (recording began "
                     f"later, or its ring buffer dropped older entries); peaks count them, what "
                     f"came before is unseen")
    if start.unplaced:
        notes.append(f"{start.unplaced} block(s) live at the start lie outside every segment")
    if start.inconsistent:
        notes.append(f"{start.inconsistent} trace entr(ies) contradict the snapshot's segments")
    if start.contradicted:
        notes.append(f"the trace's pool_id fields name another pool than the snapshot's "
                     f"segment_pool_id (or a later entry) for {start.contradicted} segment(s): "
                     f"they replay in the pool the dump (or the latest entry) names")
    return TorchReplay(
        trace=recording.path, flavour=config.flavour, settings=config.describe(),
        capacity=core.allowed if core.allowed is not None else capacity,
        events=len(recording.entries),
        start_reserved_bytes=start.reserved, start_allocated_bytes=start.allocated,
        peak_allocated_bytes=counts.peak_allocated, peak_reserved_bytes=counts.peak_reserved,
        device_allocs=counts.device_allocs, device_frees=counts.device_frees,
        recorded_peak_reserved_bytes=recorded_peak, recorded_device_allocs=recorded_allocs,
        recorded_device_frees=recorded_frees, unmatched_frees=counts.unmatched, oom=oom,
        divergence=divergence, misplaced_blocks=counts.misplaced,
        cache_hit_rate=counts.cache_hits / counts.requests if counts.requests else 0.0,
        seconds=time.perf_counter() - started, notes=notes,
        variable=settings_variable(config.flavour, recording.torch_version))


def _core(recording: Recording, config: TorchAllocatorConfig, start, capacity: int | None,
          allowed: int | None, native: bool | None):
    """The model the replay plays through, in the start state, with the driver handing out
    the recorded segments' addresses."""
    fresh = max([0, highest_address(recording.entries)] +
                [s["address"] for s in recording.segments]) + (1 << 40)
    fresh_base = -(-fresh // (1 << 30)) * (1 << 30)
    expected = [(e["addr"], e["size"]) for e in
                take(recording.entries, indices(recording.entries, "segment_alloc"))]
    pools, captured = _pools_of(recording, start)
    if native is not False:
        limit = allowed_bytes(config, capacity, allowed)
        why_not = replay_cores.native_covers(config, limit, arrays(recording.entries),
                                             fresh_base, capacity)
        if not why_not:
            return replay_cores.NativeCore(config, capacity, limit, fresh_base, expected,
                                           start.segments, start.allocated, pools, captured,
                                           len(recording.entries))
        if native:
            raise ValueError(f"the native model does not cover this replay: {why_not}")
    device = DeviceMemory(capacity, fresh_base=fresh_base)
    for addr, size in expected:
        device.expect("malloc", addr, size)
    model = TorchAllocatorModel(config, device, allowed)
    live = model.restore(start.segments)
    return replay_cores.PythonCore(model, live, start.allocated, pools, captured)


def _irregular(recording, core, a, kinds, index, check, recorded, model_events, compared, oom,
               notes):
    """Play the calls from entry `index` (a segment event or a recorded OOM) through the next
    request: (where plain entries resume, oom, divergence, compared, the call stopped at)."""
    model = core.model
    pools = getattr(core, "pools", {})
    for at, call, entry in each_call(recording, pools, recorded, index):
        pool = pools.get(at, DEFAULT_POOL)             # the pool that served the request
        if call in ("alloc", "free"):
            _, why = core.run(kinds, a.action, a.addr, a.size, a.stream, at, at + 1, False)
            if why == replay_cores.OUT_OF_MEMORY:
                oom = _oom_record(at, core.oom_error())
                model_events += [(at, e) for e in core.new_events()]
                return len(a), oom, None, compared, at
        elif call == "empty_cache":
            _release(model, entry["free_pools"])
        elif call == "frees_before":
            _frees_before(model, entry, pool)
        elif call == "oom":
            if core.oom_request(at, entry.get("size", 0), int(entry.get("stream") or 0)):
                if oom is None:
                    notes.append(f"entry {at}: the recorded out-of-memory request "
                                 f"({format_size(entry.get('size', 0))}) fits under these settings")
            else:
                oom = oom or _oom_record(at, core.oom_error())
        model_events += [(at, e) for e in core.new_events()]
        if check and call != "frees_before":
            divergence, compared = _compare(recording, recorded, model_events, at, compared)
            if divergence is not None:
                return len(a), oom, divergence, compared, at
        if call in ("alloc", "oom"):
            return at + 1, oom, None, compared, None
    return len(a), oom, None, compared, None


def oom_facts(recording: Recording, replayed: TorchReplay | None = None) -> dict | None:
    """What a report says of the recording's first out-of-memory (profile.oom formats it): the
    entry, its place, the OOM entries after it, and the model's state at it under PyTorch's
    defaults (`replayed`, if already made so). None when the run never ran out."""
    entries = recording.entries
    index = first_oom(entries)
    if index is None:
        return None
    replayed = replayed if replayed is not None else replay_recording(recording)
    return {"index": index, "entries": len(entries), "entry": entries[index],
            "later": len(indices(entries, "oom")) - 1,
            "model_oom": replayed.oom}


def _pools_of(recording: Recording, start) -> tuple[dict[int, tuple], set[int]]:
    """The start state's pools of the entries, and its requests made during captures; of a
    recording played on past its end, those of the part it shares with the recorded one."""
    if recording.continues is None:
        return start.pools, start.captured
    shared = recording.shared
    return ({i: pool for i, pool in start.pools.items() if i < shared},
            {i for i in start.captured if i < shared})


def _frees_before(model: TorchAllocatorModel, entry: dict, pool: tuple) -> None:
    """Segment frees right before a request to `pool`. Its own retry frees oversize blocks of
    its pool and, outside a capture, the default and the released pools' cached segments;
    frees it cannot have made came from an empty_cache() or a MemPool's deletion before it."""
    first = _calls(entry["free_pools"])[-1][0]          # the last call's frees may be its own
    _release(model, entry["free_pools"][:first])
    entry = dict(entry, frees=entry["frees"][first:], free_pools=entry["free_pools"][first:])
    free_pools = entry["free_pools"]
    if pool == DEFAULT_POOL and DEFAULT_POOL in free_pools:
        _released(model, free_pools)
        _free_before_request(model, entry)
    elif pool != DEFAULT_POOL and set(free_pools) == {pool}:
        with model.routed(pool):
            _free_before_request(model, entry)
    else:                                   # the request's pool is in use: none of its frees
        _release(model, [freed for freed in free_pools if freed != pool])


def _calls(free_pools: list[tuple]) -> list[tuple[int, int]]:
    """(first, end) of the frees of each call that made these: a default pool's free after a
    private pool's starts another (empty_cache() frees the default pools first)."""
    starts = [0] + [i for i in range(1, len(free_pools))
                    if free_pools[i] == DEFAULT_POOL != free_pools[i - 1]]
    return list(zip(starts, starts[1:] + [len(free_pools)]))


def _release(model: TorchAllocatorModel, free_pools: list[tuple]) -> None:
    """Segment frees that no request made, from these pools in this order: empty_cache(), which
    frees the default pools' segments and then the released private pools', or a deleted
    MemPool's emptyCache(id), which frees its own."""
    for first, end in _calls(free_pools):
        group = free_pools[first:end]
        private = _released(model, group)
        if DEFAULT_POOL in group:
            model.empty_cache()
        else:
            for pool in private:
                model.empty_cache(pool)


def _released(model: TorchAllocatorModel, pools: list[tuple]) -> list[tuple]:
    """The private pools among `pools`, released (use count 0) by now since their segments go,
    last in the model's released pools in this order: c10 frees released pools in its hash
    map's order, which only the recording shows."""
    private = [pool for pool in dict.fromkeys(pools) if pool != DEFAULT_POOL]
    for pool in private:
        model.release_fully(pool)
    return private


def _free_before_request(model: TorchAllocatorModel, entry: dict) -> None:
    """Segments freed right before a request: the recording says the driver refused memory
    (or the program called empty_cache()), or, under a memory fraction, the request's garbage
    collection freed them; the model decides what to free. Frees that begin with what its
    collection frees are the request's own: its malloc makes them all (the collection, then the
    retry if it still does not fit). Its retry frees the oversize blocks it picks (with
    max_split_size), then every unsplit cached block, which is what empty_cache() frees too;
    an empty_cache() call is also all a request that a cached block could serve can have been
    preceded by."""
    size, stream = entry.get("size", 0), int(entry.get("stream") or 0)
    freed = [e.get("addr") for e in entry["frees"]]
    collected = model.collected(size, stream)
    if collected and freed[:len(collected)] == collected:
        return
    first = [] if model.would_reuse(size, stream) else model.oversize_release(size, stream, dry_run=True)
    if first and freed[:len(first)] == first:
        model.oversize_release(size, stream)
        if len(freed) == len(first):
            return
    model.empty_cache()


def _oom_record(index: int, exc: ModelOutOfMemory) -> dict:
    return {"index": index, "request_bytes": exc.request, "alloc_bytes": exc.alloc_size,
            "free_bytes": exc.free, "reserved_bytes": exc.reserved,
            "allocated_bytes": exc.allocated, "largest_free_bytes": exc.largest_free,
            "message": str(exc)}


def _recorded_totals(recording: Recording, start_reserved: int):
    reserved = peak = start_reserved
    allocs = frees = 0
    for entry in take(recording.entries, indices(recording.entries, *SEGMENT_ADD, *SEGMENT_REMOVE)):
        if entry["action"] in SEGMENT_ADD:
            reserved += entry.get("size", 0)
            allocs += 1
            peak = max(peak, reserved)
        elif entry["action"] in SEGMENT_REMOVE:
            reserved -= entry.get("size", 0)
            frees += 1
    return peak, allocs, frees


def _compare(recording, recorded, model_events, upto: int, compared: int):
    """Compare the segment events of entries up to `upto`, from position `compared` on; the
    first difference, or None and how far both agree."""
    limit = compared
    while limit < len(recorded) and recorded[limit][0] <= upto:
        limit += 1
    for position in range(compared, max(limit, len(model_events))):
        if position >= limit or position >= len(model_events):
            index = (model_events[position][0] if position < len(model_events)
                     else recorded[position][0])
            return _divergence(recording, recorded, model_events, index), position
        (r_index, r_entry), (m_index, m_event) = recorded[position], model_events[position]
        # (an expandable segment's address range is the driver's pick: its maps compare by size)
        same = (r_entry["action"] == m_event.action and
                (r_entry["action"] == "oom" or (r_entry.get("size") == m_event.size and (
                    r_entry.get("addr") == m_event.addr or m_event.action in SEGMENT_ADD[1:] +
                    SEGMENT_REMOVE[1:]))))
        recorded_pool = read_pool_id(r_entry.get("pool_id"))    # the newest PyTorch writes it
        same = same and recorded_pool in (None, m_event.pool)
        if not same:
            return _divergence(recording, recorded, model_events, min(r_index, m_index)), position
    return None, limit


def _divergence(recording, recorded, model_events, index) -> Divergence:
    mine = [e for i, e in recorded if i == index]
    # where the recording names pools, both sides say theirs (they may differ in that alone)
    named = [read_pool_id(e.get("pool_id")) for e in mine]
    pools = any(pool is not None for pool in named)
    return Divergence(
        index, _describe(recording.entries[index]),
        [_event_text(e["action"], oom_device_free(e) if e["action"] == "oom" else e.get("addr", 0),
                     e.get("size", 0)) + (f" in pool {pool}" if pool is not None else "")
         for e, pool in zip(mine, named)],
        [_event_text(e.action, e.addr, e.size) + (f" in pool {e.pool}" if pools else "")
         for i, e in model_events if i == index])


def load_for_model(path: str, flavour: str | None = None, pad: int | None = None) -> Recording:
    """A snapshot pickle as a recording with its start state; any other trace format as a
    recording that starts empty. `pad`: the target NPU's padding (config.npu_pad)."""
    from ..trace.formats import holds_snapshot, read_mended
    from ..trace.snapshot import load_recording

    if holds_snapshot(path):
        recording = load_recording(path, flavour=flavour)
        if not recording.entries:
            from ..trace.file_checks import TraceFormatError
            raise TraceFormatError(path, "device_traces", "the snapshot has no trace entries, so "
                                   "there is nothing to replay (record with "
                                   "torch.cuda.memory._record_memory_history()); npumem report "
                                   "reads its segments")
    else:
        mended = read_mended(path)
        recording = Recording.from_entries(path, mended.entries, flavour or "cuda")
        recording.read_notes = mended.notes
    recording.refuse_if_damaged()
    recording.pad = pad
    return recording


def replay_file(path: str, allocator: str = "torch", settings: str = "",
                memory: int | None = None, check: bool = False, progress=None,
                pad: int | None = None) -> TorchReplay:
    """`allocator` torch (the recording's own flavour, CUDA unless it came from an NPU) or
    torch_npu; `settings` in PyTorch's key:value text, on top of what the recording used;
    `pad` the target NPU's request padding (config.npu_pad)."""
    from ..alloc.torch_model import parse_config

    recording = load_for_model(path, "npu" if allocator == "torch_npu" else None, pad)
    base = recording.base_config()
    config = parse_config(settings, base=base) if settings else base
    return replay_recording(recording, config, capacity=memory, check=check, progress=progress)
