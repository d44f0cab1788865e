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
        import time
        import numpy as np, npumem, npumem.memory as mem
        from npumem import aclnn
        npumem.init(); npumem.set_device(0)
        s = npumem.create_stream()
        for _ in range(40):        # 32 MiB: every few steps the pool must release its cache
            # A slow kernel first, so the stream always lags: the tensors below die on its
            # worker, and the host runs out of memory while they are still queued.
            s.enqueue(lambda: time.sleep(0.02), "slow kernel")
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


def test_stress_eight_threads_of_pool_and_tensor_work_with_empty_cache():
    """Issue 19's stress run: pool allocations, tensor ops and cross-stream frees on 8 threads
    while the cache is emptied. NPUMEM_STRESS_SECONDS runs it longer (default 3 s)."""
    seconds = float(os.environ.get("NPUMEM_STRESS_SECONDS", "3"))
    done = _run(f"""
        import random, threading, time
        import numpy as np, npumem, npumem.memory as mem
        from npumem import aclnn
        npumem.init(); npumem.set_device(0)
        stop, errors, steps = time.monotonic() + {seconds}, [], [0]

        def tensors(seed):
            rng = random.Random(seed)
            try:
                s = npumem.create_stream()
                while time.monotonic() < stop:
                    n = rng.choice([64, 256, 1024])
                    a = npumem.from_numpy(np.ones((n, n), np.float32), s)
                    out = npumem.empty((n, n), stream=s)
                    aclnn.run_with_pool_workspace(aclnn.mul, aclnn.mul_get_workspace_size(a, a, out), s)
                    if rng.random() < 0.3:
                        s.synchronize()
                    del a, out
                    steps[0] += 1
                s.synchronize()
            except Exception as exc:
                errors.append(repr(exc))

        def blocks(seed):
            rng = random.Random(seed)
            try:
                mine, other = npumem.create_stream(), npumem.create_stream()
                held = []
                while time.monotonic() < stop:
                    if held and (len(held) >= 32 or rng.random() < 0.5):    # at most 128 MiB
                        mem.caching_allocator_delete(held.pop(rng.randrange(len(held))))
                    else:
                        pointer = mem.caching_allocator_alloc(rng.randrange(1, 4 << 20), stream=mine)
                        if rng.random() < 0.3:
                            mem.record_stream(pointer, other)       # freed across streams
                        held.append(pointer)
                for pointer in held:
                    mem.caching_allocator_delete(pointer)
            except Exception as exc:
                errors.append(repr(exc))

        def empty():
            while time.monotonic() < stop:
                mem.empty_cache()
                time.sleep(0.01)

        threads = [threading.Thread(target=tensors, args=(i,)) for i in range(4)] + \\
            [threading.Thread(target=blocks, args=(i,)) for i in range(3)] + [threading.Thread(target=empty)]
        for t in threads: t.start()
        for t in threads: t.join()
        npumem.synchronize_device()
        mem.get_allocator().collect_pending()     # cross-stream frees end lazily otherwise
        stats = mem.memory_stats()
        assert not errors, errors[:3]
        print(steps[0], stats["allocated_bytes.all.current"], stats["active_bytes.all.current"])
    """, "2GiB")                      # room to spare: this is about threads, not about OOM
    assert done.returncode == 0, done.stderr[-3000:]
    steps, allocated, active = map(int, done.stdout.split())
    assert steps > 0 and allocated == 0 and active == 0
