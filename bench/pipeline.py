"""Copy/compute pipelining: how much host-to-device copy time the Prefetcher hides.

    python bench/pipeline.py [--batch-mib 8] [--batches 60] [--depth 2] [--rounds 5]
                             [--op mul|matmul] [--json]
    NPUMEM_DEVICE=torch:cuda python bench/pipeline.py --op matmul --batch-mib 64 --batches 24

Batches of float32 go host -> pinned -> device on a copy stream while the compute stream runs
ops on the previous batch. The number of ops per batch is calibrated in the same run so
that compute time is about equal to (just above) copy time while both run (the hardest case to hide: no slack either way).
Against that, a serial loop (copy, compute, wait, next) in the same process. --json prints one
line with hidden_fraction (steady state, median of the rounds), copy and compute ms per batch,
and the wall-clock speedup over the serial loop.

`--op mul` (the default) runs `Mul` over an eighth of the batch per op: cheap ops, so on the
simulator and torch:cpu the compute is the host's. On a GPU such ops take microseconds and the
host's launch work is all there is to overlap; `--op matmul` makes each op a (rows x 4096) @
(4096 x 4096) float32 product of the batch with a weight, which keeps the GPU itself busy, as a
training step does.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np

import npumem
from npumem.ops import aclnn
from npumem.pipeline import Prefetcher


SLICES = 8           # each op works on 1/8 of a batch, so compute time can be matched finely


WIDTH = 4096         # --op matmul: the batch as rows of this many floats, times a square weight


def compute(x, out, ops: int, stream, weight=None) -> None:
    """`ops` ops: Mul over the next eighth of the batch each, or with `weight` the batch
    (rows x WIDTH) times the weight."""
    if weight is not None:
        rows = x.numel() // WIDTH
        a, o = x.reshape(rows, WIDTH), out.reshape(rows, WIDTH)
        for _ in range(ops):
            aclnn.run_with_pool_workspace(aclnn.matmul, aclnn.matmul_get_workspace_size(a, weight, o),
                                          stream)
        return
    step = x.numel() // SLICES
    for i in range(ops):
        part = slice((i % SLICES) * step, (i % SLICES + 1) * step)
        a, o = x[part], out[part]
        aclnn.run_with_pool_workspace(aclnn.mul, aclnn.mul_get_workspace_size(a, a, o), stream)


def pipelined(batches, ops: int, depth: int, stream, weight=None) -> tuple[float, object]:
    start = time.perf_counter()
    with Prefetcher(batches, depth=depth, compute_stream=stream) as prefetcher:
        for x in prefetcher:
            out = npumem.empty(x.shape, stream=stream)
            compute(x, out, ops, stream, weight)
    stats = prefetcher.stats()
    return time.perf_counter() - start, stats


def serial(batches, ops: int, stream, weight=None) -> float:
    start = time.perf_counter()
    for batch in batches:
        x = npumem.from_numpy(batch, stream)
        out = npumem.empty(x.shape, stream=stream)
        compute(x, out, ops, stream, weight)
        npumem.synchronize_stream(stream)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-mib", type=float, default=8)
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--op", choices=["mul", "matmul"], default="mul")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    npumem.init()
    npumem.set_device(0)
    stream = npumem.create_stream()
    elements = int(args.batch_mib * 2**20) // 4
    if args.op == "matmul":
        elements -= elements % WIDTH
        if not elements:
            parser.error(f"--op matmul needs batches of at least {WIDTH * 4} bytes")
    rng = np.random.default_rng(0)
    batches = [rng.random(elements, dtype=np.float32) for _ in range(args.batches)]
    weight = None
    if args.op == "matmul":
        weight = npumem.from_numpy(rng.random((WIDTH, WIDTH), dtype=np.float32) / WIDTH, stream)

    ops = 1              # calibrate while copies and compute run together, as measured,
    for _ in range(6):   # until the count is stable: then compute is at least the copy time
        stats = pipelined(batches, ops, args.depth, stream, weight)[1]
        wanted = max(1, math.ceil(ops * stats.copy_ms / stats.compute_ms))
        if wanted == ops:
            break
        ops = wanted

    rounds = []
    for _ in range(args.rounds):
        serial_s = serial(batches, ops, stream, weight)
        pipelined_s, stats = pipelined(batches, ops, args.depth, stream, weight)
        rounds.append((stats.steady_hidden_fraction, serial_s, pipelined_s, stats))
    rounds.sort(key=lambda r: r[0])
    hidden, serial_s, pipelined_s, stats = rounds[len(rounds) // 2]
    device = npumem.get_backend().name
    npumem.reset_device(0)
    npumem.finalize()

    result = {"device": device, "op": args.op,
              "batches": args.batches, "batch_mib": args.batch_mib, "depth": args.depth,
              "ops_per_batch": ops, "copy_ms_per_batch": stats.copy_ms / stats.batches,
              "compute_ms_per_batch": stats.compute_ms / stats.batches,
              "exposed_ms_per_batch": stats.exposed_ms / stats.batches,
              "stall_ms_per_batch": stats.stall_ms / stats.batches,
              "hidden_fraction": hidden, "hidden_fraction_all_batches": stats.hidden_fraction,
              "all_rounds": [r[0] for r in rounds],
              "serial_s": serial_s, "pipelined_s": pipelined_s, "speedup": serial_s / pipelined_s}
    if args.json:
        print(json.dumps(result))
        return
    print(f"{result['device']}: {args.batches} batches of {args.batch_mib:g} MiB, depth {args.depth}, "
          f"{ops} {args.op} op(s) per batch to match the copy time")
    print(f"per batch: copy {result['copy_ms_per_batch']:.2f} ms, compute "
          f"{result['compute_ms_per_batch']:.2f} ms, copy exposed {result['exposed_ms_per_batch']:.2f} ms, "
          f"compute stream stalled {result['stall_ms_per_batch']:.2f} ms")
    print(f"copy time hidden: {hidden:.1%} in steady state ({stats.hidden_fraction:.1%} with the "
          f"pipeline fill); rounds: {', '.join(f'{r[0]:.1%}' for r in rounds)}")
    print(f"wall clock: serial {serial_s:.3f} s, pipelined {pipelined_s:.3f} s "
          f"({result['speedup']:.2f}x)")


if __name__ == "__main__":
    main()
