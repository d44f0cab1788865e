"""A profiling session: tracker + sampler around a run, then every output file in one folder.

Used by `npumem profile -- script.py` and by NPUMEM_PROFILE=1. Each output is written on its
own, to a temporary name renamed into place when whole: one that fails (a full disk) is reported
and the others are still written, and no file is ever left half-written under its name. One run
at a time writes a folder (output_files.FolderLock). The snapshots are written first: they are
what an interrupted run keeps.
"""

from __future__ import annotations

import builtins
import contextlib
import gc
import importlib.util
import os
import runpy
import signal
import sys
import threading
import traceback
import types
from pathlib import Path
from typing import NamedTuple

from ..errors import InvalidParamError
from ..output_files import LOCK_NAME, FolderLock, OutputPathError, written_whole
from .chrome import write_chrome_trace
from .html import render_html
from .leaks import settle
from .msprof import write_memory_record, write_operator_memory
from .report import build_report, format_report
from .sampler import Sampler
from .snapshot import build_snapshot, save_snapshot
from .tracker import Tracker

OUTPUTS = ("report.html", "snapshot.pickle", "trace.json", "memory_record.csv",
           "operator_memory.csv", "leaks.txt", "summary.txt")
SNAPSHOTS = ("torch_snapshot.pickle", "snapshot.pickle")      # what a profile folder is read by
INTERRUPTED_BUDGET_S = 3.5     # an interrupted run's time to save its snapshots (Ctrl-C: out in 5 s)


def profile_snapshot(path: str | os.PathLike) -> str:
    """The file to read for `path`: itself, or for a profile folder its torch_snapshot.pickle
    (PyTorch's memory, what a torch script's report is about), else its snapshot.pickle.
    InvalidParamError says what a folder lacks."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        return path
    for name in SNAPSHOTS:
        if os.path.isfile(os.path.join(path, name)):
            return os.path.join(path, name)
    raise InvalidParamError(f"{path} is a folder without torch_snapshot.pickle or snapshot.pickle "
                            "(the snapshots an npumem profile folder holds); give a profile "
                            "folder or a snapshot file")


def claim_folder(out: str | os.PathLike, force: bool = False) -> tuple[Path, FolderLock]:
    """prepare_folder, holding the folder's lock: a second run given the same folder is
    refused while this one runs. Release the lock when the files are written."""
    path = prepare_folder(out, force=True)
    try:
        lock = FolderLock(path).acquire()
    except OutputPathError as exc:
        raise InvalidParamError(str(exc)) from None
    except OSError as exc:
        raise InvalidParamError(f"cannot write to output folder {path}: {exc.strerror}") from None
    try:
        prepare_folder(path, force)
    except BaseException:
        lock.release()
        raise
    return path, lock


def prepare_folder(out: str | os.PathLike, force: bool = False) -> Path:
    """Create the output folder; refuse one that already holds files unless `force` (the lock of
    a run writing it does not count: claim_folder refuses that one, naming the run)."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise InvalidParamError(f"output folder {path} exists and is a file")
    if path.is_dir() and any(p.name != LOCK_NAME for p in path.iterdir()) and not force:
        raise InvalidParamError(f"output folder {path} exists and is not empty; choose another "
                                "--out or pass --force to overwrite its files")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".npumem-write-test-{os.getpid()}"      # runs side by side: one each
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise InvalidParamError(f"cannot write to output folder {path}: {exc.strerror}") from None
    return path


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
        from .. import memory as pool_api

        if not quick:
            settle()
            with pool_api._lock:
                pools = list(pool_api._pools.values())
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
        from .. import memory as pool_api

        with pool_api._lock:
            pools = [pool_api._pools[d] for d in sorted(pool_api._pools)]
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


class RunOutcome(NamedTuple):
    code: int               # the script's exit code (130 when interrupted)
    globals: dict           # its module globals, kept while the leak report is taken
    interrupted: bool       # Ctrl-C ended it


