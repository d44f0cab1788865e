"""Run one npumem verb (or one reading path of tests/fuzzing.py) on one file in a child
process with a memory and a time limit, and say how it ended: exit status, signal, whether a
traceback reached stderr, peak RSS and time.

The child is forked from a process that has imported npumem already, so a run costs what the
verb costs, not an interpreter's start (tests/test_hostile_budget.py, bench/fuzz_hostile.py).
"""

from __future__ import annotations

import os
import resource
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Callable

# what every verb is run as: the file goes where FILE is
VERBS = {
    "report": ["report", "FILE"],
    "replay": ["replay", "FILE", "--scheduler", "serial"],
    "replay --allocator pool": ["replay", "FILE", "--allocator", "pool", "--scheduler",
                                "serial"],
    "replay --check": ["replay", "--check", "FILE", "--scheduler", "serial"],
    "convert": ["convert", "FILE", "OUT.jsonl"],
    "diff": ["diff", "FILE", "FILE"],
    "tune": ["tune", "FILE", "--scheduler", "serial"],
    "plan": ["plan", "FILE", "--time-limit", "1"],
}
CRASH = 3          # a reading path's exit status for an exception that is not a clear error


@dataclass
class Ended:
    what: str
    status: int | None          # exit status, None when a signal ended it
    signal: int | None
    traceback: bool
    rss_mib: float
    seconds: float
    stderr: str

    @property
    def sanitizer(self) -> bool:
        """ASan or UBSan reported something (a build with them, bench/fuzz_asan.sh)."""
        return "AddressSanitizer" in self.stderr or "runtime error:" in self.stderr

    @property
    def clean(self) -> bool:
        return (self.signal is None and self.status in (0, 1, 2) and not self.traceback
                and not self.sanitizer)

    def __str__(self) -> str:
        how = f"signal {self.signal}" if self.signal else f"exit {self.status}"
        tail = self.stderr.strip().splitlines()[-1:] or [""]
        return (f"{self.what}: {how}, {self.rss_mib:.0f} MiB, {self.seconds:.1f} s"
                f"{', traceback' if self.traceback else ''}: {tail[0][:300]}")


def run_limited(what: str, work: Callable[[], int], memory: int = 2 << 30,
                seconds: int = 60) -> Ended:
    """`work()` (its return value the exit status) in a forked child limited to `memory` bytes
    of RSS (0: no limit) and `seconds` of CPU time; killed past twice that of wall time. RSS
    is watched from here, not limited with RLIMIT_AS: the simulated device reserves address
    space it never touches, and ASan's shadow memory is terabytes of it."""
    folder = tempfile.mkdtemp(prefix="npumem-hostile-")
    err_path = os.path.join(folder, "stderr")
    open(err_path, "w").close()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:                                            # the child
        code = 99
        try:
            resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 1))
            err = os.open(err_path, os.O_WRONLY)
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(err, 2)
            # (under pytest sys.stderr is its capture, not fd 2)
            sys.stdout = open(1, "w", closefd=False)
            sys.stderr = open(2, "w", closefd=False, errors="backslashreplace")
            try:
                code = work()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException:                           # noqa: BLE001 - reported as such
                traceback.print_exc()
                code = CRASH
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
    deadline = start + 2 * seconds
    over = ""
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            over = f"killed after {2 * seconds} s"
        elif memory and _rss(pid) > memory:
            over = f"killed past {memory >> 20} MiB of RSS"
        if over:
            os.kill(pid, signal.SIGKILL)
            _, status, usage = os.wait4(pid, 0)
            break
        time.sleep(0.005)
    elapsed = time.monotonic() - start
    with open(err_path, errors="replace") as f:
        stderr = f.read() + (f"\n{over}" if over else "")
    os.unlink(err_path)
    os.rmdir(folder)
    return Ended(what, os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
                 os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                 "Traceback (most recent call last)" in stderr, usage.ru_maxrss / 1024, elapsed,
                 stderr)


def _rss(pid: int) -> int:
    """The process's resident bytes now (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


def run(verb: str, path: str, memory: int = 2 << 30, seconds: int = 60) -> Ended:
    """`npumem VERB` (a key of VERBS) on `path`, as run_limited runs it."""
    from npumem.cli import main

    out = tempfile.mkdtemp(prefix="npumem-hostile-out-")
    args = [a.replace("FILE", path).replace("OUT.jsonl", os.path.join(out, "out.jsonl"))
            for a in VERBS[verb]]

    def work() -> int:
        main(args, prog_name="npumem")
        return 0

    try:
        return run_limited(verb, work, memory, seconds)
    finally:
        for name in os.listdir(out):
            os.unlink(os.path.join(out, name))
        os.rmdir(out)


def run_reader(name: str, read: Callable[[str], None], path: str, memory: int = 2 << 30,
               seconds: int = 60) -> Ended:
    """A reading path of tests/fuzzing.py on `path`: exit 0 when it reads, 2 on a clear error
    that names the file, CRASH (a traceback on stderr) on anything else."""
    from .fuzzing import ReaderCrash, check_one

    def work() -> int:
        try:
            with open(path, "rb") as f:
                check_one(read, path, f.read())
        except ReaderCrash:
            raise
        return 0

    return run_limited(name, work, memory, seconds)
