"""Cache-hit allocate+deallocate pairs: npumem's pool against torch.empty + del, in one run.

    python bench/alloc_latency.py [--pairs 20000] [--json]

Mixed sizes from 512 B to 16 MiB, the pool warmed so every request is a cache hit. Reports the
median pair time of the pool (expandable and segment modes), the pool under the statistics
adaptor, the tracking adaptor with Python stacks (cost per event), and torch.empty(n,
dtype=torch.uint8) + del on CPU when torch is installed. Target: pool median <= 2x torch;
statistics adaptor <= +30%.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import numpy as np

from npumem.alloc.adaptors import StatisticsAdaptor, TrackingAdaptor
from npumem.alloc.caching_allocator import CachingAllocator
from npumem.alloc.settings import AllocatorSettings
from npumem.device import SimBackend, SimConfig
from npumem.units import GiB


def sizes(count: int) -> list[int]:
    rng = np.random.default_rng(0)
    return [int(s) for s in np.exp(rng.uniform(np.log(512), np.log(16 << 20), count))]


def pair_us(allocate, deallocate, requests) -> tuple[float, float]:
    """Median and mean time of one allocate+deallocate pair, in microseconds.

    The mean includes everything amortized over many calls (the pool folds its statistics log
    every 8192 events, for example); the median is the typical call.
    """
    for n in set(requests):                       # warm the cache: every timed request is a hit
        deallocate(allocate(n))
    clock = time.perf_counter_ns
    samples = []
    for n in requests:
        start = clock()
        deallocate(allocate(n))
        samples.append(clock() - start)
    return statistics.median(samples) / 1e3, statistics.fmean(samples) / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    requests = sizes(args.pairs)
    backend = SimBackend(SimConfig(memory=8 * GiB))
    results = {"machine": f"{platform.machine()} python {platform.python_version()}", "pairs": args.pairs}

    for label, settings in (("pool", AllocatorSettings()),
                            ("pool_segments", AllocatorSettings(expandable_segments=False))):
        pool = CachingAllocator(backend, 0, settings)
        results[f"{label}_us"], results[f"{label}_mean_us"] = pair_us(pool.allocate, pool.deallocate,
                                                                       requests)
        pool.close()
    pool = CachingAllocator(backend, 0)
    stats = StatisticsAdaptor(pool)
    results["pool_with_statistics_us"], results["pool_with_statistics_mean_us"] = pair_us(
        stats.allocate, stats.deallocate, requests)
    tracked = TrackingAdaptor(pool, stacks=True)
    results["pool_with_stacks_us"], results["pool_with_stacks_mean_us"] = pair_us(
        tracked.allocate, tracked.deallocate, requests)
    pool.close()
    results["statistics_overhead"] = results["pool_with_statistics_us"] / results["pool_us"] - 1
    results["stack_capture_us_per_event"] = results["pool_with_stacks_us"] - results["pool_us"]
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        results["torch_empty_del_us"], results["torch_empty_del_mean_us"] = pair_us(
            lambda n: torch.empty(n, dtype=torch.uint8), lambda t: None, requests)
        results["pool_over_torch"] = results["pool_us"] / results["torch_empty_del_us"]
        results["pool_over_torch_mean"] = results["pool_mean_us"] / results["torch_empty_del_mean_us"]

    if args.json:
        print(json.dumps(results))
        return
    print(f"{results['machine']}; {args.pairs} cache-hit pairs, sizes 512 B..16 MiB")
    print(f"  {'us per allocate+free':<26} {'median':>7} {'mean':>7}")
    for key in ("pool", "pool_segments", "pool_with_statistics", "pool_with_stacks", "torch_empty_del"):
        if f"{key}_us" in results:
            print(f"  {key:<26} {results[key + '_us']:7.2f} {results[key + '_mean_us']:7.2f}")
    print(f"  statistics adaptor overhead: {results['statistics_overhead']:+.0%}")
    print(f"  stack capture: {results['stack_capture_us_per_event']:.2f} us per allocation")
    if "pool_over_torch" in results:
        print(f"  pool / torch: {results['pool_over_torch']:.2f}x median (target <= 2x), "
              f"{results['pool_over_torch_mean']:.2f}x mean")


if __name__ == "__main__":
    main()
