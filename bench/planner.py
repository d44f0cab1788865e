"""Offline planner: height / LOAD per problem for each algorithm, against greedy by size.

    python bench/planner.py [FILE ...] [--time-limit 60] [--algorithms size,best,search] [--json]

Defaults to every problem in ../shared/data/dsa/ except the large iopddl ones. LOAD (the most
bytes live at once) is the lower bound; greedy by size is what TFLite and MindSpore ship.
"""

from __future__ import annotations

import argparse
import json

from defaults import planning_problems
from npumem.planning import plan
from npumem.trace.lifetimes import load_problem



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
        row = {"problem": problem.name, "buffers": len(problem), "load_bytes": problem.load()}
        for algorithm in args.algorithms.split(","):
            result = plan(problem, algorithm, args.time_limit)
            row[algorithm] = round(result.height_over_load, 4)
            row[f"{algorithm}_seconds"] = round(result.seconds, 1)
        rows.append(row)
        if not args.json:
            print(f"{row['problem']:<26} {row['buffers']:>6} " + " ".join(
                f"{a}={row[a]:.4f} ({row[a + '_seconds']:.1f}s)" for a in args.algorithms.split(",")),
                flush=True)
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
