"""A profiling session: tracker + sampler around a run, then every output file in one folder.

Used by `npumem profile -- script.py` and by NPUMEM_PROFILE=1. Each output is written on its
own, to a temporary name renamed into place when whole: one that fails (a full disk) is reported
and the others are still written, and no file is ever left half-written under its name. One run
at a time writes a folder (folder.claim_folder). The snapshots are written first: they are
what an interrupted run keeps.
"""

from __future__ import annotations

import contextlib
import gc
import signal
import threading
from pathlib import Path

from ..alloc.process_pools import POOLS
from ..output_files import written_whole
from .chrome import write_chrome_trace
from .html import render_html
from .leaks import settle
from .msprof import write_memory_record, write_operator_memory
from .report import build_report, format_report
from .sampler import Sampler
from .snapshot import build_snapshot, save_snapshot
from .tracker import Tracker

INTERRUPTED_BUDGET_S = 3.5     # an interrupted run's time to save its snapshots (Ctrl-C: out in 5 s)


class OutOfTime(BaseException):
    """An interrupted run's time to save is up (a BaseException: writers' handlers let it by)."""


class ProfileSession:
    def __init__(self, stacks: bool = False, interval_ms: float = 10.0,
                 max_entries: int = 1_000_000, torch_memory: bool = True,
                 sample_bytes: int = 0):
        self.tracker = Tracker(stacks=stacks, max_entries=max_entries,
                               torch_memory=bool(torch_memory))   # the CPU too, when asked
        if self.tracker.torch_memory is not None:
            self.tracker.torch_memory.sample_bytes = sample_bytes
        self.sampler = Sampler(interval_ms=interval_ms)
        self.written: list[str] = []        # files written whole by write()
        self.incomplete: list[str] = []     # files write() tried and could not write
        self.torch_report = None            # the report on PyTorch's memory, once written

    def start(self) -> "ProfileSession":
        self.tracker.start()
        self.sampler.start()
        return self

    def stop(self, quick: bool = False) -> None:
        """Stop recording. `quick` (an interrupted run) skips settling: waiting for queued
        stream work and collecting garbage is for a leak report, which it does not write."""
        if not quick:
            settle()
            pools = [pool for _, pool in POOLS.in_device_order()]
            for pool in pools:          # frees waiting on other streams' (now finished) work
                pool.collect_pending()
        self.sampler.stop()
        self.tracker.stop()

    def write(self, folder: Path, title: str, echo=print, interrupted: bool = False) -> list[str]:
        """Write every output into `folder`; returns the problems (empty when all went well).

        PyTorch first: when the script used torch, summary.txt and report.html are about
        PyTorch's memory (torch_snapshot.pickle), and npumem's own runtime has its files only
        if the script used it (npumem_summary.txt and npumem_report.html beside them).
        The snapshots come first; `interrupted` writes only them (the reports of a big
        recording take a minute: `npumem report` makes them later)."""
        problems: list[str] = []
        self.written, self.incomplete = [], []

        def attempt(name: str, write) -> None:
            target = folder / name
            try:
                with written_whole(target) as partial:
                    write(Path(partial))
            except Exception as exc:     # noqa: BLE001 - keep the other outputs
                self.incomplete.append(name)
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else \
                    f"{type(exc).__name__}: {exc}"
                problems.append(f"{name}: {reason}")
                with contextlib.suppress(OSError):
                    target.unlink()      # an older run's file (--force) would pass for this one's
            else:
                self.written.append(name)

        torch_snapshot = self._torch_snapshot(problems)
        snapshot = self._npumem_snapshot(problems)
        used = bool(snapshot["segments"] or any(snapshot["device_traces"]))
        # an interrupted run keeps what it recorded only: an empty snapshot would mislead
        npumem_files = used or (torch_snapshot is None and not interrupted)
        if torch_snapshot is not None:
            attempt("torch_snapshot.pickle", lambda p: save_snapshot(torch_snapshot, p))
        if npumem_files:
            attempt("snapshot.pickle", lambda p: save_snapshot(snapshot, p))
        if interrupted:
            return problems
        if npumem_files:
            prefix = "npumem_" if torch_snapshot is not None else ""
            self._write_npumem(folder, title, snapshot, attempt, prefix)
        if torch_snapshot is not None:
            recorder = self.tracker.torch_memory
            report = build_report(torch_snapshot, f"{title}: PyTorch's {recorder.device} memory")
            self.torch_report = report
            attempt("summary.txt", lambda p: p.write_text(format_report(report), encoding="utf-8"))
            attempt("report.html", lambda p: p.write_text(render_html(report), encoding="utf-8"))
        return problems

    def write_interrupted(self, folder: Path, title: str,
                          seconds: float = INTERRUPTED_BUDGET_S) -> list[str]:
        """Stop and write the snapshots only, within `seconds` where the platform has timers:
        whatever is whole by then stays, the rest is listed in `incomplete`. Ctrl-C must end
        a run at once, and a recording of a million events takes longer than that to save.
        A caller about to exit calls gc.freeze() first: the interpreter's last collections
        would walk the whole recording again (seconds)."""
        problems: list[str] = []
        self.written, self.incomplete = [], []
        collecting = gc.isenabled()
        gc.disable()            # a million new dicts would set off collections of everything
        try:
            with _deadline(seconds):
                self.stop(quick=True)
                problems = self.write(folder, title, interrupted=True)
        except OutOfTime:
            recorder = self.tracker.torch_memory
            torch_used = recorder is not None and recorder.device is not None
            expected = (["torch_snapshot.pickle"] if torch_used else []) + \
                (["snapshot.pickle"] if self.npumem_used() else [])
            missing = [name for name in expected if name not in self.written]
            self.incomplete += [name for name in missing if name not in self.incomplete]
            problems += [f"{name}: not saved: the recording takes longer than the {seconds:g} s "
                         "an interrupted run waits (--max-entries keeps fewer events)"
                         for name in missing]
        finally:
            if collecting:
                gc.enable()
        return problems

    def npumem_used(self) -> bool:
        """Whether the script allocated through npumem's own runtime."""
        return bool(self.tracker.devices())

    def _npumem_snapshot(self, problems: list[str]) -> dict:
        pools = [pool for _, pool in POOLS.in_device_order()]
        try:
            return build_snapshot(pools, self.tracker)
        except Exception as exc:         # noqa: BLE001
            problems.append(f"snapshot: {type(exc).__name__}: {exc}")
            return {"segments": [], "device_traces": []}

    def _write_npumem(self, folder: Path, title: str, snapshot: dict, attempt,
                      prefix: str) -> None:
        leaks = self.tracker.leaks()
        report = build_report(snapshot, title, leaks, self.tracker.annotations(),
                              self.sampler.samples(), clock=self.tracker.wall_us)
        report.growth = [growth.describe() for growth in self.tracker.growth()]
        report.kernels = [timeline for _, _, timeline in self.tracker.kernels()]
        if self.tracker.dropped:
            report.notes.append(f"{self.tracker.dropped} early events fell out of the ring buffer "
                                "(raise max_entries); the timeline starts later than the run.")
        attempt("trace.json", lambda p: write_chrome_trace(p, self.tracker, self.sampler.samples()))
        attempt("memory_record.csv", lambda p: write_memory_record(p, self.tracker))
        attempt("operator_memory.csv", lambda p: write_operator_memory(p, self.tracker))
        growing = "".join(f"\nGrowing while the program ran (probable leak): {line}"
                          for line in report.growth)
        attempt("leaks.txt", lambda p: p.write_text(leaks.format(limit=100) + growing + "\n",
                                                    encoding="utf-8"))
        attempt(f"{prefix}summary.txt",
                lambda p: p.write_text(format_report(report), encoding="utf-8"))
        attempt(f"{prefix}report.html",
                lambda p: p.write_text(render_html(report), encoding="utf-8"))

    def _torch_snapshot(self, problems: list[str]) -> dict | None:
        recorder = self.tracker.torch_memory
        if recorder is None:
            return None
        if recorder.error:
            problems.append(f"PyTorch's memory: {recorder.error}")
        return recorder.snapshot()


@contextlib.contextmanager
def _deadline(seconds: float):
    """Raise OutOfTime in the main thread after `seconds` (no limit where there is no
    setitimer, or off the main thread)."""
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise OutOfTime()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
