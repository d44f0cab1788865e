"""Peak reserved / peak live of npumem's pool against the PyTorch-policy emulation, per trace.

    python bench/fragmentation.py [TRACE ...] [--json]

Defaults to every trace in ../shared/data/traces/. Each trace is replayed through `pool`
(npumem, default settings), `pool` in segment mode, `torch` (PyTorch's caching policy) and
`device` (no caching); the ratio is peak reserved / peak live bytes (1.0 is the lower bound).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

from npumem.alloc.settings import AllocatorSettings
from npumem.trace import read_trace
from npumem.trace.replay import replay

DEFAULT = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"
CONFIGS = [("pool", None), ("pool (segments)", AllocatorSettings(expandable_segments=False)),
           ("torch", None), ("device", None)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    paths = args.traces or sorted(str(p) for p in DEFAULT.glob("*.jsonl.gz"))
    rows = []
    for path in paths:
        events = list(read_trace(path))
        for label, settings in CONFIGS:
            start = time.perf_counter()
            result = replay(events, label.split()[0], settings, trace_name=pathlib.Path(path).name)
            rows.append({"trace": result.trace, "allocator": label, "events": result.events,
                         "peak_live_mib": result.peak_allocated_bytes / 2**20,
                         "peak_reserved_mib": result.peak_reserved_bytes / 2**20,
                         "ratio": result.reserved_over_allocated,
                         "seconds": time.perf_counter() - start})
    if args.json:
        print(json.dumps(rows))
        return
    print(f"{'trace':<24} {'allocator':<16} {'events':>7} {'live MiB':>9} {'reserved MiB':>12} {'ratio':>6} {'s':>5}")
    for r in rows:
        print(f"{r['trace']:<24} {r['allocator']:<16} {r['events']:>7} {r['peak_live_mib']:>9.1f} "
              f"{r['peak_reserved_mib']:>12.1f} {r['ratio']:>6.3f} {r['seconds']:>5.2f}")
    by_trace = {}
    for r in rows:
        by_trace.setdefault(r["trace"], {})[r["allocator"]] = r["ratio"]
    for trace, ratios in by_trace.items():
        print(f"{trace}: pool {ratios['pool']:.3f} vs torch {ratios['torch']:.3f} "
              f"({ratios['torch'] / ratios['pool']:.2f}x less reserved)")


if __name__ == "__main__":
    main()
