"""A snapshot of a run that captures CUDA graphs, to time replays of private pools with
(`python bench/torch_replay_speed.py FILE`).

    python bench/graph_snapshot.py OUT.pickle [--entries 1M] [--seed 1]

No recording with private pools ships with the project, so this one is made by the model of
PyTorch's allocator (tests/torch_recorder.py, as the tests make theirs): steps of 40 requests on
stream 0, every tenth captured into one graph pool shared by every capture (as vLLM captures a
graph per batch size into one pool), each step's blocks freed at its end; the entries name
their pools (PyTorch 2.12 and later).
"""

from __future__ import annotations

import argparse
import os
import pickle
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests"))
from torch_recorder import record  # noqa: E402

MiB = 1 << 20
GRAPH_POOL = (1, 0)
SIZES = [4000, 700_000, 3 * MiB, 11 * MiB, 40 * MiB]


def workload(steps: int, seed: int) -> list[tuple]:
    rng = random.Random(seed)
    calls, key = [], 0
    for step in range(steps):
        captured = step % 10 == 0
        if captured:
            calls.append(("pool_begin", GRAPH_POOL, [0]))
        live = []
        for _ in range(40):
            if live and rng.random() < 0.45:
                calls.append(("free", live.pop(rng.randrange(len(live)))))
            else:
                key += 1
                calls.append(("alloc", key, rng.choice(SIZES) + rng.randint(0, 5000), 0))
                live.append(key)
        if captured:
            calls.append(("pool_end", GRAPH_POOL))
        calls += [("free", block) for block in live]
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="the snapshot to write (.pickle)")
    parser.add_argument("--entries", default="1M", help="about this many trace entries (1M, 500K)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    text = args.entries.strip().upper()
    scale = {"K": 1_000, "M": 1_000_000}.get(text[-1:], 1)
    digits = text[:-1] if text[-1:] in ("K", "M") else text
    if not digits.isdigit() or not 1_000 <= int(digits) * scale <= 100_000_000:
        parser.error(f"--entries: a whole count from 1K to 100M, such as 1M or 500K, not "
                     f"{args.entries!r}")
    wanted = int(digits) * scale
    folder = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(folder):
        parser.error(f"{args.out}: no folder {folder} to write it in")
    began = time.perf_counter()
    snapshot = record(workload(max(1, wanted // 71), args.seed), entry_pool_ids=True)
    with open(args.out, "wb") as out:
        pickle.dump(snapshot, out, protocol=4)
    entries = len(snapshot["device_traces"][0])
    private = sum(s["segment_pool_id"] == GRAPH_POOL for s in snapshot["segments"])
    print(f"{args.out}: {entries:,} entries, {len(snapshot['segments'])} segments at the dump "
          f"({private} of the graph pool), made in {time.perf_counter() - began:.1f} s")


if __name__ == "__main__":
    main()
