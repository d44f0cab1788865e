"""The pool never deadlocks on its own finalizers (issue 19, item 2): `empty_cache()` and the
out-of-memory retry hold the pool while they wait for the streams, and a stream worker that
drops a tensor's last reference frees its block from a finalizer. Each case runs in a child
process with a time limit, so a deadlock fails the test instead of hanging the suite."""

import os
import subprocess
import sys
import textwrap

LIMIT_S = 120


def _run(code: str, memory: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=LIMIT_S,
                          env={**os.environ, "NPUMEM_SIM_MEMORY": memory, "NPUMEM_DEVICE": "sim"})


def test_the_out_of_memory_retry_with_tensors_dying_on_the_stream():
    done = _run("""
        import numpy as np, npumem, npumem.memory as mem
        from npumem import aclnn
        npumem.init(); npumem.set_device(0)
        s = npumem.create_stream()
        for _ in range(40):        # 32 MiB: every few steps the pool must release its cache
            a = npumem.from_numpy(np.ones((1024, 1024), np.float32), s)
            out = npumem.empty((1024, 1024), stream=s)
            aclnn.run_with_pool_workspace(aclnn.mul, aclnn.mul_get_workspace_size(a, a, out), s)
            del a, out
        s.synchronize()
        stats = mem.memory_stats()
        print(stats["num_alloc_retries"], stats["allocated_bytes.all.current"])
    """, "32MiB")
    assert done.returncode == 0, done.stderr
    retries, allocated = map(int, done.stdout.split())
    assert retries > 0 and allocated == 0                # the retry path ran; nothing leaked


def test_threads_running_ops_while_another_empties_the_cache():
    done = _run("""
        import threading, time
        import numpy as np, npumem, npumem.memory as mem
        from npumem import aclnn
        npumem.init(); npumem.set_device(0)
        stop, errors = threading.Event(), []

        def work():
            try:
                s = npumem.create_stream()
                for _ in range(60):
                    a = npumem.from_numpy(np.ones((256, 256), np.float32), s)
                    out = npumem.empty((256, 256), stream=s)
                    aclnn.run_with_pool_workspace(aclnn.mul, aclnn.mul_get_workspace_size(a, a, out), s)
                    del a, out
                s.synchronize()
            except Exception as exc:
                errors.append(exc)

        def empty():
            while not stop.is_set():
                mem.empty_cache()

        workers = [threading.Thread(target=work) for _ in range(4)]
        emptier = threading.Thread(target=empty)
        emptier.start()
        for t in workers: t.start()
        for t in workers: t.join()
        stop.set(); emptier.join()
        assert not errors, errors
        print(mem.memory_stats()["allocated_bytes.all.current"])
    """, "256MiB")
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == 0
