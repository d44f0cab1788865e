"""Paged KV cache against the contiguous doubling cache on one decoding workload.

    python bench/kvcache.py [--sequences 64] [--block-size 16] [--seed 0] [--json]

64 sequences with varied prompt and output lengths are prefilled, then decoded token by token
(every unfinished sequence appends one token per step) until each reaches its own length. Waste =
(reserved - used) / reserved of each cache, averaged over decoding steps and at the end;
throughput = decoding appends per second. Both caches run in the same process on the simulated
NPU; --json prints one line with paged_waste, contiguous_waste and appends_per_s (paged).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import npumem
from npumem import memory as mem
from npumem.kvcache import ContiguousKVCache, PagedKVCache

LAYERS, HEADS, HEAD_DIM = 2, 8, 64          # 2 KiB of keys (and of values) per token in fp16


def workload(sequences: int, seed: int) -> list[tuple[int, int]]:
    """(prompt, output) token counts per sequence: prompts 16-512, outputs 32-1024."""
    rng = np.random.default_rng(seed)
    return [(int(p), int(o)) for p, o in zip(rng.integers(16, 513, sequences),
                                             rng.integers(32, 1025, sequences))]


def run(cache, lengths, token) -> dict:
    for seq, (prompt, _) in enumerate(lengths):
        cache.extend(seq, np.broadcast_to(token, (prompt, *token.shape)),
                     np.broadcast_to(token, (prompt, *token.shape)))
    wastes, appends, elapsed = [], 0, 0.0
    for step in range(max(output for _, output in lengths)):
        active = [seq for seq, (_, output) in enumerate(lengths) if step < output]
        start = time.perf_counter()
        for seq in active:
            cache.append(seq, token, token)
        elapsed += time.perf_counter() - start
        appends += len(active)
        wastes.append(cache.waste)
    result = {"mean_waste": float(np.mean(wastes)), "final_waste": cache.waste,
              "reserved_mib": cache.reserved_bytes / 2**20, "used_mib": cache.used_bytes / 2**20,
              "pool_reserved_mib": mem.memory_reserved() / 2**20,
              "appends_per_s": appends / elapsed}
    cache.close()
    mem.empty_cache()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    npumem.init()
    npumem.set_device(0)
    lengths = workload(args.sequences, args.seed)
    token = np.random.default_rng(args.seed).standard_normal((LAYERS, HEADS, HEAD_DIM)).astype(np.float16)
    paged = run(PagedKVCache(HEADS, HEAD_DIM, num_layers=LAYERS, block_size=args.block_size), lengths, token)
    contiguous = run(ContiguousKVCache(HEADS, HEAD_DIM, num_layers=LAYERS), lengths, token)
    npumem.reset_device(0)
    npumem.finalize()
    summary = {"sequences": args.sequences, "block_size": args.block_size,
               "tokens": sum(p + o for p, o in lengths),
               "paged_waste": paged["mean_waste"], "contiguous_waste": contiguous["mean_waste"],
               "appends_per_s": paged["appends_per_s"],
               "contiguous_appends_per_s": contiguous["appends_per_s"],
               "paged": paged, "contiguous": contiguous}
    if args.json:
        print(json.dumps(summary))
        return
    print(f"{args.sequences} sequences, {summary['tokens']:,} tokens, block size {args.block_size}, "
          f"{LAYERS}x{HEADS}x{HEAD_DIM} fp16 keys and values per token")
    print(f"{'cache':<12} {'mean waste':>10} {'final waste':>11} {'reserved MiB':>12} "
          f"{'used MiB':>9} {'pool MiB':>9} {'appends/s':>10}")
    for name, r in (("paged", paged), ("contiguous", contiguous)):
        print(f"{name:<12} {r['mean_waste']:>10.2%} {r['final_waste']:>11.2%} "
              f"{r['reserved_mib']:>12.1f} {r['used_mib']:>9.1f} {r['pool_reserved_mib']:>9.1f} "
              f"{r['appends_per_s']:>10,.0f}")
    print(f"paged wastes {contiguous['mean_waste'] / paged['mean_waste']:.1f}x less than contiguous "
          f"doubling; appends {paged['appends_per_s'] / contiguous['appends_per_s']:.2f}x its rate")


if __name__ == "__main__":
    main()
