"""Memory released while queued work still copies it (issue 19, item 3): never a crash. A free
racing with a copy leaves the bytes mapped until the copy ends and is reported as use after
free at synchronize; a device reset waits for queued work before it releases memory. Each case
runs in a child process, so a regression shows as a failed test, not a dead test run."""

import os
import subprocess
import sys
import textwrap


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=240, env={**os.environ, "NPUMEM_DEVICE": "sim"})


def test_freeing_the_source_of_a_running_copy_is_reported_not_a_crash():
    done = _run("""
        import time, npumem
        npumem.init(); npumem.set_device(0)
        s = npumem.create_stream()
        size, reported = 16 << 20, 0
        for i in range(20):
            src, dst = npumem.malloc(size), npumem.malloc(size)
            npumem.memcpy_async(dst, size, src, size, npumem.MemcpyKind.DEVICE_TO_DEVICE, s)
            time.sleep(0.0005 * (i % 5))          # free before, during and after the copy
            npumem.free(src)
            try:
                s.synchronize()
            except npumem.errors.AsyncTaskError as exc:
                assert "use after free" in str(exc), exc
                reported += 1
            npumem.free(dst)
        print(reported)
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout) > 0                    # at least the frees before the copy


def test_reset_during_a_copy_into_a_pool_block_waits_for_the_copy():
    done = _run("""
        import npumem, npumem.memory as mem
        npumem.init(); npumem.set_device(0)
        s = npumem.create_stream()
        size = 256 << 20
        dst = mem.caching_allocator_alloc(size, stream=s)
        src = npumem.malloc(size)
        npumem.memcpy_async(dst, size, src, size, npumem.MemcpyKind.DEVICE_TO_DEVICE, s)
        npumem.reset_device(0)
        npumem.finalize()
        print("done")
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "done" and "use after free" not in done.stderr
