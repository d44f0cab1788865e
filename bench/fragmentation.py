"""Peak reserved / peak live of npumem's pool against the PyTorch-policy emulation, per trace.

    python bench/fragmentation.py [TRACE ...] [--json] [--jitter N] [--planner-lag N]

Defaults to every trace in ../shared/data/traces/ (`bench/record_workloads.py` records more).
Each trace is replayed through `pool` (npumem, default settings), `pool` in segment mode, `torch`
(PyTorch's caching policy) and `device` (no caching); the ratio is peak reserved / peak live
bytes (1.0 is the lower bound). `pool (predictive)` is the pool with predictive:True; its rows
also give the hit rate after the plan took over, the steady ratio (peak reserved / peak live
while a plan cut at a step boundary serves) and its floor (the steady live peak in whole 2 MiB
pages, over that peak: no pool that maps pages reserves less), blank where no such plan served
before the trace ended. A replay plans in line; with --planner-lag N each plan is handed over N
requests after it was asked for, as the program's planner thread would.

With --jitter N the pool also replays each trace N more times with every distinct request size
padded by a random 0-256 bytes (the same pad for every request of that size). Placement is
chaotic: a few bytes decide which hole a block lands in, and with 2 MiB pages one different hole
moves the peak by a page. The spread (min / median / max) says how much of a ratio is luck.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import statistics
import time

from defaults import traces
from npumem.alloc.settings import AllocatorSettings
from npumem.trace import TraceEvent, read_trace
from npumem.whatif.replay import replay

CONFIGS = [("pool", None), ("pool (segments)", AllocatorSettings(expandable_segments=False)),
           ("pool (predictive)", AllocatorSettings(predictive=True)), ("torch", None), ("device", None)]


def jittered(events: list[TraceEvent], seed: int) -> list[TraceEvent]:
    """`events` with each distinct request size padded by the same random 0-256 bytes."""
    rng, pads = random.Random(seed), {}
    out = []
    for event in events:
        pad = pads.get(event.size)
        if pad is None:
            pad = pads[event.size] = 64 * rng.randint(0, 4)
        out.append(event._replace(size=event.size + pad))
    return out


def jitter_spread(events: list[TraceEvent], runs: int, peak_live: int) -> list[float]:
    """The pool's ratio on `runs` jittered copies of the trace, against the unpadded peak live."""
    return sorted(replay(jittered(events, seed), "pool").peak_reserved_bytes / peak_live
                  for seed in range(runs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--jitter", type=int, default=0, metavar="N",
                        help="also replay the pool on N size-jittered copies of each trace")
    parser.add_argument("--planner-lag", type=int, default=0, metavar="N",
                        help="hand each predictive plan over N requests after it was asked for")
    args = parser.parse_args()
    if args.jitter < 0 or args.planner_lag < 0:
        parser.error(f"--jitter and --planner-lag must be 0 or more, got {args.jitter} and "
                     f"{args.planner_lag}")
    paths = args.traces or traces()
    rows, spreads = [], {}
    for path in paths:
        events = list(read_trace(path))
        for label, settings in CONFIGS:
            start = time.perf_counter()
            result = replay(events, label.split()[0], settings, trace_name=pathlib.Path(path).name,
                            planner_lag=args.planner_lag)
            rows.append({"trace": result.trace, "allocator": label, "events": result.events,
                         "peak_live_mib": result.peak_allocated_bytes / 2**20,
                         "peak_reserved_mib": result.peak_reserved_bytes / 2**20,
                         "ratio": result.reserved_over_allocated,
                         "prediction_hit_rate": result.prediction_hit_rate,
                         "steady_ratio": result.steady_reserved_over_allocated,
                         "steady_floor": result.steady_page_floor,
                         "seconds": time.perf_counter() - start})
        if args.jitter:
            spreads[rows[-1]["trace"]] = jitter_spread(events, args.jitter, result.peak_allocated_bytes)
    if args.json:
        print(json.dumps({"rows": rows, "jitter": spreads} if args.jitter else rows))
        return
    print(f"{'trace':<24} {'allocator':<18} {'events':>7} {'live MiB':>9} {'reserved MiB':>12} "
          f"{'ratio':>6} {'s':>5} {'hits':>7} {'steady':>6} {'floor':>6}")
    for r in rows:
        hits = "" if r["prediction_hit_rate"] is None else f"{r['prediction_hit_rate']:.2%}"
        steady = "" if r["steady_ratio"] is None else f"{r['steady_ratio']:.3f}"
        floor = "" if r["steady_floor"] is None else f"{r['steady_floor']:.3f}"
        print(f"{r['trace']:<24} {r['allocator']:<18} {r['events']:>7} {r['peak_live_mib']:>9.1f} "
              f"{r['peak_reserved_mib']:>12.1f} {r['ratio']:>6.3f} {r['seconds']:>5.2f} {hits:>7} "
              f"{steady:>6} {floor:>6}")
    by_trace = {}
    for r in rows:
        by_trace.setdefault(r["trace"], {})[r["allocator"]] = r["ratio"]
    for trace, ratios in by_trace.items():
        print(f"{trace}: pool {ratios['pool']:.3f} vs torch {ratios['torch']:.3f} "
              f"({ratios['torch'] / ratios['pool']:.2f}x less reserved)")
    for trace, spread in spreads.items():
        print(f"{trace}: pool under jitter, {len(spread)} runs: min {spread[0]:.3f}, "
              f"median {statistics.median(spread):.3f}, max {spread[-1]:.3f}")


if __name__ == "__main__":
    main()
