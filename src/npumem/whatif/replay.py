"""Replay a recorded allocation trace through an allocator and measure what it would reserve.

Allocators: `pool` (npumem's caching pool with the given settings), `torch` / `torch_npu` (the
model of PyTorch's caching allocator, `alloc/torch_model`, replayed by `torch_replay`) and
`device` (every request straight to the driver). Pool and device replays run on a fresh
simulated device with room to spare, so the numbers show the allocator's policy, not an OOM.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Iterable, Sequence

from ..alloc.caching_allocator import CachingAllocator, OutOfMemoryError
from ..alloc.resource import DeviceResource
from ..alloc.settings import AllocatorSettings, describe_changes
from ..alloc.torch_model.config import settings_variable
from ..alloc.sizes import round_request, segment_size
from ..constants import MemAttr
from ..device.sim import SimBackend, SimConfig
from ..errors import MemoryAllocationError
from ..units import GiB, format_size
from ..events import TraceEvent
from ..trace.file_checks import TraceFormatError
from ..trace.snapshot.columns import DEVICE_BYTES_LIMIT

ALLOCATORS = ("pool", "torch", "torch_npu", "device")


@dataclass
class ReplayResult:
    trace: str
    allocator: str
    events: int
    peak_allocated_bytes: int       # peak sum of requested bytes live: the lower bound
    peak_reserved_bytes: int
    reserved_over_allocated: float
    device_allocs: int
    cache_hit_rate: float
    mean_alloc_us: float | None     # the pool's time per allocation (None: not measured)
    unmatched_frees: int = 0
    settings: str = ""
    start_reserved_bytes: int = 0              # reserved before the trace's first entry
    recorded_peak_reserved_bytes: int | None = None    # what the real allocator reserved
    recorded_device_allocs: int | None = None
    oom: dict | None = None                    # the first request the allocator could not serve
    notes: list = field(default_factory=list)
    # predictive:True only: hits over requests since the plan took over, and peak reserved over
    # peak live bytes from then on (None: no plan took over)
    prediction_hit_rate: float | None = None
    steady_reserved_over_allocated: float | None = None
    steady_page_floor: float | None = None     # the least that ratio can be in whole pages
    prediction_planning_seconds: float | None = None
    recorded_oom: dict | None = None           # torch: the recording's own first OOM (oom_facts)

    def as_dict(self) -> dict:
        data = asdict(self)
        del data["recorded_oom"]                 # for the command's own lines, not a figure
        return data

    @classmethod
    def from_torch(cls, result, allocator: str) -> "ReplayResult":
        """The row for a replay through the PyTorch allocator model (a TorchReplay)."""
        live = result.peak_allocated_bytes
        env = result.variable or settings_variable(result.flavour)     # one rule (config.py)
        return cls(
            trace=result.trace, allocator=allocator, events=result.events,
            peak_allocated_bytes=live, peak_reserved_bytes=result.peak_reserved_bytes,
            reserved_over_allocated=result.peak_reserved_bytes / live if live else 0.0,
            device_allocs=result.device_allocs, cache_hit_rate=result.cache_hit_rate,
            mean_alloc_us=None,                  # a model, not an allocator: no latency to show
            unmatched_frees=result.unmatched_frees,
            settings=f"{env}={result.settings}" if result.settings else "defaults",
            start_reserved_bytes=result.start_reserved_bytes,
            recorded_peak_reserved_bytes=result.recorded_peak_reserved_bytes,
            recorded_device_allocs=result.recorded_device_allocs, oom=result.oom,
            notes=list(result.notes), recorded_oom=result.recorded_oom)


def _prediction_note(predictor, stats: dict, steady: float | None, floor: float | None) -> str:
    if predictor.took_over_at is None:
        return f"prediction: no plan took over ({predictor.note})"
    ratio = ("n/a (no plan cut at a step boundary served)" if steady is None
             else f"{steady:.3f} (whole pages allow {floor:.3f})")
    return (f"prediction: {stats['prediction.hit_rate']:.1%} of {predictor.hits + predictor.misses} "
            f"requests hit after the plan took over at request {predictor.took_over_at}; steady "
            f"reserved / live {ratio}; {predictor.note}")


def make_allocator(name: str, backend: SimBackend, settings: AllocatorSettings | None):
    if name == "pool":
        return CachingAllocator(backend, 0, settings or AllocatorSettings())
    if name == "device":
        return DeviceResource(backend, 0)
    raise ValueError(f"unknown allocator {name!r}; choose from {', '.join(ALLOCATORS)}")


def replay(events: Iterable[TraceEvent], allocator: str = "pool",
           settings: AllocatorSettings | None = None, trace_name: str = "",
           memory: int = 64 * GiB, progress=None, planner_lag: int = 0,
           steps: Sequence[int] = ()) -> ReplayResult:
    """Run `events` through a fresh allocator; `progress(n)` is called every 10,000 events.
    (PyTorch's allocator starts empty here; `torch_replay.replay_file` starts a snapshot from
    its recorded state.) With predictive pre-allocation, each layout is handed over
    `planner_lag` requests after it was asked for, as the program's planner thread would, and
    a step is marked (`mark_step`, as `npumem.memory.step()`) before each event whose
    position is in `steps` (in order; `formats.read_with_steps` finds them)."""
    if allocator in ("torch", "torch_npu"):
        from ..trace.snapshot import Recording
        from .torch_replay import replay_recording

        recording = Recording.from_events(trace_name, events,
                                          "npu" if allocator == "torch_npu" else "cuda")
        return ReplayResult.from_torch(replay_recording(recording, progress=progress), allocator)
    backend = SimBackend(SimConfig(memory=memory))
    resource = make_allocator(allocator, backend, settings)
    predictor = getattr(resource, "predictor", None)
    if predictor is not None:
        # A replay runs far faster than the program did: plan in line, as the program's own
        # step time would have covered it (planning_seconds says how long it took), and hand
        # the layout over `planner_lag` requests on.
        predictor.background, predictor.lag = False, planner_lag
    hand_over = predictor.hand_over_held if predictor is not None and planner_lag else None
    marks = iter(steps if predictor is not None else ())
    next_mark = next(marks, -1)
    live: dict[int, tuple[int, int]] = {}      # trace addr -> (pointer, size)
    oom = None
    allocated = peak_allocated = peak_device = 0
    steady_live = steady_reserved = 0          # peaks while a plan cut at a step boundary serves
    count = unmatched = allocs = 0
    alloc_seconds = 0.0
    clock = time.perf_counter
    is_device = allocator == "device"
    for event in events:
        while count == next_mark:
            start = clock()                   # timed: the plan may be made here
            resource.mark_step()
            alloc_seconds += clock() - start
            next_mark = next(marks, -1)
        count += 1
        if progress is not None and count % 10000 == 0:
            progress(count)
        if event.action == "alloc":
            if event.addr in live:                 # the free was not recorded: drop the old one
                pointer, size = live.pop(event.addr)
                resource.deallocate(pointer)
                allocated -= size
            if event.size > DEVICE_BYTES_LIMIT:     # as the torch replays refuse it (issue 64)
                raise TraceFormatError(trace_name or "trace", f"event {count - 1}",
                                       f"an allocation of {event.size} bytes succeeded: more "
                                       "than any device holds (2**48 bytes), so the recording "
                                       "is damaged")
            start = clock()
            try:
                pointer = resource.allocate(event.size, event.stream)
            except MemoryAllocationError as exc:       # the row says it; the replay ends here
                oom = out_of_memory(exc, count - 1, event.size, resource, memory)
                break
            alloc_seconds += clock() - start
            if hand_over is not None:
                hand_over()
            allocs += 1
            live[event.addr] = (pointer, event.size)
            allocated += event.size
            if allocated > peak_allocated:
                peak_allocated = allocated
            if is_device:
                free, total = backend.mem_info(0, MemAttr.HBM_MEM)
                peak_device = max(peak_device, total - free)
            elif predictor is not None and predictor.settled:
                steady_live = max(steady_live, allocated)
                steady_reserved = max(steady_reserved, resource.stats.current("reserved_bytes"))
        else:
            entry = live.pop(event.addr, None)
            if entry is None:
                unmatched += 1                     # allocated before the recording started
                continue
            resource.deallocate(entry[0])
            allocated -= entry[1]
    if is_device:
        peak_reserved, device_allocs, hit_rate = peak_device, allocs, 0.0
    else:
        stats = resource.memory_stats()
        peak_reserved = stats["reserved_bytes.all.peak"]
        device_allocs = stats["num_device_alloc"]
        hit_rate = stats["cache_hit_rate"]
    prediction, planning = {}, 0.0
    if predictor is not None:
        planning = predictor.planning_seconds          # done in line here: not allocation time
        took_over = predictor.took_over_at is not None
        steady = floor = None
        if steady_live:
            page = backend.page_granularity
            steady = steady_reserved / steady_live
            floor = -(-steady_live // page) * page / steady_live
        prediction = {"prediction_hit_rate": stats["prediction.hit_rate"] if took_over else None,
                      "steady_reserved_over_allocated": steady, "steady_page_floor": floor,
                      "prediction_planning_seconds": planning,
                      "notes": [_prediction_note(predictor, stats, steady, floor)]}
    for pointer, _ in live.values():
        resource.deallocate(pointer)
    if not is_device:
        resource.close()
    backend.close()
    return ReplayResult(
        trace=trace_name, allocator=allocator, events=count,
        peak_allocated_bytes=peak_allocated, peak_reserved_bytes=peak_reserved,
        reserved_over_allocated=peak_reserved / peak_allocated if peak_allocated else 0.0,
        device_allocs=device_allocs, cache_hit_rate=hit_rate,
        mean_alloc_us=(alloc_seconds - planning) / allocs * 1e6 if allocs else 0.0,
        unmatched_frees=unmatched,
        settings="" if allocator != "pool" else describe_changes(settings or AllocatorSettings()),
        oom=oom, **prediction)


def out_of_memory(exc: MemoryAllocationError, index: int, nbytes: int, resource,
                  memory: int) -> dict:
    """The `oom` of a replay's row: the event it stopped at, and why, in the replay's terms
    (--memory, the pool's settings) rather than a program's."""
    asked = f"a request of {format_size(nbytes)}"
    if not isinstance(exc, OutOfMemoryError):            # the simulated device's own words
        return {"index": index, "requested": nbytes,
                "message": f"{asked}: {getattr(exc, 'message', exc)}"}
    stats = resource.stats
    reserved = stats.current("reserved_bytes")
    segment = 0 if resource.expandable else segment_size(
        round_request(nbytes, resource.flavour, resource.settings.roundup_power2_divisions,
                      resource.settings.block_alignment), resource.settings.segment_size_mb)
    if nbytes > memory:
        why = f"{asked} is more than the whole {format_size(memory)} device"
    elif segment > resource.limit:
        why = (f"{asked} needs a segment of {format_size(segment)} (segment_size_mb), more than "
               f"the pool may reserve ({format_size(resource.limit)})")
    elif resource.limit < memory:
        why = (f"{asked} found {format_size(reserved)} reserved of the "
               f"{format_size(resource.limit)} that per_process_memory_fraction leaves the pool "
               f"of the {format_size(memory)} device")
    else:
        why = (f"{asked} found {format_size(reserved)} reserved of the {format_size(memory)} "
               f"device ({format_size(stats.current('allocated_bytes'))} live)")
    return {"index": index, "requested": nbytes, "message": why}
