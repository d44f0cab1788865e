"""Many replays at once: settings sweeps and multi-trace runs, in local processes or on Dask.

A job names a trace file, an allocator and pool settings; the worker reads the trace itself, so
nothing large crosses process boundaries. Schedulers:

    "processes"       local worker processes, one per core (the default)
    "serial"          in this process, one after another
    "dask"            a local Dask cluster (pip install "npumem[dask]")
    "tcp://host:port" an existing Dask scheduler: its workers must have npumem and the traces
"""

from __future__ import annotations

import itertools
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Callable, Sequence

from ..alloc.settings import describe_changes, parse_settings
from ..errors import InvalidParamError
from ..units import GiB
from .formats import read_trace, read_with_steps
from .replay import ReplayResult, replay
from .torch_replay import replay_file

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

    def run(self, progress: Callable[[int], None] | None = None) -> ReplayResult:
        """`progress(events)` every 10,000 events replayed."""
        if self.allocator in TORCH_ALLOCATORS:
            result = replay_file(self.trace, self.allocator, self.settings, self.memory,
                                 progress=progress)
            return ReplayResult.from_torch(result, self.allocator)
        settings = parse_settings(self.settings)
        if settings.predictive:      # the program's step marks, where the trace has them
            events, marks, note = read_with_steps(self.trace, self.steps)
        else:
            events, marks, note = read_trace(self.trace), (), None
        result = replay(events, self.allocator, settings, trace_name=self.trace,
                        memory=self.memory or 64 * GiB, progress=progress,
                        planner_lag=self.planner_lag, steps=marks)
        if marks:
            how = f"{self.steps!r} annotations" if self.steps else "npumem.memory.step() marks"
            result.notes.insert(0, f"{len(marks)} steps marked by the trace's {how}")
        elif note:
            result.notes.append(note)
        return result


def run_job(job: ReplayJob) -> ReplayResult:
    """Module-level so process pools and Dask can pickle it."""
    return job.run()


def sweep_settings(base: str, sweeps: Sequence[str], validate=parse_settings) -> list[str]:
    """Every combination of `key=v1,v2,...` sweeps on top of `base`, as settings strings.

    Each string is checked with `validate` here, so a typo fails before any replay starts."""
    axes = []
    for sweep in sweeps:
        key, sep, values = sweep.replace(":", "=", 1).partition("=")
        choices = [value.strip() for value in values.split(",") if value.strip()]
        if not sep or not choices:
            raise InvalidParamError(f"sweep {sweep!r}: expected key=value1,value2,...")
        axes.append([f"{key.strip()}:{value}" for value in choices])
    combos = [",".join(filter(None, [base, *combo])) for combo in itertools.product(*axes)]
    for combo in combos:
        validate(combo)
    return combos


def settings_label(settings: str) -> str:
    return describe_changes(parse_settings(settings))


def run_jobs(jobs: Sequence[ReplayJob], scheduler: str = "processes", workers: int | None = None,
             progress: Callable[..., None] | None = None) -> list[ReplayResult]:
    """Results in the order of `jobs`; `progress(done, total)` after each finished job, and in
    this process also `progress(done, total, events)` while a long replay runs."""
    total = len(jobs)
    report = progress or (lambda done, total, events=0: None)
    if scheduler == "serial" or total <= 1:
        results = []
        for job in jobs:
            results.append(job.run(lambda events: report(len(results), total, events)))
            report(len(results), total)
        return results
    if scheduler == "processes":
        return _run_processes(jobs, workers or os.cpu_count() or 1, report)
    if scheduler == "dask" or scheduler.startswith(("tcp://", "tls://")):
        return _run_dask(jobs, scheduler, workers, report)
    raise ValueError(f"unknown scheduler {scheduler!r}: use processes, serial, dask or tcp://host:port")


def _run_processes(jobs, workers, report) -> list[ReplayResult]:
    results: list[ReplayResult | None] = [None] * len(jobs)
    pool = ProcessPoolExecutor(max_workers=min(workers, len(jobs)))
    try:
        futures = {pool.submit(run_job, job): index for index, job in enumerate(jobs)}
        for done, future in enumerate(as_completed(futures), 1):
            results[futures[future]] = future.result()
            report(done, len(jobs))
    except BaseException:
        # Ctrl-C or a failed job: stop now, not after the replays already running. The
        # executor has no public way to stop its workers, so they are terminated here.
        for process in list((getattr(pool, "_processes", None) or {}).values()):
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return results


def _run_dask(jobs, scheduler, workers, report) -> list[ReplayResult]:
    try:
        from dask.distributed import Client, LocalCluster, as_completed as dask_completed
    except ImportError:
        raise RuntimeError('the Dask scheduler needs dask.distributed: pip install "npumem[dask]"') from None
    cluster = None
    if scheduler == "dask":
        cluster = LocalCluster(n_workers=workers or os.cpu_count() or 1, threads_per_worker=1,
                               processes=True, dashboard_address=None)
        client = Client(cluster)
    else:
        client = Client(scheduler, timeout="10s")
    try:
        futures = client.map(run_job, list(jobs), pure=False)
        index = {future.key: position for position, future in enumerate(futures)}
        results: list[ReplayResult | None] = [None] * len(jobs)
        for done, future in enumerate(dask_completed(futures), 1):
            results[index[future.key]] = future.result()
            report(done, len(jobs))
        return results
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
