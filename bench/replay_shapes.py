"""Which trace shape costs a JSONL replay its memory: generated gzip JSONL traces of allocations
and frees of mixed sizes (512 B to 64 MiB, log-uniform) on several streams, each block freed
within 64 allocations, replayed through the model of PyTorch's allocator in a fresh process
with its peak RSS; the peer is Python's json reading every line of the same file (time only).

    python bench/replay_shapes.py [--events 10M] [--streams 4] [--keep DIR] [--json]

Shapes: `reused`, addresses taken again as an allocator does (4,096 of them); `fresh`, every
allocation at an address never seen before (what a generated trace does, and a trace whose
addresses were renamed per copy). Target (issue 63): at most 500 MB for 10M events.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import sys
import tempfile

import numpy as np

from snapshot_scale import cpu_name, run

PEER = ("import gzip, json, sys\n"
        "with gzip.open(sys.argv[1], 'rt') as lines:\n"
        "    print(sum(1 for line in lines if json.loads(line)['action']))\n")
TARGET_MB = 500


def write_trace(path: str, events: int, streams: int, fresh: bool) -> None:
    """`events` allocs and frees; written as made, so this process stays small."""
    allocs = events // 2
    rng = np.random.default_rng(1)
    sizes = np.exp(rng.uniform(np.log(512), np.log(64 << 20), allocs)).astype(np.int64)
    lifetimes = rng.integers(1, 64, allocs)
    on = rng.integers(0, streams, allocs)
    # alloc i is event 2i, its free event 2(i + lifetime) + 1, in that order
    order = np.argsort(np.concatenate([np.arange(allocs) * 2,
                                       (np.arange(allocs) + lifetimes) * 2 + 1]), kind="stable")
    with gzip.open(path, "wt", compresslevel=1) as out:
        for t, j in enumerate(order.tolist()):
            i, action = (j, "alloc") if j < allocs else (j - allocs, "free")
            addr = (i if fresh else i % 4096) * 4096
            out.write(f'{{"t_us":{t},"action":"{action}","addr":{addr},"size":{int(sizes[i])},'
                      f'"stream":{int(on[i])}}}\n')


def count(text: str) -> int:
    return int(float(text.upper().rstrip("M")) * (1_000_000 if text.upper().endswith("M") else 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", default="10M")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--keep", default=None, help="folder for the traces (kept between runs)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--fresh", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    events = count(args.events)
    if args.write:
        write_trace(args.write, events, args.streams, args.fresh)
        return
    folder = args.keep or tempfile.mkdtemp(prefix="npumem-shapes-")
    rows = {}
    for shape in ("reused", "fresh"):
        path = os.path.join(folder, f"shape_{shape}_{events}_{args.streams}.jsonl.gz")
        if not os.path.isfile(path):
            # in a child: a child's peak RSS counts the process it was forked from, which must
            # not hold the writing's arrays
            print(f"writing {path} ...", file=sys.stderr)
            run([sys.executable, __file__, "--write", path, "--events", str(events),
                 "--streams", str(args.streams)] + (["--fresh"] if shape == "fresh" else []))
        seconds, peak, status, last = run([sys.executable, "-m", "npumem", "replay",
                                           "--allocator", "torch", path])
        peer, _, _, _ = run([sys.executable, "-c", PEER, path])
        rows[shape] = {"seconds": round(seconds, 2), "peak_rss_mib": round(peak * 1024),
                       "peak_rss_mb": round(peak * 2**30 / 1e6), "peer_seconds": round(peer, 2),
                       "time_over_peer": round(seconds / peer, 2), "exit": status,
                       "met": peak * 2**30 / 1e6 <= TARGET_MB and not status}
        if status:
            rows[shape]["last_line"] = last
    machine = f"{cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    if args.json:
        print(json.dumps({"events": events, "streams": args.streams, "machine": machine,
                          "shapes": rows}, indent=2))
        return
    print(f"{events:,} events on {args.streams} streams; {machine}")
    for shape, row in rows.items():
        print(f"  {shape:<7} replay --allocator torch: {row['seconds']:.2f} s "
              f"({row['time_over_peer']:.2f}x json.loads per line, {row['peer_seconds']:.2f} s), "
              f"peak RSS {row['peak_rss_mib']} MiB = {row['peak_rss_mb']} MB "
              f"(target <= {TARGET_MB} MB: {'met' if row['met'] else 'NOT met'})")


if __name__ == "__main__":
    main()
