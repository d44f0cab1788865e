"""The model of PyTorch's allocator, native against Python, in one process: each recording is
loaded once, then replayed through both (`replay_recording(..., native=False)` is the Python
model, the oracle of the native one), with and without --check.

    python bench/torch_replay_speed.py [SNAPSHOT ...] [--repeat 3]

Without paths: every CUDA recording in tests/data. `bench/snapshot_scale.py --keep DIR` makes
snapshots of 1M and 10M entries to pass here. Prints the replay's time after the load (start
state included), entries per second, and the Python model's time over the native one's.
"""

from __future__ import annotations

import argparse
import glob
import os
import time

from npumem.whatif.torch_replay import load_for_model, replay_recording

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def best(repeat: int, work) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = work()
        times.append(time.perf_counter() - start)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each; the best counts")
    args = parser.parse_args()
    paths = args.paths or sorted(glob.glob(os.path.join(ROOT, "tests", "data", "cuda_snapshots*",
                                                        "*.pickle*")))
    total = {"native": 0.0, "python": 0.0}
    entries_all = 0
    print(f"{'recording':40s} {'entries':>10s} {'load s':>7s} {'native s':>9s} {'entries/s':>11s} "
          f"{'python s':>9s} {'ratio':>6s} {'check ratio':>11s}")
    for path in paths:
        start = time.perf_counter()
        recording = load_for_model(path)
        load = time.perf_counter() - start
        entries = len(recording.entries)
        try:                          # a recording private pools served is Python's alone
            native, result = best(args.repeat, lambda: replay_recording(recording, native=True))
        except ValueError as exc:
            print(f"{os.path.basename(path)[:40]:40s} {entries:10,d} {load:7.2f}  ({exc})")
            continue
        python, oracle = best(args.repeat, lambda: replay_recording(recording, native=False))
        checked, _ = best(args.repeat, lambda: replay_recording(recording, check=True,
                                                                native=True))
        python_checked, _ = best(args.repeat, lambda: replay_recording(recording, check=True,
                                                                      native=False))
        same = result.peak_reserved_bytes == oracle.peak_reserved_bytes
        total["native"] += native
        total["python"] += python
        entries_all += entries
        print(f"{os.path.basename(path)[:40]:40s} {entries:10,d} {load:7.2f} {native:9.3f} "
              f"{entries / native:11,.0f} {python:9.3f} {python / native:5.1f}x "
              f"{python_checked / checked:10.1f}x" + ("" if same else "  PEAKS DIFFER"))
    print(f"all: {entries_all:,} entries, native {total['native']:.2f} s "
          f"({entries_all / total['native']:,.0f} entries/s), python {total['python']:.2f} s: "
          f"{total['python'] / total['native']:.1f}x")


if __name__ == "__main__":
    main()
