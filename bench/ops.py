"""Two-phase operators on the simulated NPU against the same numpy call, in one run.

    python bench/ops.py [--repeat 30] [--json]

For each case, npumem runs phase 1, allocates the workspace from the pool, runs phase 2 on a
stream and synchronizes; numpy runs the kernel's computation on host arrays. The ratio
npumem / numpy shows the cost of the API (validation, executor, workspace, stream hop) on small
ops and that large ops run at numpy speed. Medians over --repeat runs, microseconds.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import numpy as np

import npumem
import npumem.memory as mem
from npumem import aclnn


def median_us(function, repeat: int) -> float:
    function()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


def two_phase(planner, runner, stream):
    def call():
        size, executor = planner()
        workspace = mem.caching_allocator_alloc(size, stream=stream) if size else None
        runner(workspace, size, executor, stream)
        if workspace:
            mem.caching_allocator_delete(workspace)
        stream.synchronize()
    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    npumem.init()
    npumem.set_device(0)
    stream = npumem.create_stream()
    rng = np.random.default_rng(0)
    results = []
    for name, shape in (("add", (64,)), ("add", (2048, 2048)), ("matmul", (64, 64)),
                        ("matmul.T", (1024, 1024)), ("softmax", (1024, 1024))):
        x = rng.standard_normal(shape).astype(np.float32)
        a = npumem.from_numpy(x)
        out = npumem.empty(shape)
        host_out = np.empty_like(x)
        if name == "add":
            ours = two_phase(lambda: aclnn.add_get_workspace_size(a, a, 1, out), aclnn.add, stream)
            theirs = lambda: np.add(x, x, out=host_out)  # noqa: E731
        elif name.startswith("matmul"):
            left = a.t() if name.endswith(".T") else a
            ours = two_phase(lambda: aclnn.matmul_get_workspace_size(left, a, out), aclnn.matmul, stream)
            theirs = lambda: np.matmul(np.ascontiguousarray(x.T) if name.endswith(".T") else x,  # noqa: E731
                                       x, out=host_out)
        else:
            ours = two_phase(lambda: aclnn.softmax_get_workspace_size(a, 1, out), aclnn.softmax, stream)

            def theirs():
                np.subtract(x, x.max(1, keepdims=True), out=host_out)
                np.exp(host_out, out=host_out)
                np.divide(host_out, host_out.sum(1, keepdims=True), out=host_out)
        npumem_us, numpy_us = median_us(ours, args.repeat), median_us(theirs, args.repeat)
        results.append({"op": name, "shape": list(shape), "npumem_us": round(npumem_us, 1),
                        "numpy_us": round(numpy_us, 1), "ratio": round(npumem_us / numpy_us, 2)})
        del a, out
    npumem.destroy_stream(stream)
    npumem.reset_device(0)
    npumem.finalize()
    if args.json:
        print(json.dumps({"machine": platform.processor() or platform.machine(), "results": results}))
        return
    print(f"{'op':10} {'shape':>14} {'npumem µs':>11} {'numpy µs':>10} {'ratio':>7}")
    for r in results:
        print(f"{r['op']:10} {'x'.join(map(str, r['shape'])):>14} {r['npumem_us']:>11.1f} "
              f"{r['numpy_us']:>10.1f} {r['ratio']:>7.2f}")


if __name__ == "__main__":
    main()
