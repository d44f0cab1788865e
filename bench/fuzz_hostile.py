"""Hostile files through npumem's reading paths, each in a child process with a memory and a
time limit: crashes, tracebacks, and the RSS and time every input took (issue 64).

    python bench/fuzz_hostile.py [--count 500] [--seed 0] [--targets hostile-report,...]
                                 [--memory-mib 2048] [--seconds 60] [--keep DIR]

The targets are tests/fuzzing.py's TARGETS (default: every hostile-* one, whose inputs
mutate_hostile makes: edge addresses and sizes, segments that contradict their blocks,
repeated and shuffled entries, spliced STACK_GLOBAL, memo and FRAME opcodes, strings that
do not decode). An input fails when it ends with a signal or a traceback, or passes the
budget (--budget-mib, --budget-seconds: 100 MiB of peak RSS and 5 s by default); failing
inputs are kept in --keep. Under ASan and UBSan, see docs/reliability.md for the command.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(os.path.dirname(HERE), "src"), os.path.dirname(HERE)]   # (this tree's)

from tests.fuzzing import TARGETS, mutate  # noqa: E402
from tests.hostile_runs import CRASH, run_reader  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=500, help="inputs per target")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--targets", default=",".join(t for t in TARGETS if t.startswith("hostile")))
    parser.add_argument("--memory-mib", type=int, default=2048,
                        help="RSS past which an input is killed (0: none)")
    parser.add_argument("--seconds", type=int, default=60, help="CPU-time limit per input")
    parser.add_argument("--budget-mib", type=float, default=100.0,
                        help="peak RSS (the child's, which includes what it shares with "
                             "this parent) that counts as a failure")
    parser.add_argument("--budget-seconds", type=float, default=5.0)
    parser.add_argument("--keep", default="fuzz-hostile-failures")
    parser.add_argument("--minutes", type=float, default=None,
                        help="stop each target after this long (the count is then a maximum)")
    args = parser.parse_args()

    import npumem.cli  # noqa: F401 - imported once, before the children fork
    for name in args.targets.split(","):
        make_seed, read, structure = TARGETS[name]
        seed = make_seed()
        rng = random.Random(f"{name}:{args.seed}")
        path = f"/tmp/npumem-fuzz-hostile-{os.getpid()}.bin"
        rss, secs, failures, done = [], [], 0, 0
        began = time.monotonic()
        for index in range(args.count):
            if args.minutes and time.monotonic() - began > 60 * args.minutes:
                break
            data = mutate(rng, seed, structure)
            with open(path, "wb") as out:
                out.write(data)
            ended = run_reader(name, read, path, args.memory_mib << 20, args.seconds)
            done += 1
            rss.append(ended.rss_mib)
            secs.append(ended.seconds)
            if (not ended.clean or ended.status == CRASH or ended.rss_mib > args.budget_mib
                    or ended.seconds > args.budget_seconds):
                failures += 1
                os.makedirs(args.keep, exist_ok=True)
                kept = os.path.join(args.keep, f"{name}-{args.seed}-{index}.bin")
                with open(kept, "wb") as out:
                    out.write(data)
                print(f"FAIL {kept} ({len(data)} bytes): {ended}", flush=True)
        if os.path.exists(path):
            os.unlink(path)
        rss.sort()
        secs.sort()
        pick = (lambda xs, q: xs[min(len(xs) - 1, int(q * len(xs)))]) if done else \
            (lambda xs, q: 0.0)
        print(f"{name}: {done} inputs in {time.monotonic() - began:.0f} s, {failures} failed; "
              f"peak RSS p50 {pick(rss, .5):.0f} MiB, max {pick(rss, 1):.0f} MiB; "
              f"time p50 {pick(secs, .5):.2f} s, p99 {pick(secs, .99):.2f} s, max "
              f"{pick(secs, 1):.2f} s", flush=True)


if __name__ == "__main__":
    main()
