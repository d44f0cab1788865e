"""`npumem demo`: the single-operator flow of the seeds, end to end on the simulated NPU (or any
backend: `--device torch:cpu`, `torch:cuda`, `torch:npu`).

init -> device -> stream -> caching pool -> H2D through pinned staging buffers -> two-phase Add
and MatMul (the MatMul reads a transposed, non-contiguous view, so phase 1 asks for a workspace)
-> D2H -> verify against numpy -> sync -> memory summary -> cleanup, printing each step.
"""

from __future__ import annotations

import math
import os
import pickle
import time
from typing import Callable

import numpy as np

from . import memory as mem
from . import runtime as rt
from .constants import MemAttr
from .device.sanitizer import SANITIZER
from .device.select import check_spec
from .errors import InvalidParamError
from .ops import aclnn
from .ops.tensor import empty, from_numpy
from .units import format_size

STEPS = 10


def run_demo(size: int = 1 << 20, device: str = "sim", echo: Callable[[str], None] = print,
             out_dir: str | None = None) -> bool:
    """Run the flow on `size` float32 elements (Add) and a sqrt(size)-square MatMul; returns
    True when verification passes and nothing is left allocated."""
    check_spec(device)                    # a bad name fails before any work
    step = iter(range(1, STEPS + 1))

    def say(text: str) -> None:
        echo(f"[{next(step)}/{STEPS}] {text}")

    side = max(1, math.isqrt(size))
    host_need = 24 * size + 16 * side * side         # float64 draws, float32 copies, results
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if host_need > ram // 2:
        raise InvalidParamError(f"demo: {size:,} elements need about {format_size(host_need)} of "
                                f"host memory for their data, more than half of this machine's "
                                f"{format_size(ram)}; pass a smaller --size")
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(size).astype(np.float32), rng.standard_normal(size).astype(np.float32)
    m, n = (rng.standard_normal((side, side)).astype(np.float32) for _ in range(2))
    rt.init(backend=device)
    try:
        backend = rt.get_backend()
        what = "simulated NPU" if backend.name == "sim" else f"{backend.name} backend (PyTorch memory)"
        say(f"init: {what}, {rt.get_device_count()} device(s), run mode {rt.get_run_mode().name}")
        rt.set_device(0)
        free0, total = rt.get_mem_info(MemAttr.HBM_MEM)
        say(f"set_device(0): HBM {format_size(free0)} free of {format_size(total)}")
        device_need = 4 * (3 * size + 4 * side * side) + (8 << 20)   # tensors, workspace, pages
        if device_need > free0:
            raise InvalidParamError(
                f"demo: {size:,} elements need about {format_size(device_need)} of device memory "
                f"and device 0 has {format_size(free0)} free; pass a smaller --size (or give the "
                "simulated NPU more with NPUMEM_SIM_MEMORY)")
        stream = rt.create_stream()
        say(f"create_stream: {stream!r}")
        mem.record_memory_history(max_entries=10_000)
        pool = mem.get_allocator()
        layout = "expandable segments (2 MiB pages mapped on demand)" if pool.expandable else \
            "segments"
        say(f"caching pool on device 0: {layout}; pinned host pool for staging buffers")

        t0 = time.perf_counter()
        a, b = from_numpy(x, stream), from_numpy(y, stream)
        mat_a, mat_b = from_numpy(m, stream), from_numpy(n, stream)
        staged = x.nbytes + y.nbytes + m.nbytes + n.nbytes
        say(f"H2D: {format_size(staged)} staged through pinned buffers and queued "
            f"(returned after {(time.perf_counter() - t0) * 1e3:.2f} ms)")

        c = empty((size,), stream=stream)
        add_ws = aclnn.run_with_pool_workspace(
            aclnn.add, aclnn.add_get_workspace_size(a, b, 1.0, c), stream)
        say(f"aclnnAdd c = a + b on {size} elements: phase 1 -> workspace {add_ws} bytes "
            "(contiguous inputs need no scratch), phase 2 queued")

        a_t = mat_a.t()
        product = empty((side, side), stream=stream)
        mm_ws = aclnn.run_with_pool_workspace(
            aclnn.matmul, aclnn.matmul_get_workspace_size(a_t, mat_b, product), stream)
        say(f"aclnnMatmul A.T @ B ({side}x{side}, A.T is a non-contiguous view): phase 1 -> "
            f"workspace {mm_ws} bytes for its contiguous copy, allocated from the pool, phase 2 queued")

        got_c, got_p = c.numpy(), product.numpy()
        ok_add = np.allclose(got_c, x + y, rtol=1e-5, atol=1e-5)
        ok_mm = np.allclose(got_p, m.T @ n, rtol=1e-4, atol=1e-3 * side)
        passed = bool(ok_add and ok_mm and mm_ws > 0)
        say(f"D2H and Result verification: {'PASS' if passed else 'FAIL'} "
            f"(Add {'matches' if ok_add else 'DIFFERS from'} numpy, MatMul "
            f"{'matches' if ok_mm else 'DIFFERS from'} numpy)")

        rt.synchronize_stream(stream)
        stats = pool.memory_stats()
        frag = pool.fragmentation()["ratio"]
        hits, misses = stats.get("num_cache_hits", 0), stats.get("num_cache_misses", 0)
        hit_rate = hits / (hits + misses) if hits + misses else 0.0
        say(f"synchronize_stream; memory: peak allocated "
            f"{format_size(stats['allocated_bytes.all.peak'])}, peak reserved "
            f"{format_size(stats['reserved_bytes.all.peak'])}, pool hit rate {hit_rate:.0%} "
            f"({hits}/{hits + misses}), fragmentation {frag:.1%}")
        t0 = time.perf_counter()
        del a, b, c, mat_a, mat_b, a_t, product      # tensors give their blocks back to the pool
        if out_dir:         # after the frees: what a report calls live at the end is a leak
            os.makedirs(out_dir, exist_ok=True)
            path = os.path.join(out_dir, "snapshot.pickle")
            with open(path, "wb") as f:
                pickle.dump(mem.memory_snapshot(), f)
            echo(f"       memory snapshot written to {path}")
        mem.empty_cache()
        rt.destroy_stream(stream)
        leaked = rt.reset_device(0)
        say(f"cleanup in {(time.perf_counter() - t0) * 1e3:.2f} ms: live allocations left: "
            f"{len(leaked)}")
        if not SANITIZER.on:
            echo("       accesses inside the caching pool's blocks were not checked: "
                 "NPUMEM_SANITIZE=free catches use after free, double free and stale tensors "
                 "there at no cost per pool allocation; NPUMEM_SANITIZE=1 catches overruns inside "
                 "a block and cross-stream frees too (about 3x the pool's cost)")
        elif not SANITIZER.full:
            echo("       accesses inside the caching pool's blocks were checked for use after "
                 "free (NPUMEM_SANITIZE=free); NPUMEM_SANITIZE=1 also checks overruns inside a "
                 "block and cross-stream frees")
        return passed and not leaked
    finally:
        if rt.is_initialized():
            rt.finalize()
