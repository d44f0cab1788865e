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
from npumem import aclnn


def median_us(function, repeat: int) -> float:
    function()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


CASES = (("add", (64,)), ("add", (2048, 2048)), ("matmul", (64, 64)),
         ("matmul.T", (1024, 1024)), ("softmax", (1024, 1024)))


def bench_case(name: str, shape: tuple, stream, repeat: int) -> dict:
    """One op both ways; its tensors go back to the pool when this returns."""
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    a, out, host_out = npumem.from_numpy(x), npumem.empty(shape), np.empty_like(x)
    if name == "add":
        planned = lambda: aclnn.add_get_workspace_size(a, a, 1, out)  # noqa: E731
        runner = aclnn.add
        theirs = lambda: np.add(x, x, out=host_out)  # noqa: E731
    elif name.startswith("matmul"):
        transposed = name.endswith(".T")
        left = a.t() if transposed else a
        planned = lambda: aclnn.matmul_get_workspace_size(left, a, out)  # noqa: E731
        runner = aclnn.matmul
        theirs = lambda: np.matmul(np.ascontiguousarray(x.T) if transposed else x,  # noqa: E731
                                   x, out=host_out)
    else:
        planned = lambda: aclnn.softmax_get_workspace_size(a, 1, out)  # noqa: E731
        runner = aclnn.softmax

        def theirs():
            np.subtract(x, x.max(1, keepdims=True), out=host_out)
            np.exp(host_out, out=host_out)
            np.divide(host_out, host_out.sum(1, keepdims=True), out=host_out)

    def ours():
        aclnn.run_with_pool_workspace(runner, planned(), stream)
        stream.synchronize()

    npumem_us, numpy_us = median_us(ours, repeat), median_us(theirs, repeat)
    return {"op": name, "shape": list(shape), "npumem_us": round(npumem_us, 1),
            "numpy_us": round(numpy_us, 1), "ratio": round(npumem_us / numpy_us, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    npumem.init()
    npumem.set_device(0)
    stream = npumem.create_stream()
    results = [bench_case(name, shape, stream, args.repeat) for name, shape in CASES]
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
