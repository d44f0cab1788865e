"""Two-phase operators against the same computation done directly by their peer, in one run.

    python bench/ops.py [--device sim|torch:cpu|torch:cuda] [--repeat 30] [--json]

For each case, npumem runs phase 1, allocates the workspace from the pool, runs phase 2 on a
stream and synchronizes. The peer is numpy on host arrays for the simulator, and torch's own ops
on the same device for a torch backend. The ratio npumem / peer shows the cost of the API
(validation, executor, workspace, stream hop) on small ops and that large ops run at the peer's
speed. Medians over --repeat runs, microseconds.

The launch cost of a small op is measured apart, in loops of a thousand: a 64-element Add
through that whole flow (`add64_us`) against `torch.add` of 64 elements on the CPU
(`torch_add64_us`, null without torch), best of five loops each; and `c = a + b` of 64 elements
on the current stream, a new `c` each call (`plus64_us`), against `torch.add(a, b)`
(`torch_plus64_us`), whole loops on both sides.
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


def numpy_peer(name: str, x: np.ndarray):
    out = np.empty_like(x)
    if name == "add":
        return lambda: np.add(x, x, out=out)
    if name.startswith("matmul"):
        left = x.T if name.endswith(".T") else x
        return lambda: np.matmul(np.ascontiguousarray(left), x, out=out)

    def softmax():
        np.subtract(x, x.max(1, keepdims=True), out=out)
        np.exp(out, out=out)
        np.divide(out, out.sum(1, keepdims=True), out=out)
    return softmax


def torch_peer(name: str, x: np.ndarray, device: str):
    import torch

    t = torch.from_numpy(x).to(device)
    out = torch.empty_like(t)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if name == "add":
        work = lambda: torch.add(t, t, out=out)  # noqa: E731
    elif name.startswith("matmul"):
        left = t.t() if name.endswith(".T") else t
        work = lambda: torch.matmul(left, t, out=out)  # noqa: E731
    else:
        work = lambda: torch.softmax(t, 1, out=out)  # noqa: E731
    return lambda: (work(), sync())


def bench_case(name: str, shape: tuple, stream, repeat: int, device: str) -> dict:
    """One op both ways; its tensors go back to the pool when this returns."""
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    a, out = npumem.from_numpy(x), npumem.empty(shape)
    if name == "add":
        planned = lambda: aclnn.add_get_workspace_size(a, a, 1, out)  # noqa: E731
        runner = aclnn.add
    elif name.startswith("matmul"):
        left = a.t() if name.endswith(".T") else a
        planned = lambda: aclnn.matmul_get_workspace_size(left, a, out)  # noqa: E731
        runner = aclnn.matmul
    else:
        planned = lambda: aclnn.softmax_get_workspace_size(a, 1, out)  # noqa: E731
        runner = aclnn.softmax
    theirs = numpy_peer(name, x) if device == "sim" else torch_peer(name, x, device.split(":")[1])

    def ours():
        aclnn.run_with_pool_workspace(runner, planned(), stream)
        stream.synchronize()

    npumem_us, peer_us = median_us(ours, repeat), median_us(theirs, repeat)
    return {"op": name, "shape": list(shape), "npumem_us": round(npumem_us, 1),
            "peer_us": round(peer_us, 1), "ratio": round(npumem_us / peer_us, 2)}


def loop_us(function, calls: int = 1000, rounds: int = 5) -> float:
    """Microseconds per call: the best of `rounds` loops of `calls` calls (timer cost spread)."""
    for _ in range(100):
        function()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            function()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def launch_cost(stream) -> dict:
    """The whole two-phase flow of a 64-element Add against torch.add of 64 elements (CPU)."""
    x = npumem.from_numpy(np.arange(64, dtype=np.float32))
    out = npumem.empty((64,))

    def flow():
        aclnn.run_with_pool_workspace(aclnn.add, aclnn.add_get_workspace_size(x, x, 1, out),
                                      stream)
        stream.synchronize()
    ours = loop_us(flow)
    y = npumem.from_numpy(np.ones(64, dtype=np.float32))

    def operator():
        c = x + y                 # noqa: F841 - a new result each call, dropped as torch's is
    plus = loop_us(operator)
    try:
        import torch
    except ImportError:
        return {"add64_us": round(ours, 2), "torch_add64_us": None, "add64_ratio": None,
                "plus64_us": round(plus, 2), "torch_plus64_us": None, "plus64_ratio": None}
    a, b = torch.arange(64, dtype=torch.float32), torch.empty(64)
    theirs = loop_us(lambda: torch.add(a, a, out=b))
    ones = torch.ones(64)
    theirs_plus = loop_us(lambda: torch.add(a, ones))
    return {"add64_us": round(ours, 2), "torch_add64_us": round(theirs, 2),
            "add64_ratio": round(ours / theirs, 1), "plus64_us": round(plus, 2),
            "torch_plus64_us": round(theirs_plus, 2), "plus64_ratio": round(plus / theirs_plus, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="sim", help="sim, torch:cpu or torch:cuda")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    npumem.init(backend=args.device)
    npumem.set_device(0)
    stream = npumem.create_stream()
    results = [bench_case(name, shape, stream, args.repeat, args.device) for name, shape in CASES]
    launch = launch_cost(stream)
    npumem.destroy_stream(stream)
    npumem.reset_device(0)
    npumem.finalize()
    if args.json:
        print(json.dumps({"machine": platform.processor() or platform.machine(),
                          "device": args.device, **launch, "results": results}))
        return
    peer = "numpy" if args.device == "sim" else "torch"
    print(f"{'op':10} {'shape':>14} {'npumem µs':>11} {peer + ' µs':>10} {'ratio':>7}")
    for r in results:
        print(f"{r['op']:10} {'x'.join(map(str, r['shape'])):>14} {r['npumem_us']:>11.1f} "
              f"{r['peer_us']:>10.1f} {r['ratio']:>7.2f}")
    torch_us = launch["torch_add64_us"]
    versus = f" against torch.add (CPU) {torch_us:.2f} us: {launch['add64_ratio']}x" \
        if torch_us else " (torch is not installed: no torch.add to compare)"
    print(f"launch cost: a 64-element Add, phase 1 to synchronize, {launch['add64_us']:.2f} us"
          f"{versus} (target <= 20x)")
    torch_us = launch["torch_plus64_us"]
    versus = f" against torch.add(a, b) (CPU) {torch_us:.2f} us: {launch['plus64_ratio']}x" \
        if torch_us else " (torch is not installed: no torch.add to compare)"
    print(f"c = a + b, 64 elements, a new c each call: {launch['plus64_us']:.2f} us{versus} "
          "(target <= 10x, moonshot 5x)")


if __name__ == "__main__":
    main()
