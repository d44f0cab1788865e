"""Sparse MatMul against dense MatMul of the same shape, in the same run (seed 004 §3.2).

    python bench/sparse.py [--json] [--size 2048] [--repeat 3]

For densities 0.05, 0.1, 0.2 and 0.3 of a size x size left operand, two patterns:
`tiles` (non-zeros in 32x32 tiles: pruned weights, attention masks, ragged batches) and
`scattered` (each element independently). Each row times the whole two-phase flow of
aclnn.sparse_matmul (phase 1 reads and analyses the operand, phase 2 compresses it into the
workspace and multiplies) against aclnn.matmul on the same tensors, best of --repeat runs, and
checks the results agree to float32 rounding. The seed reports 4.43x, 3.14x, 2.05x and 1.61x.
Prints a table, or with --json one JSON list of rows {"density", "pattern", "strategy",
"speedup", "sparse_ms", "dense_ms"}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

import npumem
from npumem import aclnn

DENSITIES = (0.05, 0.1, 0.2, 0.3)
TILE = 32


def operand(size: int, density: float, pattern: str, rng) -> np.ndarray:
    if pattern == "tiles":
        tiles = -(-size // TILE)
        mask = np.repeat(np.repeat(rng.random((tiles, tiles)) < density, TILE, 0), TILE, 1)
        mask = mask[:size, :size]
    else:
        mask = rng.random((size, size)) < density
    return np.where(mask, rng.standard_normal((size, size)), 0).astype(np.float32)


def best_ms(function, repeat: int) -> float:
    function()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def measure(a: np.ndarray, b: np.ndarray, stream, repeat: int) -> dict:
    left, right = npumem.from_numpy(a), npumem.from_numpy(b)
    out = npumem.empty((a.shape[0], b.shape[1]))

    def sparse():
        planned = aclnn.sparse_matmul_get_workspace_size(left, right, out)
        chosen = planned[1].call.attrs["sparsity"]      # the executor forgets it once it ran
        aclnn.run_with_pool_workspace(aclnn.sparse_matmul, planned, stream)
        stream.synchronize()
        return chosen

    def dense():
        aclnn.run_with_pool_workspace(aclnn.matmul, aclnn.matmul_get_workspace_size(
            left, right, out), stream)
        stream.synchronize()

    chosen = sparse()
    ours = out.numpy()
    dense()
    np.testing.assert_allclose(ours, out.numpy(), rtol=1e-4, atol=1e-3)
    sparse_ms, dense_ms = best_ms(sparse, repeat), best_ms(dense, repeat)
    return {"strategy": chosen.strategy, "speedup": round(dense_ms / sparse_ms, 2),
            "sparse_ms": round(sparse_ms, 1), "dense_ms": round(dense_ms, 1),
            "tile_density": round(chosen.tile_density, 3)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON list of rows")
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.size < 1 or args.repeat < 1:
        parser.error("--size and --repeat must be at least 1")
    rng = np.random.default_rng(args.seed)
    b = rng.standard_normal((args.size, args.size)).astype(np.float32)
    npumem.init(backend="sim")
    npumem.set_device(0)
    stream = npumem.create_stream()
    rows = []
    for pattern in ("tiles", "scattered"):
        for density in DENSITIES:
            row = {"density": density, "pattern": pattern,
                   **measure(operand(args.size, density, pattern, rng), b, stream, args.repeat)}
            rows.append(row)
            print(f"{pattern:9} {density:4.2f}: {row['strategy']:6} {row['speedup']:5.2f}x",
                  file=sys.stderr, flush=True)
    npumem.destroy_stream(stream)
    npumem.finalize()
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"\n{args.size}x{args.size} @ {args.size}x{args.size}, float32; sparse flow against "
          "dense MatMul, best of", args.repeat)
    print(f"{'pattern':10} {'density':>7} {'strategy':>9} {'sparse ms':>10} {'dense ms':>9} "
          f"{'speedup':>8}")
    for r in rows:
        print(f"{r['pattern']:10} {r['density']:>7.2f} {r['strategy']:>9} {r['sparse_ms']:>10.1f} "
              f"{r['dense_ms']:>9.1f} {r['speedup']:>7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
