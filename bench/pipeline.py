"""Copy/compute pipelining: how much host-to-device copy time the Prefetcher hides.

    python bench/pipeline.py [--batch-mib 8] [--batches 60] [--depth 2] [--rounds 5] [--json]

Batches of float32 go host -> pinned -> device on a copy stream while the compute stream runs
`Mul` ops on the previous batch. The number of ops per batch is calibrated in the same run so
that compute time is about equal to (just above) copy time while both run (the hardest case to hide: no slack either way).
Against that, a serial loop (copy, compute, wait, next) in the same process. --json prints one
line with hidden_fraction (steady state, median of the rounds), copy and compute ms per batch,
and the wall-clock speedup over the serial loop.
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


def compute(x, out, ops: int, stream) -> None:
    """`ops` Mul ops, each over the next eighth of the batch."""
    step = x.numel // SLICES
    for i in range(ops):
        part = slice((i % SLICES) * step, (i % SLICES + 1) * step)
        a, o = x[part], out[part]
        aclnn.run_with_pool_workspace(aclnn.mul, aclnn.mul_get_workspace_size(a, a, o), stream)


def pipelined(batches, ops: int, depth: int, stream) -> tuple[float, object]:
    start = time.perf_counter()
    with Prefetcher(batches, depth=depth, compute_stream=stream) as prefetcher:
        for x in prefetcher:
            out = npumem.empty(x.shape, stream=stream)
            compute(x, out, ops, stream)
    stats = prefetcher.stats()
    return time.perf_counter() - start, stats


def serial(batches, ops: int, stream) -> float:
    start = time.perf_counter()
    for batch in batches:
        x = npumem.from_numpy(batch, stream)
        out = npumem.empty(x.shape, stream=stream)
        compute(x, out, ops, stream)
        npumem.synchronize_stream(stream)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-mib", type=float, default=8)
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    npumem.init()
    npumem.set_device(0)
    stream = npumem.create_stream()
    elements = int(args.batch_mib * 2**20) // 4
    rng = np.random.default_rng(0)
    batches = [rng.random(elements, dtype=np.float32) for _ in range(args.batches)]

    ops = 1              # calibrate while copies and compute run together, as measured
    for _ in range(4):
        stats = pipelined(batches, ops, args.depth, stream)[1]
        ops = max(1, math.ceil(ops * stats.copy_ms / stats.compute_ms))

    rounds = []
    for _ in range(args.rounds):
        serial_s = serial(batches, ops, stream)
        pipelined_s, stats = pipelined(batches, ops, args.depth, stream)
        rounds.append((stats.steady_hidden_fraction, serial_s, pipelined_s, stats))
    rounds.sort(key=lambda r: r[0])
    hidden, serial_s, pipelined_s, stats = rounds[len(rounds) // 2]
    npumem.reset_device(0)
    npumem.finalize()

    result = {"batches": args.batches, "batch_mib": args.batch_mib, "depth": args.depth,
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
    print(f"{args.batches} batches of {args.batch_mib:g} MiB, depth {args.depth}, "
          f"{ops} Mul op(s) per batch to match the copy time")
    print(f"per batch: copy {result['copy_ms_per_batch']:.2f} ms, compute "
          f"{result['compute_ms_per_batch']:.2f} ms, copy exposed {result['exposed_ms_per_batch']:.2f} ms, "
          f"compute stream stalled {result['stall_ms_per_batch']:.2f} ms")
    print(f"copy time hidden: {hidden:.1%} in steady state ({stats.hidden_fraction:.1%} with the "
          f"pipeline fill); rounds: {', '.join(f'{r[0]:.1%}' for r in rounds)}")
    print(f"wall clock: serial {serial_s:.3f} s, pipelined {pipelined_s:.3f} s "
          f"({result['speedup']:.2f}x)")


if __name__ == "__main__":
    main()
