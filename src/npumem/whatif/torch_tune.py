"""`npumem tune` for PyTorch recordings: which PYTORCH_CUDA_ALLOC_CONF (or
PYTORCH_NPU_ALLOC_CONF) would have reserved the least, or would have finished on a smaller
device.

Every candidate is PyTorch's own setting replayed through the faithful model of its allocator,
from the recording's start state (memory allocated before the trace stays where it was: it was
placed under the settings the run used). The winner finishes (no out-of-memory) with the lowest
peak reserved; fewer segment allocations, then the shorter line, break ties.

A recording that ends in an out-of-memory holds the run only up to the request that failed.
There each candidate is judged twice: on the recording (does it get past the failed request,
with how much headroom) and on the run played on from what the recording repeats (`extend`).
Only a setting that survives both is recommended, and each verdict says which it rests on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..alloc.torch_model import TorchAllocatorConfig, parse_config
from ..errors import InvalidParamError
from ..units import format_size
from .extend import STEPS, Extension, extend
from ..trace.snapshot import Recording, died_at, first_oom
from ..trace.snapshot.columns import DEVICE_BYTES_LIMIT
from .torch_replay import UNLIMITED, CapacityBounds, TorchReplay, capacity_bounds, replay_recording

# PyTorch's knobs that change placement (garbage_collection_threshold acts only under
# set_per_process_memory_fraction, so it is tried only where that is in force).
CANDIDATES = (
    "",
    "expandable_segments:True",
    "max_split_size_mb:64",
    "max_split_size_mb:128",
    "max_split_size_mb:256",
    "max_split_size_mb:512",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:8",
    "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
    "expandable_segments:True,roundup_power2_divisions:4",
    "max_split_size_mb:128,roundup_power2_divisions:4",
)
GC_CANDIDATES = ("garbage_collection_threshold:0.6", "garbage_collection_threshold:0.8")
BATCH_PROBES = 7            # replays that narrow down the batch that fits
NEED_PROBES = 6             # replays that narrow down the memory a setting needs
MiB = 1 << 20


@dataclass
class Candidate:
    config: TorchAllocatorConfig
    result: TorchReplay                   # the recording (up to its end)
    extended: TorchReplay | None = None   # the run played on past a failed request
    needed: int | None = None             # about the least memory it fits in, where it did not
    live_peak: int | None = None          # requested bytes live at the peak of the whole run
    capacity: int | None = None
    extension_start: int = 0              # the entry where the played-on run begins

    env: str = ""                         # the variable the recording's PyTorch reads first
    as_recorded: bool = False             # the settings the run used

    @property
    def name(self) -> str:
        """The settings in a sentence."""
        if self.as_recorded:
            return "the settings the run used"
        return self.config.describe() or "PyTorch's default setting"

    @property
    def variable(self) -> str:
        return self.env or self.config.env_name

    @property
    def line(self) -> str:
        text = self.config.describe()
        return f"{self.variable}={text}" if text else f"{self.variable} unset"

    @property
    def instruction(self) -> str:
        """What to do for these settings, as a person would say it: the shell line to run
        (quoted: a list such as [256:1,>:8] must reach PyTorch whole), or to leave the
        variable unset."""
        text = self.config.describe()
        if not text:
            return f"leave {self.variable} unset (the defaults)"
        return f"export {self.variable}=\"{text}\""

    @property
    def decisive(self) -> TorchReplay:
        """The replay the verdict rests on: the played-on run where there is one."""
        return self.extended if self.extended is not None else self.result

    @property
    def basis(self) -> str:
        return "extended" if self.extended is not None else "recorded"

    @property
    def finishes(self) -> bool:
        return self.result.oom is None and self.decisive.oom is None

    @property
    def headroom(self) -> int | None:
        if self.capacity is None or not self.finishes:
            return None
        return self.capacity - self.decisive.peak_reserved_bytes

    @property
    def short_by(self) -> int | None:
        if self.capacity is None or self.needed is None:
            return None
        return max(0, self.needed - self.capacity)

    def verdict(self) -> str:
        """What decided, marked [recorded] (the recording shows it) or [extended] (the run
        played on past the failed request shows it)."""
        if self.finishes:
            return f"fits [{self.marker}]"
        short = f", {format_size(self.short_by)} short" if self.short_by else ""
        return f"OOM {self.where_it_failed()}{short} [{self.marker}]"

    @property
    def marker(self) -> str:
        """recorded: the recording shows the verdict; extended: the run played on past the
        failed request does."""
        return "recorded" if self.result.oom is not None else self.basis

    def where_it_failed(self) -> str:
        if self.result.oom is not None:
            return f"at trace entry {self.result.oom['index']}"
        return f"{self.decisive.oom['index'] - self.extension_start} entries into the played-on run"


@dataclass
class BatchEstimate:
    scale: float                  # the largest factor on step-local allocations that fits
    settings: Candidate

    def describe(self) -> str:
        setting = self.settings.name
        if round(self.scale, 2) == 1:
            return (f"the batch the run used is about the largest that fits under {setting}, "
                    f"extrapolating the recorded step")
        change = (f"{(1 - self.scale):.0%} smaller" if self.scale < 1 else
                  f"{(self.scale - 1):.0%} larger")
        return (f"a batch about {change} would fit under {setting}, extrapolating the "
                f"recorded step (allocations that live less than one step scale with the batch)")


@dataclass
class TorchTuning:
    trace: str
    flavour: str
    memory: int | None                    # the device bytes judged against
    recorded: Candidate                   # the settings the recording ran with
    best: Candidate | None                # None: nothing finishes on that memory
    candidates: list[Candidate]
    recorded_peak_reserved_bytes: int | None    # None: no allocator segments were recorded
    bounds: CapacityBounds | None = None  # what the recording's OOM says of the limit
    memory_given: bool = False            # --memory, rather than the limit the OOM implies
    extension: Extension | None = None
    died_at: int | None = None            # the OOM the run ended on (not one it caught)
    batch: BatchEstimate | None = None
    worth_trying: Candidate | None = None  # gets past the failed request; the rest is unknown
    unextended: str = ""                  # why the rest of a run that died is unknown: it was
                                          # not played on, or only for one more layer
    caught_at: int | None = None          # an OOM the program caught, going on after it
    reasons: list[str] = field(default_factory=list)

    def answer(self) -> str:
        """One line: the setting to use, or how much memory the run needs."""
        where = f" on {format_size(self.memory)}" if self.memory else ""
        if self.best is not None:
            if self.best.as_recorded:
                kept = ("" if self.best.config.describe() else
                        f": {self.best.instruction}")
                return f"answer: keep the settings the run used{where}{kept}"
            return f"answer: {self.best.instruction}"
        if self.worth_trying is not None:
            return (f"answer: none certain{where}; worth a try: {self.worth_trying.instruction}, "
                    f"which gets past the failed request "
                    f"({_spare(self.worth_trying.headroom or 0)}), but the rest of the run is "
                    f"unknown ({self.unextended})")
        floor = self.live_floor()
        if floor > DEVICE_BYTES_LIMIT:
            return (f"answer: none fits{where}: the run asks for {format_size(floor)} live at "
                    f"once, more than any device holds (a size computed wrong?)")
        needed = [c for c in self.candidates if c.needed is not None]
        if not needed:
            return f"answer: none fits{where}"
        least = min(needed, key=lambda c: c.needed)
        # what was judged: the whole recording, the run played on, or only the part before
        # the failure (the rest may need more)
        judged = ("the run" if self.died_at is None else
                  "the run, played on," if self.extension is not None else
                  "even the part recorded")
        return (f"answer: none fits{where}: {judged} needs about {format_size(least.needed)} "
                f"(under {least.name}), and at least "
                f"{format_size(floor)} for its live tensors alone")

    def in_order(self) -> list[Candidate]:
        """The candidates as a table shows them: those that fit by peak reserved, then those
        that got furthest before running out."""
        def order(c: Candidate):
            if c.finishes:
                return 0, c.decisive.peak_reserved_bytes
            if c.result.oom is None:
                return 1, -c.decisive.oom["index"]
            return 2, -c.result.oom["index"]
        return sorted(self.candidates, key=order)

    def live_floor(self) -> int:
        """Bytes no setting can do without: the most requested bytes live at once, the failed
        request included (from the replays with no limit)."""
        return max((c.live_peak or c.decisive.peak_allocated_bytes) for c in self.candidates)

    def answer_lines(self) -> list[str]:
        """What the recording says, what else would fit, and the answer last."""
        lines = []
        if self.caught_at is not None:
            lines.append(f"the run ran out of memory at trace entry {self.caught_at} and went "
                         f"on (the program caught it): every setting is judged on the whole "
                         f"recording")
        if self.died_at is not None:
            lines.append(f"the run died at trace entry {self.died_at}: the rest of it was not "
                         f"recorded")
            passed = [c for c in self.candidates if c.result.oom is None]
            lines.append(f"{len(passed)} of {len(self.candidates)} settings get past the "
                         f"request that failed" + (f" on {format_size(self.memory)}"
                                                   if self.memory else ""))
            if self.extension is not None:
                lines.append(self.extension.describe() + f"; {sum(c.finishes for c in self.candidates)}"
                             f" of {len(self.candidates)} survive it")
            else:
                lines.append(f"not played on: {self.unextended}; verdicts rest on the recorded "
                             f"part only")
        if self.bounds is not None and not self.memory_given and self.bounds.caveat():
            lines.append(self.bounds.caveat())
        lines += [f"why: {reason}" for reason in self.reasons]
        if self.batch is not None:
            lines.append(self.batch.describe())
        lines.append(self.answer())
        return lines

    def as_dict(self) -> dict:
        def row(c: Candidate) -> dict:
            return {"settings": c.config.describe(), "env": c.line, "finishes": c.finishes,
                    "verdict": c.marker, "passes_failed_request": c.result.oom is None,
                    "peak_reserved_bytes": c.decisive.peak_reserved_bytes,
                    "recorded_part_peak_reserved_bytes": c.result.peak_reserved_bytes,
                    "headroom_bytes": c.headroom, "short_by_bytes": c.short_by,
                    "needed_bytes": c.needed, "device_allocs": c.decisive.device_allocs,
                    "oom": c.result.oom or c.decisive.oom}
        return {"trace": self.trace, "flavour": self.flavour, "memory_bytes": self.memory,
                "died_at_entry": self.died_at,
                "extension": None if self.extension is None else {
                    "period_events": self.extension.period, "steps": self.extension.steps,
                    "repetitions": self.extension.repetitions, "exact": self.extension.exact,
                    "growing": self.extension.growing,
                    # an [extended] verdict's oom index counts entries of the played-on run,
                    # which begins at this entry of it
                    "played_from_entry": self.extension.played_from},
                "caught_at_entry": self.caught_at,
                "recommended": row(self.best) if self.best else None,
                "recommended_env": self.best.line if self.best else None,
                "worth_trying_env": self.worth_trying.line if self.worth_trying else None,
                "predicted_peak_reserved_bytes":
                    self.best.decisive.peak_reserved_bytes if self.best else None,
                "recorded_peak_reserved_bytes": self.recorded_peak_reserved_bytes,
                "as_recorded": row(self.recorded),
                "batch_scale": self.batch.scale if self.batch else None,
                "answer": self.answer(), "reasons": self.reasons,
                "candidates": [row(c) for c in self.candidates]}


def _accepted(texts, base: TorchAllocatorConfig):
    """The candidates as configs on top of the recorded settings (the recorded ones first),
    each once, less those the allocator stops on at startup (torch_npu: expandable segments
    with a split size or a GC threshold). A run with expandable segments is also tried
    without them."""
    if base.expandable_segments:
        texts = [*texts, "expandable_segments:False",
                 "expandable_segments:False,roundup_power2_divisions:4"]
    seen = set()
    for text in texts:
        try:
            config = parse_config(text, base=base) if text else base
        except InvalidParamError:
            continue
        if config.describe() not in seen:
            seen.add(config.describe())
            yield config


def tune_recording(recording: Recording, memory: int | None = None,
                   candidates=CANDIDATES, steps: int = STEPS, progress=None,
                   workers: int | None = None) -> TorchTuning:
    """Replay each candidate on `recording`; `memory` replays on a device of that size (else
    on the limit the recording's out-of-memory implies, if it has one). Large recordings
    replay their candidates in `workers` processes (default: one per core)."""
    base = recording.base_config()
    start = recording.start_state(base)
    if memory is not None and memory < start.reserved:
        raise InvalidParamError(f"--memory {format_size(memory)} is less than the "
                                f"{format_size(start.reserved)} PyTorch had reserved before the "
                                f"trace began: no setting can run it there")
    bounds = capacity_bounds(recording, start.reserved)
    capacity = memory or (bounds.low if bounds is not None else None)
    texts = list(candidates)
    # a memory fraction (set_per_process_memory_fraction) stopped the run: `capacity` is its
    # limit, replayed as c10 applies one (garbage collection acts under it), on the device the
    # run had; the advice does not name it
    capped = bounds is not None and not bounds.device_full and not memory
    if (capped or base.per_process_memory_fraction is not None) and capacity:
        texts += GC_CANDIDATES
    died = died_at(recording.entries)
    caught_at = first_oom(recording.entries) if died is None else None   # and went on
    extension, unextended = extend(recording, steps) if died is not None else (None, "")
    configs = list(_accepted(texts, base))
    work = _Work(recording, extension, capacity, capped)
    results = _each(work.judge, configs, workers, len(recording.entries), progress)
    for candidate in results:         # the name that PyTorch reads without a warning
        candidate.env = recording.settings_variable
    recorded = results[0]
    recorded.as_recorded = True
    finishing = [c for c in results if c.finishes]
    ranked = sorted(finishing, key=lambda c: (c.decisive.peak_reserved_bytes,
                                              c.decisive.device_allocs, len(c.config.describe())))
    # a run that died before it repeated anything, or whose end repeats only the layers of
    # one step (played on for one more of them): what comes after is unknown, so a setting
    # that gets past it is only worth trying, not recommended
    certain = died is None or (extension is not None and not extension.growing)
    if extension is not None and extension.growing:
        unextended = ("its end repeats the layers of one step, played on for one more of them; "
                      "how far the step grows past that is unknown")
    best = ranked[0] if ranked and certain else None
    tuning = TorchTuning(recording.path, recording.flavour, capacity, recorded, best, results,
                         recorded.result.recorded_peak_reserved_bytes, bounds,
                         memory_given=bool(memory), extension=extension, died_at=died,
                         worth_trying=None if certain or not ranked else ranked[0],
                         unextended=unextended, caught_at=caught_at)
    if best is None and tuning.worth_trying is None and capacity is not None:
        failing = [c for c in results if not c.finishes]
        for candidate, (needed, live) in zip(failing, _each(
                work.needed, [c.config for c in failing], workers, len(recording.entries))):
            candidate.needed, candidate.live_peak = needed, live
    if extension is not None and capacity:
        chosen = best or tuning.worth_trying or min(
            results, key=lambda c: c.needed if c.needed is not None else 1 << 64)
        tuning.batch = _batch_that_fits(extension, chosen, work.limit(capacity),
                                        certain=best is not None)
    tuning.reasons = _reasons(tuning)
    return tuning


PARALLEL_ENTRIES = 50_000   # below this, starting processes costs more than the replays


@dataclass
class _Work:
    """What every candidate's replays share (handed to worker processes once, by fork)."""

    recording: Recording
    extension: Extension | None
    capacity: int | None
    capped: bool

    def limit(self, capacity: int | None) -> dict:
        """replay_recording's arguments for a limit of `capacity` bytes: a memory fraction's
        (on the device the run had) where one capped the run, else the device's."""
        return {"allowed": capacity} if self.capped else {"capacity": capacity}

    def judge(self, config: TorchAllocatorConfig) -> Candidate:
        limit = self.limit(self.capacity)
        result = replay_recording(self.recording, config, **limit)
        candidate = Candidate(config, result, capacity=self.capacity)
        if self.extension is not None:
            candidate.extension_start = self.extension.played_from
            candidate.extended = replay_recording(self.extension.recording, config, **limit)
        return candidate

    def needed(self, config: TorchAllocatorConfig) -> tuple[int, int]:
        run = self.extension.recording if self.extension is not None else self.recording
        return _least_that_fits(run, config, self.capacity, self.limit)


_WORK = None                    # the bound method a forked worker calls


def _call(item):
    return _WORK(item)


def _each(function, items: list, workers: int | None, entries: int, progress=None) -> list:
    """`function` over `items`, in processes forked with the work when the recording is large
    (results in order); `progress(done, total)` after each."""
    import multiprocessing
    import os

    global _WORK
    workers = min(workers or os.cpu_count() or 1, len(items))
    parallel = (workers > 1 and entries >= PARALLEL_ENTRIES
                and "fork" in multiprocessing.get_all_start_methods())
    results = []
    if not parallel:
        for item in items:
            results.append(function(item))
            if progress is not None:
                progress(len(results), len(items))
        return results
    _WORK = function
    try:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            for result in pool.imap(_call, items):
                results.append(result)
                if progress is not None:
                    progress(len(results), len(items))
    finally:
        _WORK = None
    return results


def _least_that_fits(recording: Recording, config: TorchAllocatorConfig,
                     capacity: int, limit) -> tuple[int | None, int]:
    """About the fewest bytes on which the run fits under `config` (None: on none, as with a
    request larger than the model's addresses), and the requested bytes live at its peak
    (`limit`: _Work.limit, a device's bytes or a fraction's). The bytes lie
    between `capacity` (too few) and the peak it reserves with no limit, to within
    1/2**NEED_PROBES of the gap. A limit makes the allocator free its cache and retry, so the
    run can fit on less than it reserves when nothing stops it; and under a memory fraction that
    retry can need more than the unlimited peak (expandable segments unmap, then map the request
    anew): the upper end is doubled until the run fits there."""
    low = capacity
    unlimited = replay_recording(recording, config, capacity=UNLIMITED)
    if unlimited.oom is not None:         # (a request past the addresses it has): no bytes do
        return None, unlimited.peak_allocated_bytes
    high = max(unlimited.peak_reserved_bytes, capacity + 2 * MiB)
    while replay_recording(recording, config, **limit(high)).oom is not None:
        if high > DEVICE_BYTES_LIMIT:
            return None, unlimited.peak_allocated_bytes
        low, high = high, 2 * high
    for _ in range(NEED_PROBES):
        if high - low <= 2 * MiB:
            break
        middle = (low + high) // 2
        if replay_recording(recording, config, **limit(middle)).oom is None:
            high = middle
        else:
            low = middle
    return high, unlimited.peak_allocated_bytes


def _scaled(extension: Extension, scale: float) -> Recording:
    """The played-on recording with every allocation that lives less than one period scaled
    (one still live at the end: as the allocation a period before it)."""
    from dataclasses import replace

    entries = extension.recording.entries
    free_action = extension.recording.free_action
    allocs: dict[int, int] = {}            # event position of an allocation -> its entry
    born: dict[int, int] = {}              # address -> its allocation's event position
    short: set[int] = set()                # event positions of short-lived allocations
    position = 0
    for index, entry in enumerate(entries):
        if entry["action"] == "alloc":
            born[entry["addr"]] = position
            allocs[position] = index
        elif entry["action"] == free_action:       # counted as extend counts events
            start = born.pop(entry.get("addr"), None)
            if start is not None and position - start <= extension.period:
                short.add(start)
        else:
            continue
        position += 1
    for start in sorted(born.values()):
        if start - extension.period in short:
            short.add(start)
    indexes = {allocs[position] for position in short}
    scaled = [dict(entry, size=max(1, int(entry["size"] * scale))) if index in indexes else entry
              for index, entry in enumerate(entries)]
    return replace(extension.recording, entries=scaled)


def _batch_that_fits(extension: Extension, candidate: Candidate, limit: dict,
                     certain: bool = True) -> BatchEstimate | None:
    """The largest scale of the step's short-lived allocations (the batch) that fits under the
    candidate's settings (`limit`: replay_recording's, _Work.limit): above 1 where it fits now
    (up to twice), below 1 where it does not. A candidate only worth trying (the played-on run
    may not be the real one) that gets through it is given no batch: the real step may be
    larger."""
    def fits(scale: float) -> bool:
        replay = replay_recording(_scaled(extension, scale), candidate.config, **limit)
        return replay.oom is None

    if candidate.finishes and not certain:
        return None
    low, high = (1.0, 2.0) if candidate.finishes else (0.0, 1.0)
    if candidate.finishes and fits(high):
        return BatchEstimate(high, candidate)
    for _ in range(BATCH_PROBES):
        middle = (low + high) / 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return BatchEstimate(low, candidate) if low > 0 else None


def _reasons(tuning: TorchTuning) -> list[str]:
    best, recorded = tuning.best, tuning.recorded
    out = []
    if tuning.memory is not None:
        fits = [c for c in tuning.candidates if c.finishes]
        out.append(f"on a device with {format_size(tuning.memory)} for PyTorch, "
                   f"{len(fits)} of {len(tuning.candidates)} settings finish the "
                   + ("played-on run" if tuning.extension is not None else "recording"))
        oom = recorded.result.oom or recorded.decisive.oom
        if oom is not None:
            out.append(f"as recorded it runs out of memory {recorded.where_it_failed()} (asks "
                       f"{format_size(oom['request_bytes'])}, a "
                       f"{format_size(oom['alloc_bytes'])} segment, with "
                       f"{format_size(oom['reserved_bytes'] - oom['allocated_bytes'])} reserved "
                       f"but unallocated, largest cached block it could use "
                       f"{format_size(oom['largest_free_bytes'])})")
    if best is None:
        shorts = sorted((c.short_by, c.name)
                        for c in tuning.candidates if c.short_by is not None)
        if shorts:
            out.append("short by: " + "; ".join(f"{name} {format_size(short)}"
                                                 for short, name in shorts[:5]))
        return out
    saved = recorded.decisive.peak_reserved_bytes - best.decisive.peak_reserved_bytes
    live = best.decisive.peak_allocated_bytes
    if best is recorded:
        out.append("the settings the run used already reserve the least among the candidates")
    elif saved > 0 or not recorded.finishes:
        out.append(f"{best.name} reserves "
                   + (f"{format_size(saved)} less at peak than the recorded settings "
                      f"({format_size(best.decisive.peak_reserved_bytes)} vs "
                      f"{format_size(recorded.decisive.peak_reserved_bytes)})" if saved > 0 else
                      f"{format_size(best.decisive.peak_reserved_bytes)} at peak and finishes")
                   + (f" ({_spare(best.headroom)})" if best.headroom is not None else ""))
        if best.config.expandable_segments and not recorded.config.expandable_segments:
            out.append("expandable segments grow one address range per stream instead of "
                       "caching whole segments, so freed space is not stranded in segments "
                       "that are partly in use")
        elif best.config.max_split_size != recorded.config.max_split_size:
            out.append("blocks above max_split_size are not split for smaller requests, so big "
                       "cached blocks stay whole for the big requests that need them")
        elif best.config.roundup_power2_divisions != recorded.config.roundup_power2_divisions:
            out.append("rounding requests to power-of-2 divisions makes sizes repeat, so freed "
                       "blocks fit later requests")
    if live:
        out.append(f"peak live tensors: {format_size(live)}; the recommendation reserves "
                   f"{best.decisive.peak_reserved_bytes / live:.3f}x that")
    return out


def _spare(headroom: int) -> str:
    """How a setting that finishes stands to the limit. Above it only under a memory fraction
    with expandable segments: the fraction counts the segment asked for, while whole pages are
    mapped for it."""
    if headroom >= 0:
        return f"{format_size(headroom)} to spare"
    return (f"{format_size(-headroom)} over the limit in whole pages mapped: a memory fraction "
            f"counts the bytes asked for, expandable segments map pages")
