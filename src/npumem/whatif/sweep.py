"""Many replays at once: settings sweeps and multi-trace runs, in local processes or on Dask.

A job names a trace file, an allocator and pool settings; the worker reads the trace itself, so
nothing large crosses process boundaries. Schedulers:

    "processes"       local worker processes, one per core (the default)
    "serial"          in this process, one after another
    "dask"            a local Dask cluster (pip install "npumem[dask]")
    "tcp://host:port" an existing Dask scheduler: its workers must have npumem and the traces
"""

from __future__ import annotations

import difflib
import itertools
import os
import signal
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Callable, Sequence

from ..alloc.settings import KEYS as POOL_KEYS
from ..alloc.settings import (describe_changes, parse_settings, settings_warnings, split_items,
                              split_pairs)
from ..alloc.torch_model.config import KEYS as TORCH_KEYS
from ..errors import InvalidParamError
from ..units import GiB
from ..trace import snapshot
from ..trace.formats import TraceEvents, holds_snapshot, read_trace, read_with_steps
from ..trace.snapshot import load_recording
from . import pool_replay
from .replay import ReplayResult, replay

TORCH_ALLOCATORS = ("torch", "torch_npu")


@dataclass(frozen=True)
class ReplayJob:
    trace: str
    allocator: str = "pool"
    settings: str = ""             # NPUMEM_ALLOC_CONF text (pool), PyTorch's text (torch)
    memory: int | None = None      # device bytes; None: 64 GiB for the pool, and for PyTorch's
                                   # allocator what the recording shows it could use
    planner_lag: int = 0           # requests before a predictive layout is handed over
    steps: str | None = None       # the snapshot annotation that begins a step (see step_marks)
    pad: int | None = None         # torch_npu: the target chip's request padding (npu_pad)
    says_oom: bool = False         # a snapshot's own OOM goes on the result (`recorded_oom`):
                                   # one job of each trace says it for the command

    def run(self, progress: Callable[[int], None] | None = None) -> ReplayResult:
        """`progress(events)` now and then while it replays (the events replayed so far)."""
        if self.allocator in TORCH_ALLOCATORS:
            result = replay_torch(self.trace, self.allocator, self.settings, self.memory,
                                  progress=progress, pad=self.pad, says_oom=self.says_oom)
            return ReplayResult.from_torch(result, self.allocator)
        return ReplayBatch((self,)).run(progress)[0]

    def _replay_events(self, settings, memory: int, recording, progress) -> ReplayResult:
        """The replay of the trace's events one by one (`replay.replay`), with what reading
        them changed and where steps begin as notes."""
        if settings.predictive:      # the program's step marks, where the trace has them
            events, marks, note = read_with_steps(self.trace, self.steps, recording)
        else:
            events = (read_trace(self.trace) if recording is None else
                      TraceEvents(snapshot.events(recording)))
            marks, note = (), None
        result = replay(events, self.allocator, settings, trace_name=self.trace, memory=memory,
                        progress=progress, planner_lag=self.planner_lag, steps=marks)
        if result.oom and recording is not None:    # said as the snapshot's entry, as torch's
            result.oom["index"] = snapshot.entry_of_event(recording, result.oom["index"])
        result.notes[:0] = events.notes         # what reading the trace changed
        if marks:
            how = f"{self.steps!r} annotations" if self.steps else "npumem.memory.step() marks"
            result.notes.insert(0, f"{len(marks)} steps marked by the trace's {how}")
        elif note:
            result.notes.append(note)
        return result


