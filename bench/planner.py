"""Offline planner: height / LOAD per problem for each algorithm, against greedy by size.

    python bench/planner.py [FILE ...] [--time-limit 60] [--algorithms size,best,search] [--json]

Defaults to every problem in ../shared/data/dsa/ except the large iopddl ones. LOAD (the most
bytes live at once) is the lower bound; greedy by size is what TFLite and MindSpore ship. A
problem whose file name carries its capacity (MiniMalloc's `A.1048576.csv`) is solved by a
height at or under it: those rows say which algorithms did ("within capacity").
"""

from __future__ import annotations

import argparse
import json
import os

from defaults import planning_problems
from npumem.planning import plan
from npumem.trace.lifetimes import load_problem


def known_capacity(path: str) -> int | None:
    """The capacity a file name carries (`minimalloc_A.1048576.csv`), if it carries one."""
    parts = os.path.basename(path).split(".")
    return int(parts[-2]) if len(parts) >= 3 and parts[-2].isdigit() else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problems", nargs="*")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--algorithms", default="size,best,search")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    paths = args.problems or planning_problems()
    rows = []
    for path in paths:
        problem = load_problem(path)
        capacity = known_capacity(path)
        row = {"problem": problem.name, "buffers": len(problem), "load_bytes": problem.load(),
               "capacity_bytes": capacity}
        within = []
        for algorithm in args.algorithms.split(","):
            result = plan(problem, algorithm, args.time_limit)
            row[algorithm] = round(result.height_over_load, 4)
            row[f"{algorithm}_seconds"] = round(result.seconds, 1)
            if capacity is not None and result.height <= capacity:
                within.append(algorithm)
        row["within_capacity"] = within if capacity is not None else None
        rows.append(row)
        if not args.json:
            print(f"{row['problem']:<26} {row['buffers']:>6} " + " ".join(
                f"{a}={row[a]:.4f} ({row[a + '_seconds']:.1f}s)" for a in args.algorithms.split(","))
                + ("" if capacity is None else
                   f"  within capacity: {', '.join(within) or 'none'}"), flush=True)
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
