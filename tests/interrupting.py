"""Stopping a running `npumem` command the way a terminal or `timeout` does, for the tests of
what it leaves behind."""

import subprocess
import time


def interrupt(run: subprocess.Popen, ready: str, signal_number: int,
              settle: float = 0.0) -> tuple[int, str, float]:
    """Wait for the line `ready` on stdout, let it run `settle` more seconds, send the signal:
    (exit status, stderr, seconds from the signal to the exit). Never leaves the process."""
    try:
        assert run.stdout.readline().strip() == ready
        time.sleep(settle)
        sent = time.monotonic()
        run.send_signal(signal_number)
        code = run.wait(timeout=60)
        took = time.monotonic() - sent
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    stderr = run.stderr.read()
    run.stdout.close()
    run.stderr.close()
    return code, stderr, took