@dataclass(frozen=True)
class ReplayBatch:
    """Jobs run together: one job, or pool jobs of one trace and memory, which read the trace
    once and give each part of it to every setting's native pool in turn (`run_jobs` makes
    these where it pays)."""
    jobs: tuple[ReplayJob, ...]

    def run(self, progress: Callable[[int], None] | None = None) -> list[ReplayResult]:
        first = self.jobs[0]
        progress = _onward(progress)
        if first.allocator in TORCH_ALLOCATORS:
            return [job.run(progress) for job in self.jobs]
        every = [parse_settings(job.settings) for job in self.jobs]
        memory = first.memory or 64 * GiB
        # a snapshot is loaded here, once: its events, its step marks and its own OOM
        recording = load_recording(first.trace) if holds_snapshot(first.trace) else None
        native = [None] * len(every)
        if first.allocator == "pool":            # natively, where it can (else None)
            native = pool_replay.replay_file(first.trace, every, memory, recording, progress)
        results = []
        for job, settings, result in zip(self.jobs, every, native):
            if not isinstance(result, ReplayResult):
                why = result
                result = job._replay_events(settings, memory, recording, progress)
                if why:
                    result.notes.append(f"replayed event by event through the pool itself "
                                        f"(slower): {why}")
            if recording is not None and job.says_oom:
                from .torch_replay import oom_facts
                result.recorded_oom = oom_facts(recording) or {}
            result.notes += settings_warnings(settings)
            results.append(result)
        return results


def _onward(progress: Callable[[int], None] | None) -> Callable[[int], None] | None:
    """`progress` told only counts above the last: a trace read again (mended, or by the
    Python pool after the native one stopped) does not send the count back."""
    if progress is None:
        return None
    told = 0

    def report(events: int) -> None:
        nonlocal told
        if events > told:
            told = events
            progress(events)
    return report


