"""What the predictive pool's outcomes are, with all its rules or one switched off.

    python bench/predictive_cases.py [--off CASE ...] [--traces] [--programs N] [--json]

Each trace (tests/data's recordings, and the shared ones where ../shared is there) is replayed
by the default pool and the predictive pool (`expandable_segments` as the pool's default),
both timed with process CPU time; each random program (a repeated step at random lengths,
with one-off temporaries and requests left out, marked or not, both pool kinds) is run by
both pools. `--off` switches one rule off by patching it out for the run (see CASES): the
outcome to compare is peak (against the default pool's), hit rate after the takeover, steady
reserved / live, and CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import random
import sys
import time

from npumem.alloc import predictive, step_arena, step_learner
from npumem.alloc.caching_allocator import CachingAllocator
from npumem.alloc.settings import AllocatorSettings
from npumem.device.sim import SimBackend, SimConfig
from npumem.trace import read_trace
from npumem.whatif.replay import replay

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "data"
MiB = 1 << 20


def traces() -> list[pathlib.Path]:
    found = sorted((ROOT / "tests/data/cuda_snapshots").glob("*.pickle.gz"))
    found += sorted((ROOT / "tests/data/cpu_recordings").glob("*.jsonl.gz"))
    found += sorted((SHARED / "traces").glob("*.jsonl.gz"))
    found += sorted((SHARED / "snapshots").glob("*.pickle"))
    return found


# name -> [(owner, attribute, replacement)]: the rule switched off
CASES: dict[str, list] = {}


def case(name: str, *patches) -> None:
    CASES[name] = list(patches)


P, L, A = predictive.Predictor, step_learner.StepLearner, step_arena.PoolRangeArena
case("refresh", (P, "_refresh", lambda self, boundary: boundary))
case("exact_step", (L, "_exact_step", lambda self, template: None))
case("short_window", (L, "_short_window", lambda self, made, template: None))
case("place_elsewhere", (A, "place_elsewhere", lambda self, slot: None))
case("lend", (A, "lend", lambda self, size, slot: None))
case("resize_to_strays", (P, "_resize_to_strays", lambda self: None))
case("counted", (P, "_counted", lambda self, template: None))
case("pause", (predictive, "QUIET", 1 << 40))
case("widen", (L, "_widen", lambda self, template, first, end: template))
case("folded", (L, "_folded", lambda self, template, following: template))
case("between_cuts", (P, "_may_take_over_here",
                      lambda self, template, slot: self.ready is not None
                      and self.arena is None and not self.planning
                      and self.ready.boundary == slot))
case("fall_back", (P, "_fall_back", lambda self, boundary, why: self._refused(why)))
case("wait_growing", (P, "_live_bytes_now_and_a_step_ago", lambda self, template: (0, 0)))
case("resync", (predictive, "RESYNC", 1 << 30))
case("varies", (P, "_varies", lambda self, boundary: False))
case("lookahead", (predictive, "LOOKAHEAD", 2))
case("stand_aside_for", (P, "_stand_aside_for", lambda self, size: None))
case("one_stream", (P, "_choose_stream", lambda self, stream, size: setattr(self, "stream", stream)
                    if self.stream is predictive._NOT_YET else None))


@contextlib.contextmanager
def switched_off(names):
    saved = []
    for name in names:
        for owner, attribute, replacement in CASES[name]:
            saved.append((owner, attribute, getattr(owner, attribute, None)))
            setattr(owner, attribute, replacement)
    try:
        yield
    finally:
        for owner, attribute, value in reversed(saved):
            setattr(owner, attribute, value)


def replay_both(path: pathlib.Path) -> dict:
    row = {"trace": path.name.split(".")[0]}
    for label, settings in (("pool", AllocatorSettings()),
                            ("predictive", AllocatorSettings(predictive=True))):
        began = time.process_time()
        result = replay(read_trace(path), "pool", settings)
        row[f"{label}_cpu"] = time.process_time() - began
        row[f"{label}_peak"] = result.peak_reserved_bytes
        if label == "predictive":
            row.update(hit=result.prediction_hit_rate, steady=result.steady_reserved_over_allocated,
                       floor=result.steady_page_floor,
                       planning=result.prediction_planning_seconds)
    return row


# --- random programs --------------------------------------------------------------------------

def program(seed: int) -> tuple[list, bool]:
    """A step of 20–40 requests at a random length per step (or one length), with up to three
    one-off temporaries and up to two requests left out (kept) per program; marked or not.
    Each entry: ("alloc", size, lifetime in requests, kept) or ("mark",)."""
    rng = random.Random(seed)
    body = [(rng.choice([rng.randint(1, 64 << 10), rng.randint(1, 4 * MiB)]),
             rng.randint(1, 12), rng.random() < 0.3) for _ in range(rng.randint(20, 40))]
    lengths = ([4] * 12 if rng.random() < 0.4 else
               [rng.choice([3, 4, 6]) for _ in range(12)])
    marked = rng.random() < 0.5
    extras = {(rng.randrange(12), rng.randrange(len(body))): rng.randint(1, 4 * MiB)
              for _ in range(rng.randint(0, 3))}
    kept = {(rng.randrange(12), rng.randrange(len(body))) for _ in range(rng.randint(0, 2))}
    events = []
    for step, length in enumerate(lengths):
        for index, (size, lifetime, grows) in enumerate(body):
            if (step, index) in extras:
                events.append(("alloc", extras[step, index], 1, False))
            events.append(("alloc", size * length // 4 if grows else size, lifetime,
                           (step, index) in kept))
        if marked:
            events.append(("mark",))
    return events, rng.random() < 0.5


def run_program(events, predictive_on: bool, expandable: bool) -> tuple[int, int, int]:
    """(peak reserved, hits, misses after the takeover)."""
    pool = CachingAllocator(SimBackend(SimConfig(memory=4 << 30)), 0,
                            AllocatorSettings(predictive=predictive_on,
                                              expandable_segments=expandable))
    if pool.predictor is not None:
        pool.predictor.background = False
    due: dict[int, list[int]] = {}
    number = 0
    for event in events:
        if event[0] == "mark":
            pool.mark_step()
            continue
        _, size, lifetime, kept = event
        for pointer in due.pop(number, []):
            pool.deallocate(pointer)
        pointer = pool.allocate(size)
        if not kept:
            due.setdefault(number + lifetime, []).append(pointer)
        number += 1
    for pointers in due.values():
        for pointer in pointers:
            pool.deallocate(pointer)
    peak = pool.memory_stats()["reserved_bytes.all.peak"]
    predictor = pool.predictor
    hits, misses = (predictor.hits, predictor.misses) if predictor is not None else (0, 0)
    return peak, hits, misses


def programs(count: int) -> dict:
    above = hits = served = planned = cpu = default_cpu = 0
    for seed in range(count):
        events, expandable = program(seed)
        began = time.process_time()
        default_peak, _, _ = run_program(events, False, expandable)
        middle = time.process_time()
        peak, hit, miss = run_program(events, True, expandable)
        cpu += time.process_time() - middle
        default_cpu += middle - began
        above += peak > default_peak
        hits, served, planned = hits + hit, served + hit + miss, planned + (hit + miss > 0)
    return {"programs": count, "above_default_peak": above, "planned": planned,
            "hit_rate": hits / served if served else None, "cpu_ratio": cpu / default_cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--off", nargs="*", default=[], choices=sorted(CASES))
    parser.add_argument("--traces", action="store_true", help="replay the traces")
    parser.add_argument("--only", nargs="*", default=None, help="trace names to replay")
    parser.add_argument("--programs", type=int, default=0, help="random programs to run")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = {"off": args.off, "traces": []}
    with switched_off(args.off):
        if args.traces:
            for path in traces():
                if args.only and path.name.split(".")[0] not in args.only:
                    continue
                row = replay_both(path)
                out["traces"].append(row)
                if not args.json:
                    fmt = lambda v: "-" if v is None else f"{v:.3f}"      # noqa: E731
                    print(f"{row['trace']:<28} peak {row['pool_peak'] >> 20:>5} "
                          f"{row['predictive_peak'] >> 20:>5} MiB  hit {fmt(row['hit'])} "
                          f"steady {fmt(row['steady'])} floor {fmt(row['floor'])}  cpu "
                          f"{row['predictive_cpu'] / row['pool_cpu']:.2f}x "
                          f"(planning {row['planning'] / row['pool_cpu']:.2f}x)", flush=True)
        if args.programs:
            out["programs"] = programs(args.programs)
            if not args.json:
                print(out["programs"])
    if args.json:
        json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
