"""How often `npumem tune`'s verdicts on a run that died agree with what the whole run does.

Each of the project's GPU recordings (tests/data/cuda_snapshots) is capped below its peak, so
that it runs out of memory (tests/capped_recordings.py: the snapshot an OOM observer would dump,
through the model that MATCHes these recordings). tune reads only that snapshot: the run up to the
failed request. The truth is the whole recorded run replayed under each candidate setting on the
same memory. Two kinds of cap: the device full ("device": the OOM entry's device_free says the
limit exactly) and set_per_process_memory_fraction ("fraction": the driver still had memory, so
tune infers the limit as the most the run held, unless --memory gives it).

    python bench/oom_agreement.py [--steps 3]

Prints, per recording and cap, verdicts that agree out of all, and whether the recommendation
finishes the whole run (where the run died before it repeated a step, tune names a setting
only to try: whether that one finishes too); then the totals.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.join(ROOT, "src"))

from capped_recordings import capped, truth  # noqa: E402

from npumem.trace.snapshot import load_recording, recording_from_data  # noqa: E402
from npumem.whatif.torch_replay import replay_recording  # noqa: E402
from npumem.whatif.torch_tune import tune_recording  # noqa: E402

LEVELS = (0.25, 0.5, 0.75, 0.9)  # caps between the peak live and the peak reserved


def caps(path: str) -> list[int]:
    full = replay_recording(load_recording(path))
    live, reserved = full.peak_allocated_bytes, full.peak_reserved_bytes
    return sorted({int(live + (reserved - live) * level) // (1 << 20) << 20 for level in LEVELS})


def judge(path: str, capacity: int, cap: str, known: bool, steps: int):
    snapshot = capped(path, capacity, cap)
    if snapshot is None:
        return None
    recording = recording_from_data(snapshot, path)
    tuning = tune_recording(recording, capacity if known else None, steps=steps)
    agree = sum(c.finishes == truth(path, capacity, c.config.describe(), cap)
                for c in tuning.candidates)
    best = tuning.best
    held = None if best is None else truth(path, capacity, best.config.describe(), cap)
    any_fits = any(truth(path, capacity, c.config.describe(), cap) for c in tuning.candidates)
    tried = tuning.worth_trying
    trial = None if tried is None else truth(path, capacity, tried.config.describe(), cap)
    return agree, len(tuning.candidates), held, any_fits, tuning.extension is not None, trial


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    totals = {}
    started = time.perf_counter()
    print(f"{'recording':<24} {'cap':>10} {'kind':<18} {'agree':>7}  extended  recommendation")
    for path in sorted(glob.glob(os.path.join(ROOT, "tests/data/cuda_snapshots/*.pickle.gz"))):
        name = os.path.basename(path).removesuffix(".pickle.gz")
        for capacity in caps(path):
            for cap, known in (("device", False), ("fraction", False), ("fraction", True)):
                result = judge(path, capacity, cap, known, args.steps)
                if result is None:
                    continue
                agree, total, held, any_fits, extended, trial = result
                kind = cap + (" + --memory" if known else "")
                advice = ("finishes" if held else "FAILS" if held is False else
                          "none; one fits" if any_fits else "none, and none fits")
                if trial is not None:
                    advice += f"; 'try' {'finishes' if trial else 'fails'}"
                print(f"{name:<24} {capacity / (1 << 20):>7.0f} MiB {kind:<18} "
                      f"{agree:>3}/{total:<3}  {'yes' if extended else 'no':<8}  {advice}")
                row = totals.setdefault(kind, [0, 0, 0, 0, 0, 0, 0])
                row[0] += agree
                row[1] += total
                row[2] += held is True or (held is None and not any_fits and trial is None)
                row[3] += 1
                row[4] += held is False
                row[5] += trial is not None
                row[6] += trial is True
    print()
    for kind, (agree, total, right, runs, failed, tries, tried) in totals.items():
        print(f"{kind:<18} verdicts agree {agree}/{total} ({agree / total:.1%}); a recommendation "
              f"(or 'none fits') right in {right}/{runs - tries} runs, wrong in {failed}; "
              f"died before repeating: {tries} runs, the setting to try finished in {tried}")
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
