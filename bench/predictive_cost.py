"""What the predictive pool costs per allocate + free pair against the default pool, on traffic
it can and cannot plan.

    python bench/predictive_cost.py [--requests N] [--json]

Both pools run the same requests in the same process, in turns of 1,000 requests (the order
of the two alternates), each turn timed whole: the ratio is the sum of the predictive pool's
turns over the default pool's, so pauses, trims and planning count (planning runs in line).
Traffic:
- random: random sizes (512 B to 4 MiB) and random frees, no step ever repeats;
- random_sizes_few: the same with sizes drawn from 8, so that short runs of sizes repeat by
  chance;
- kept_every_step: a 60-request step repeated, one block of each step kept for good (a list of
  losses): live bytes grow every step, so no plan is made;
- step: a 60-request step repeated (the plan serves it: the hit path);
- served_then_random: that step for 30,000 requests, then random traffic (the ratio is of the
  random stretch alone: what a plan that stopped serving costs).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from npumem.alloc.caching_allocator import CachingAllocator
from npumem.alloc.settings import AllocatorSettings
from npumem.device.sim import SimBackend, SimConfig

TURN = 1000


def random_traffic(count: int, choices: int = 0, seed: int = 1):
    """(size, free: index into live blocks or -1) per request."""
    rng = np.random.default_rng(seed)
    if choices:
        palette = np.exp(rng.uniform(np.log(512), np.log(4 << 20), choices)).astype(int)
        sizes = rng.choice(palette, count).tolist()
    else:
        sizes = np.exp(rng.uniform(np.log(512), np.log(4 << 20), count)).astype(int).tolist()
    picks = rng.random(count).tolist()
    return [(size, int(pick * 997)) if pick < 0.5 else (size, -1) for size, pick in zip(sizes, picks)]


def step_traffic(count: int, keep: bool, seed: int = 2):
    """A step of 60 requests (lifetimes 1–8 requests), repeated; `keep`: its 30th block is kept
    for good each step. (size, lifetime; 0: kept) per request."""
    rng = np.random.default_rng(seed)
    step = [(int(size), int(life)) for size, life in
            zip(np.exp(rng.uniform(np.log(512), np.log(4 << 20), 60)), rng.integers(1, 9, 60))]
    if keep:
        step[30] = (step[30][0], 0)
    return [step[index % len(step)] for index in range(count)]


def run_random(pool, live: list, requests) -> None:
    for size, pick in requests:
        if len(live) > 48 or (live and pick >= 0):
            pool.deallocate(live.pop(max(pick, 0) % len(live)))
        live.append(pool.allocate(size))


def run_step(pool, state: dict, requests) -> None:
    due, number = state.setdefault("due", {}), state.get("number", 0)
    for size, life in requests:
        for pointer in due.pop(number, ()):
            pool.deallocate(pointer)
        pointer = pool.allocate(size)
        if life:
            due.setdefault(number + life, []).append(pointer)
        number += 1
    state["number"] = number


SERVED = 30_000          # served_then_random: requests of the served step before the switch


def run_mixed(pool, state: dict, requests) -> None:
    """The step's requests, then the random ones (the step's live blocks are freed first)."""
    for kind, request in requests:
        if kind == "step":
            run_step(pool, state, [request])
            continue
        if not state.get("switched"):
            for pointers in state.pop("due", {}).values():
                for pointer in pointers:
                    pool.deallocate(pointer)
            state["switched"], state["live"] = True, []
        run_random(pool, state["live"], [request])


def measure(kind: str, count: int) -> dict:
    backend = SimBackend(SimConfig(memory=64 << 30))
    pools = {"pool": CachingAllocator(backend, 0),
             "predictive": CachingAllocator(backend, 0, AllocatorSettings(predictive=True))}
    pools["predictive"].predictor.background = False
    if kind.startswith("random"):
        requests = random_traffic(count, 8 if kind == "random_sizes_few" else 0)
        states = {label: [] for label in pools}
        run = run_random
    elif kind == "served_then_random":
        requests = [("step", r) for r in step_traffic(SERVED, keep=False)] + \
            [("random", r) for r in random_traffic(count - SERVED)]
        states = {label: {} for label in pools}
        run = run_mixed
    else:
        requests = step_traffic(count, keep=kind == "kept_every_step")
        states = {label: {} for label in pools}
        run = run_step
    seconds = {label: 0.0 for label in pools}
    clock = time.perf_counter
    for turn, begin in enumerate(range(0, count, TURN)):
        chunk = requests[begin:begin + TURN]
        order = list(pools) if turn % 2 == 0 else list(reversed(pools))
        for label in order:
            start = clock()
            run(pools[label], states[label], chunk)
            if kind != "served_then_random" or begin >= SERVED:   # (the random stretch)
                seconds[label] += clock() - start
    predictor = pools["predictive"].predictor
    timed = count - SERVED if kind == "served_then_random" else count
    row = {"traffic": kind, "requests": count,
           "pool_us": seconds["pool"] / timed * 1e6,
           "predictive_us": seconds["predictive"] / timed * 1e6,
           "ratio": seconds["predictive"] / seconds["pool"],
           "hits": predictor.hits, "note": predictor.note}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300_000)
    parser.add_argument("--traffic", nargs="*",
                        default=["random", "random_sizes_few", "kept_every_step", "step",
                                 "served_then_random"])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = [measure(kind, args.requests) for kind in args.traffic]
    if args.json:
        print(json.dumps(rows))
        return
    for row in rows:
        print(f"{row['traffic']:<18} {row['requests']:>8} requests: pool {row['pool_us']:.2f} us, "
              f"predictive {row['predictive_us']:.2f} us per pair ({row['ratio']:.2f}x), "
              f"{row['hits']} hits; {row['note'][:90]}", flush=True)


if __name__ == "__main__":
    main()