def batches(jobs: Sequence[ReplayJob], workers: int) -> list[tuple[ReplayBatch, list[int]]]:
    """The jobs as batches, each with the jobs' positions: pool jobs the native pool replays
    share a read of their trace, in as many batches as the workers left beside the other jobs
    allow (a read costs more than the pool's replay of what it read)."""
    shared: dict[tuple, list[int]] = {}
    alone = []
    for index, job in enumerate(jobs):
        if job.allocator == "pool" and pool_replay.applies(parse_settings(job.settings)):
            shared.setdefault((job.trace, job.memory), []).append(index)
        else:
            alone.append(index)
    units = [(ReplayBatch((jobs[index],)), [index]) for index in alone]
    spare = max(1, (workers - len(alone)) // max(1, len(shared)))
    for positions in shared.values():
        count = min(spare, len(positions))
        for first in range(count):
            chosen = positions[first::count]
            units.append((ReplayBatch(tuple(jobs[index] for index in chosen)), chosen))
    return units


def replay_torch(path: str, allocator: str = "torch", settings: str = "",
                 memory: int | None = None, check: bool = False, progress=None,
                 pad: int | None = None, says_oom: bool = False):
    """`torch_replay.replay_file`, with notes first on how the settings read (the recorded
    ones included) and on combinations that do nothing or that torch_npu refuses; with
    `says_oom`, the recording's own OOM as `recorded_oom`."""
    from ..alloc.torch_model import TorchAllocatorConfig
    from ..alloc.torch_model.config import config_warnings, parse_config
    from .torch_replay import load_for_model, oom_facts, replay_recording

    recording = load_for_model(path, "npu" if allocator == "torch_npu" else None, pad)
    base = recording.base_config()
    config = parse_config(settings, base=base) if settings else base
    result = replay_recording(recording, config, capacity=memory, check=check, progress=progress)
    result.notes[:0] = config_warnings(config)
    if says_oom and allocator == "torch" and recording.continues is None:
        # the recording as any reader loads it: its OOM is said from here, the file read once
        own = memory is None and config == TorchAllocatorConfig(recording.flavour)
        result.recorded_oom = oom_facts(recording, result if own else None) or {}
    if pad is not None and recording.flavour != "npu":
        result.notes.insert(0, "--soc/--cann concern torch_npu's allocator; this CUDA recording "
                               "replays through CUDA's (add --allocator torch_npu)")
    return result


def setting_keys(allocator: str) -> tuple[str, ...]:
    """The setting keys an allocator of ReplayJob has (none for `device`)."""
    if allocator == "pool":
        return POOL_KEYS
    if allocator in TORCH_ALLOCATORS:
        return TORCH_KEYS["npu" if allocator == "torch_npu" else "cuda"]
    return ()


def _takes(allocator: str, key: str, value: str) -> bool:
    if key not in setting_keys(allocator):
        return False
    # the pool has one rounding count for every size, so PyTorch's per-size list is not for it
    return not (allocator == "pool" and key == "roundup_power2_divisions"
                and any(item.startswith("[") for item in split_items(value)))


def split_for(allocators: Sequence[str], settings: Sequence[str], sweeps: Sequence[str]):
    """Each allocator's share of `--set` items ("key=value", or several "k:v,..."), and of
    `--sweep` axes ("key=v1,v2"): the keys it has. Returns ({allocator: "k:v,..."},
    {allocator: [sweep, ...]}, [(allocator, note)]); a note names each key an allocator goes
    without. A key none of them has raises InvalidParamError naming the keys each one has."""
    items = [pair for text in settings for pair in split_pairs(text)]
    items += [_axis(sweep) for sweep in sweeps]
    shares = {name: [] for name in allocators}
    notes = []
    for index, (key, value) in enumerate(items):
        takers = [name for name in allocators if _takes(name, key, value)]
        if not takers:
            raise InvalidParamError(_nobody_takes(allocators, key, value))
        for name in allocators:
            if name in takers:
                shares[name].append(index)
            elif setting_keys(name):
                notes.append((name, f"{name} ignores {key}={value}: {_why_not(name, key)}"))
    cut = len(items) - len(sweeps)
    texts = {name: ",".join(f"{items[i][0]}:{items[i][1]}" for i in chosen if i < cut)
             for name, chosen in shares.items()}
    axes = {name: [sweeps[i - cut] for i in chosen if i >= cut] for name, chosen in shares.items()}
    return texts, axes, list(dict.fromkeys(notes))


def _why_not(allocator: str, key: str) -> str:
    if key in setting_keys(allocator):
        return "it has one rounding count for every size, not PyTorch's per-size list"
    return "not one of its settings" if allocator == "pool" else "not one of PyTorch's settings"


def _nobody_takes(allocators: Sequence[str], key: str, value: str) -> str:
    tunable = [name for name in allocators if setting_keys(name)]
    if not tunable:
        return "--set and --sweep change allocator settings; add pool or torch to --allocator"
    elsewhere = [name for name in ("pool", "torch", "torch_npu") if name not in allocators
                 and _takes(name, key, value)]
    where = f"{key}={value} is for {' and '.join(elsewhere)}: add {elsewhere[0]} to --allocator" \
        if elsewhere else ""
    refused = [f"{name} takes {key}, but {_why_not(name, key)}" for name in tunable
               if key in setting_keys(name)]
    if refused or where:
        return "; ".join(refused + ([where] if where else []))
    close = difflib.get_close_matches(key, [k for n in tunable for k in setting_keys(n)], 1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    torch = " (PyTorch stops at startup on a key it does not recognise)" \
        if any(name in TORCH_ALLOCATORS for name in tunable) else ""
    known = "; ".join(f"{name}'s keys: {', '.join(sorted(setting_keys(name)))}" for name in tunable)
    return f"unknown key {key!r}{hint}{torch}; {known}"


def run_job(batch: ReplayBatch) -> list[ReplayResult]:
    """Module-level so process pools and Dask can pickle it."""
    return batch.run()


def sweep_settings(base: str, sweeps: Sequence[str], validate=parse_settings) -> list[str]:
    """Every combination of `key=v1,v2,...` sweeps on top of `base`, as settings strings.

    Each string is checked with `validate` here, so a typo fails before any replay starts."""
    axes = []
    for sweep in sweeps:
        key, values = _axis(sweep)
        axes.append([f"{key}:{value}" for value in split_items(values)])
    combos = [",".join(filter(None, [base, *combo])) for combo in itertools.product(*axes)]
    for combo in combos:
        validate(combo)
    return combos


def _axis(sweep: str) -> tuple[str, str]:
    """("key", "v1,v2") of "key=v1,v2" (or "key:v1,v2"); PyTorch's [ ] lists stay whole."""
    cut = min((i for i in (sweep.find(":"), sweep.find("=")) if i >= 0), default=-1)
    if cut < 0 or not split_items(sweep[cut + 1:]):
        raise InvalidParamError(f"sweep {sweep!r}: expected key=value1,value2,...")
    return sweep[:cut].strip(), sweep[cut + 1:].strip()


def settings_label(settings: str) -> str:
    return describe_changes(parse_settings(settings))


def run_jobs(jobs: Sequence[ReplayJob], scheduler: str = "processes", workers: int | None = None,
             progress: Callable[..., None] | None = None) -> list[ReplayResult]:
    """Results in the order of `jobs`; `progress(done, total)` after each finished batch of
    jobs (`batches`), and in this process also `progress(done, total, events)` while a long
    replay runs."""
    check_scheduler(scheduler)
    total = len(jobs)
    report = progress or (lambda done, total, events=0: None)
    workers = workers or os.cpu_count() or 1
    units = batches(jobs, 1 if scheduler == "serial" else workers)
    if scheduler == "serial" or len(units) <= 1:
        results: list[ReplayResult | None] = [None] * total
        done = 0
        for batch, positions in units:
            for position, result in zip(positions, batch.run(
                    lambda events: report(done, total, events))):
                results[position] = result
            done += len(positions)
            report(done, total)
        return results
    if scheduler == "processes":
        return _run_processes(units, total, workers, report)
    return _run_dask(units, total, scheduler, workers, report)


def check_scheduler(scheduler: str) -> None:
    """ValueError for a scheduler run_jobs does not know."""
    if scheduler not in ("processes", "serial", "dask") and \
            not scheduler.startswith(("tcp://", "tls://")):
        raise ValueError(f"unknown scheduler {scheduler!r}: use processes, serial, dask or "
                         "tcp://host:port")


def _parent_interrupts() -> None:
    """In a worker: Ctrl-C is the parent's to handle (it stops the workers); a worker that
    took it too would print its own traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run_processes(units, total: int, workers: int, report) -> list[ReplayResult]:
    results: list[ReplayResult | None] = [None] * total
    pool = ProcessPoolExecutor(max_workers=min(workers, len(units)), initializer=_parent_interrupts)
    try:
        futures = {pool.submit(run_job, batch): positions for batch, positions in units}
        done = 0
        for future in as_completed(futures):
            positions = futures[future]
            for position, result in zip(positions, future.result()):
                results[position] = result
            done += len(positions)
            report(done, total)
    except BaseException:
        # Ctrl-C or a failed job: stop now, not after the replays already running. The
        # executor has no public way to stop its workers, so they are terminated here.
        for process in list((getattr(pool, "_processes", None) or {}).values()):
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return results


def _run_dask(units, total: int, scheduler: str, workers: int, report) -> list[ReplayResult]:
    try:
        from dask.distributed import Client, LocalCluster, as_completed as dask_completed
    except ImportError:
        raise RuntimeError('the Dask scheduler needs dask.distributed: pip install "npumem[dask]"') from None
    cluster = None
    if scheduler == "dask":
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                               dashboard_address=None)
        client = Client(cluster)
    else:
        client = Client(scheduler, timeout="10s")
    try:
        futures = client.map(run_job, [batch for batch, _ in units], pure=False)
        where = {future.key: positions for future, (_, positions) in zip(futures, units)}
        results: list[ReplayResult | None] = [None] * total
        done = 0
        for future in dask_completed(futures):
            positions = where[future.key]
            for position, result in zip(positions, future.result()):
                results[position] = result
            done += len(positions)
            report(done, total)
        return results
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
