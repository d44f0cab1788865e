"""A profiling session: tracker + sampler around a run, then every output file in one folder.

Used by `npumem profile -- script.py` and by NPUMEM_PROFILE=1. Each output is written on its
own: one that fails is reported and the others are still written.
"""

from __future__ import annotations

import builtins
import os
import runpy
import sys
import traceback
import types
from pathlib import Path

from ..errors import InvalidParamError
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


def prepare_folder(out: str | os.PathLike, force: bool = False) -> Path:
    """Create the output folder; refuse one that already holds files unless `force`."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise InvalidParamError(f"output folder {path} exists and is a file")
    if path.is_dir() and any(path.iterdir()) and not force:
        raise InvalidParamError(f"output folder {path} exists and is not empty; choose another "
                                "--out or pass --force to overwrite its files")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".npumem-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise InvalidParamError(f"cannot write to output folder {path}: {exc.strerror}") from None
    return path


class ProfileSession:
    def __init__(self, stacks: bool = False, interval_ms: float = 10.0,
                 max_entries: int = 1_000_000, torch_memory: bool = True):
        self.tracker = Tracker(stacks=stacks, max_entries=max_entries,
                               torch_memory=bool(torch_memory))   # the CPU too, when asked
        self.sampler = Sampler(interval_ms=interval_ms)

    def start(self) -> "ProfileSession":
        self.tracker.start()
        self.sampler.start()
        return self

    def stop(self) -> None:
        from .. import memory as pool_api

        settle()
        with pool_api._lock:
            pools = list(pool_api._pools.values())
        for pool in pools:          # frees waiting on other streams' (now finished) work
            pool.collect_pending()
        self.sampler.stop()
        self.tracker.stop()

    def write(self, folder: Path, title: str, echo=print) -> list[str]:
        """Write every output into `folder`; returns the problems (empty when all went well).

        PyTorch first: when the script used torch, summary.txt and report.html are about
        PyTorch's memory (torch_snapshot.pickle), and npumem's own runtime has its files only
        if the script used it (npumem_summary.txt and npumem_report.html beside them)."""
        problems: list[str] = []

        def attempt(name: str, write) -> None:
            try:
                write(folder / name)
            except Exception as exc:     # noqa: BLE001 - keep the other outputs
                problems.append(f"{name}: {type(exc).__name__}: {exc}")

        torch_snapshot = self._torch_snapshot(problems)
        snapshot = self._npumem_snapshot(problems)
        used = bool(snapshot["segments"] or any(snapshot["device_traces"]))
        if used or torch_snapshot is None:
            prefix = "npumem_" if torch_snapshot is not None else ""
            self._write_npumem(folder, title, snapshot, attempt, prefix)
        if torch_snapshot is not None:
            recorder = self.tracker.torch_memory
            report = build_report(torch_snapshot, f"{title}: PyTorch's {recorder.device} memory")
            attempt("torch_snapshot.pickle", lambda p: save_snapshot(torch_snapshot, p))
            attempt("summary.txt", lambda p: p.write_text(format_report(report), encoding="utf-8"))
            attempt("report.html", lambda p: p.write_text(render_html(report), encoding="utf-8"))
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
        attempt("snapshot.pickle", lambda p: save_snapshot(snapshot, p))
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


def run_target(target: list[str]) -> tuple[int, dict]:
    """Run `script.py args...` (or `-m module args...`) as __main__; returns its exit code and
    its module globals. The caller keeps the globals while it takes the leak report: what the
    script's code still holds when it finishes is what leaked, not what survives interpreter
    teardown. An exception the script raises is printed and gives exit code 1."""
    if not target:
        raise InvalidParamError("nothing to profile: give a script, e.g. npumem profile -- train.py")
    if target[0] == "-m" and len(target) < 2:
        raise InvalidParamError("-m needs a module name")
    if target[0] != "-m" and not os.path.isfile(target[0]):
        raise InvalidParamError(f"no such script: {target[0]}")
    saved_argv, saved_path, saved_main = sys.argv[:], sys.path[:], sys.modules["__main__"]
    main = types.ModuleType("__main__")
    try:
        if target[0] == "-m":
            sys.argv = [target[1], *target[2:]]
            main.__dict__.update(runpy.run_module(target[1], run_name="__main__", alter_sys=True))
        else:
            path = os.path.abspath(target[0])
            sys.argv = list(target)
            sys.path.insert(0, os.path.dirname(path))
            main.__file__, main.__builtins__ = path, builtins
            sys.modules["__main__"] = main          # pickle and multiprocessing look here
            with open(path, "rb") as source:
                code = compile(source.read(), path, "exec")
            exec(code, main.__dict__)
        return 0, main.__dict__
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0, main.__dict__
        print(exc.code, file=sys.stderr)
        return 1, main.__dict__
    except KeyboardInterrupt:
        return 130, main.__dict__
    except BaseException:                 # noqa: BLE001 - the script's own error: show it, go on
        traceback.print_exc()
        return 1, main.__dict__
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        sys.modules["__main__"] = saved_main