def run_target(target: list[str]) -> RunOutcome:
    """Run `script.py args...` (or `-m module args...`, found as `python -m` finds it) as
    __main__. The caller keeps the globals while it takes the leak report: what the script's
    code still holds when it finishes is what leaked, not what survives interpreter teardown.
    An exception the script raises is printed and gives exit code 1; a script or module that
    is not there is an InvalidParamError."""
    if not target:
        raise InvalidParamError("nothing to profile: give a script, e.g. npumem profile -- train.py")
    if target[0] == "-m" and len(target) < 2:
        raise InvalidParamError("-m needs a module name")
    if target[0] != "-m" and not os.path.isfile(target[0]):
        raise InvalidParamError(f"no such script: {target[0]}")
    saved_argv, saved_path, saved_main = sys.argv[:], sys.path[:], sys.modules["__main__"]
    main = types.ModuleType("__main__")
    try:
        with _interrupts_outside_npumem():
            if target[0] == "-m":
                sys.path.insert(0, os.getcwd())          # as `python -m` does
                missing = _check_module(target[1])
                if missing is not None:
                    raise _NotThere(missing)
                sys.argv = [target[1], *target[2:]]
                main.__dict__.update(runpy.run_module(target[1], run_name="__main__",
                                                      alter_sys=True))
            else:
                path = os.path.abspath(target[0])
                sys.argv = list(target)
                sys.path.insert(0, os.path.dirname(path))
                main.__file__, main.__builtins__ = path, builtins
                sys.modules["__main__"] = main          # pickle and multiprocessing look here
                with open(path, "rb") as source:
                    code = compile(source.read(), path, "exec")
                exec(code, main.__dict__)
        return RunOutcome(0, main.__dict__, False)
    except _NotThere as exc:
        raise InvalidParamError(str(exc)) from None
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return RunOutcome(exc.code or 0, main.__dict__, False)
        print(exc.code, file=sys.stderr)
        return RunOutcome(1, main.__dict__, False)
    except KeyboardInterrupt:
        return RunOutcome(130, main.__dict__, True)
    except BaseException:                 # noqa: BLE001 - the script's own error: show it, go on
        traceback.print_exc()
        return RunOutcome(1, main.__dict__, False)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        sys.modules["__main__"] = saved_main


class _NotThere(Exception):
    """-m of a module that is not there (not the script's own error)."""


def _check_module(name: str) -> str | None:
    """Why `-m name` cannot run (None: it can): the module, or a package's __main__, is not
    there, as `python -m` checks before it runs anything. A package of the name that fails to
    import is the script's own error and propagates."""
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError as exc:          # a parent package is missing
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            return (f"no module named {exc.name!r} (from -m {name}); run from the folder that "
                    "holds it or set PYTHONPATH")
        raise
    except ValueError:                           # e.g. a relative or empty name
        spec = None
    if spec is None:
        return f"no module named {name!r} (-m {name}); run from the folder that holds it or set " \
               "PYTHONPATH"
    if spec.submodule_search_locations is not None and \
            importlib.util.find_spec(f"{name}.__main__") is None:
        return (f"-m {name}: {name!r} is a package without a __main__ module; name the module "
                f"to run, e.g. -m {name}.train")
    return None


_OWN_CODE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the npumem package


@contextlib.contextmanager
def _interrupts_outside_npumem(retries: int = 50, wait_s: float = 0.01):
    """Ctrl-C as Python's own handler gives it, except while npumem's recording code runs (a
    tensor recorder's weakref callback, a tracker's bookkeeping): a KeyboardInterrupt raised
    there is swallowed (callbacks ignore exceptions) or leaves the recording half-updated. It
    is raised again a moment later, once the script's own code runs (at most `retries` times
    later, so a script blocked inside npumem still stops)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield                                    # a handler of the caller's: keep it
        return
    import _thread

    deferred = [0]
    timers: list[threading.Timer] = []

    def interrupt(signum, frame):
        inside = frame is not None and frame.f_code.co_filename.startswith(_OWN_CODE)
        if inside and deferred[0] < retries:
            deferred[0] += 1
            timer = threading.Timer(wait_s, _thread.interrupt_main)
            timer.daemon = True
            timers[:] = [timer]
            timer.start()
            return
        deferred[0] = 0
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    try:
        yield
    finally:
        for timer in timers:
            timer.cancel()
        if signal.getsignal(signal.SIGINT) is interrupt:
            signal.signal(signal.SIGINT, signal.default_int_handler)
