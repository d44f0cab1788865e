"""What the profiler costs: an allocation-heavy loop with tracking off, on, and on with stacks.

    python bench/profile_overhead.py [--pairs 20000] [--rounds 7] [--depth 12] [--json]

The loop allocates and frees tensors' worth of mixed sizes (512 B to 16 MiB, all cache hits)
through `npumem.memory` on the simulated NPU, called `--depth` Python frames deep as a framework
would. Rounds alternate the three modes; medians are reported. Targets: tracking without stacks
at most 1.3x the loop with tracking off; with stacks, under 5 us per event (alloc or free).
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


def loop(requests: list[int], depth: int) -> int:
    """Alloc/free every request `depth` frames down; returns nanoseconds spent."""
    if depth > 1:
        return loop(requests, depth - 1)
    alloc, free, clock = mem.caching_allocator_alloc, mem.caching_allocator_delete, time.perf_counter_ns
    start = clock()
    for n in requests:
        free(alloc(n))
    return clock() - start


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
    loop(requests, 1)                                 # warm: every timed request is a cache hit
    modes = {"off": None, "on": dict(stacks=False), "stacks": dict(stacks=True)}
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
    npumem.reset_device(0)
    npumem.finalize()

    pair = {name: statistics.median(values) for name, values in times.items()}
    per_pair_events = events / args.pairs
    result = {
        "machine": f"{platform.machine()} {platform.processor() or platform.system()}, "
                   f"Python {platform.python_version()}",
        "pairs": args.pairs, "rounds": args.rounds, "depth": args.depth,
        "pair_us_off": round(pair["off"], 3), "pair_us_tracking": round(pair["on"], 3),
        "pair_us_stacks": round(pair["stacks"], 3),
        "tracking_ratio": round(pair["on"] / pair["off"], 3),
        "stacks_ratio": round(pair["stacks"] / pair["off"], 3),
        "events_per_pair": per_pair_events,
        "us_per_event_tracking": round((pair["on"] - pair["off"]) / per_pair_events, 3),
        "us_per_event_stacks": round((pair["stacks"] - pair["off"]) / per_pair_events, 3),
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"machine: {result['machine']}; {args.pairs} pairs x {args.rounds} rounds, "
          f"{args.depth} frames deep")
    print(f"tracking off        {pair['off']:8.3f} us per alloc+free pair")
    print(f"tracking on         {pair['on']:8.3f} us  ratio {result['tracking_ratio']:.3f}  "
          f"(target <= 1.3)  {result['us_per_event_tracking']:.3f} us per event")
    print(f"tracking + stacks   {pair['stacks']:8.3f} us  ratio {result['stacks_ratio']:.3f}  "
          f"{result['us_per_event_stacks']:.3f} us per event (target < 5)")


if __name__ == "__main__":
    main()
