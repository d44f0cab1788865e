"""What the profiler costs: an allocation-heavy loop with tracking off, on, and on with stacks.

    python bench/profile_overhead.py [--pairs 20000] [--rounds 7] [--depth 12] [--json]

Two loops over mixed sizes (512 B to 16 MiB, all cache hits) on the simulated NPU, called
`--depth` Python frames deep as a framework would: `tensors` creates and drops npumem tensors
(what user code does), `pool` calls caching_allocator_alloc/delete directly (the cheapest
allocation there is, so the worst case for the profiler's relative cost). Rounds alternate the
three modes; medians are reported. Targets: tracking without stacks at most 1.3x the loop with
tracking off; with stacks, under 5 us per event (each alloc and each free is one event).
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
from npumem import profile


def sizes(count: int) -> list[int]:
    rng = np.random.default_rng(0)
    return [int(s) for s in np.exp(rng.uniform(np.log(512), np.log(16 << 20), count))]


def pool_loop(requests: list[int], depth: int) -> int:
    """Alloc/free every request `depth` frames down; returns nanoseconds spent."""
    if depth > 1:
        return pool_loop(requests, depth - 1)
    alloc, free, clock = mem.caching_allocator_alloc, mem.caching_allocator_delete, time.perf_counter_ns
    start = clock()
    for n in requests:
        free(alloc(n))
    return clock() - start


def tensor_loop(requests: list[int], depth: int) -> int:
    """Create and drop a uint8 tensor of each size `depth` frames down."""
    if depth > 1:
        return tensor_loop(requests, depth - 1)
    empty, clock = npumem.empty, time.perf_counter_ns
    start = clock()
    for n in requests:
        tensor = empty((n,), "uint8")
        del tensor
    return clock() - start


LOOPS = {"tensors": tensor_loop, "pool": pool_loop}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--depth", type=int, default=12, help="Python frames above the loop")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    npumem.init()
    npumem.set_device(0)
    requests = sizes(args.pairs)
    modes = {"off": None, "on": dict(stacks=False), "stacks": dict(stacks=True)}
    result = {
        "machine": f"{platform.machine()} {platform.processor() or platform.system()}, "
                   f"Python {platform.python_version()}",
        "pairs": args.pairs, "rounds": args.rounds, "depth": args.depth,
    }
    for loop_name, loop in LOOPS.items():
        loop(requests, 1)                             # warm: every timed request is a cache hit
        times: dict[str, list[float]] = {name: [] for name in modes}
        events = 0
        for _ in range(args.rounds):
            for name, options in modes.items():
                if options is None:
                    spent = loop(requests, args.depth)
                else:
                    with profile.track(max_entries=4 * args.pairs, **options) as tracker:
                        spent = loop(requests, args.depth)
                    events = len(tracker.events())
                times[name].append(spent / args.pairs / 1e3)     # us per alloc+free pair
        pair = {name: statistics.median(values) for name, values in times.items()}
        per_pair = events / args.pairs
        result[loop_name] = {
            "pair_us_off": round(pair["off"], 3), "pair_us_tracking": round(pair["on"], 3),
            "pair_us_stacks": round(pair["stacks"], 3),
            "tracking_ratio": round(pair["on"] / pair["off"], 3),
            "stacks_ratio": round(pair["stacks"] / pair["off"], 3),
            "events_per_pair": per_pair,
            "us_per_event_tracking": round((pair["on"] - pair["off"]) / per_pair, 3),
            "us_per_event_stacks": round((pair["stacks"] - pair["off"]) / per_pair, 3),
        }
    npumem.reset_device(0)
    npumem.finalize()
    if args.json:
        print(json.dumps(result))
        return
    print(f"machine: {result['machine']}; {args.pairs} pairs x {args.rounds} rounds, "
          f"{args.depth} frames deep")
    for loop_name in LOOPS:
        r = result[loop_name]
        print(f"{loop_name:<8} tracking off      {r['pair_us_off']:8.3f} us per alloc+free pair")
        print(f"{loop_name:<8} tracking on       {r['pair_us_tracking']:8.3f} us  ratio "
              f"{r['tracking_ratio']:.3f} (target <= 1.3)  {r['us_per_event_tracking']:.3f} us/event")
        print(f"{loop_name:<8} tracking + stacks {r['pair_us_stacks']:8.3f} us  ratio "
              f"{r['stacks_ratio']:.3f}  {r['us_per_event_stacks']:.3f} us/event (target < 5)")


if __name__ == "__main__":
    main()
