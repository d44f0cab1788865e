"""Background jobs (a what-if replay: whatif.py) with their progress, polled by /api/job. Each
job runs in a daemon thread of its own (Ctrl-C does not wait for one); a job's state is read
and written under its lock."""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field


@dataclass
class Job:
    id: str
    progress: float = 0.0
    done: bool = False
    error: str | None = None
    result: dict | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def state(self) -> dict:
        with self.lock:
            return {"id": self.id, "progress": self.progress, "done": self.done,
                    "error": self.error, "result": self.result}


class Jobs:
    def __init__(self):
        self._jobs: dict[str, Job] = {}
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()

    def get(self, name: str) -> Job | None:
        with self._lock:
            return self._jobs.get(name)

    def new(self) -> Job:
        with self._lock:
            job = Job(f"job{next(self._numbers)}")
            self._jobs[job.id] = job
            return job

    def start_whatif(self, source, setting: str) -> str:
        from .whatif import check_setting, run_whatif

        config = check_setting(source, setting)          # a bad setting: 400, now
        job = self.new()

        def work():
            try:
                result = run_whatif(source, config, setting, job)
                with job.lock:
                    job.result, job.progress = result, 1.0
            except Exception as exc:             # shown on the page
                with job.lock:
                    job.error = f"{type(exc).__name__}: {exc}" if not str(exc) else str(exc)
            finally:
                with job.lock:
                    job.done = True

        threading.Thread(target=work, name=f"npumem-view-{job.id}", daemon=True).start()
        return job.id
