"""Replay at scale: one 100k+-event trace through one configuration, and an 8-configuration sweep
serially against local worker processes (same jobs, same process).

    python bench/replay_scale.py [--events 100000] [--json]

The trace is ../shared/data/traces/opt_generate.jsonl.gz repeated (addresses renamed per copy)
until it has at least --events events, written to a temporary gzip JSONL file.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time

from defaults import one_trace
from npumem.trace import read_trace, write_trace
from npumem.whatif.sweep import ReplayJob, run_jobs, sweep_settings

SOURCE = one_trace("opt_generate.jsonl.gz", "gpt_generate.pickle.gz")
SWEEP = ["expandable_segments=True,False", "roundup_power2_divisions=0,4", "segment_size_mb=4,20"]


def build_trace(path: str, at_least: int) -> int:
    base = list(read_trace(SOURCE))
    events, copy = [], 0
    while len(events) < at_least:
        shift = copy << 48
        offset = events[-1].t_us + 1 if events else 0.0
        events += [e._replace(addr=e.addr ^ shift, t_us=e.t_us + offset) for e in base]
        copy += 1
    return write_trace(events, path)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "big.jsonl.gz")
        count = build_trace(path, args.events)
        start = time.perf_counter()
        single = ReplayJob(path).run()
        single_s = time.perf_counter() - start
        jobs = [ReplayJob(path, "pool", s) for s in sweep_settings("", SWEEP)]
        start = time.perf_counter()
        run_jobs(jobs, "serial")
        serial_s = time.perf_counter() - start
        cpu_before, start = children_cpu(), time.perf_counter()
        run_jobs(jobs, "processes")
        parallel_s = time.perf_counter() - start
        busy = (children_cpu() - cpu_before) / parallel_s
    row = {"events": count, "single_replay_s": round(single_s, 2),
           "events_per_s": round(count / single_s), "sweep_configs": len(jobs),
           "sweep_serial_s": round(serial_s, 2), "sweep_processes_s": round(parallel_s, 2),
           "speedup": round(serial_s / parallel_s, 2), "cores_busy": round(busy, 2),
           "cores": os.cpu_count(), "peak_reserved_over_live": round(single.reserved_over_allocated, 3)}
    if args.json:
        print(json.dumps(row))
        return
    print(f"{count} events through the pool: {single_s:.2f} s ({row['events_per_s']:,} events/s)")
    print(f"{len(jobs)}-config sweep: serial {serial_s:.2f} s, {os.cpu_count()} processes "
          f"{parallel_s:.2f} s -> {row['speedup']:.2f}x, {busy:.2f} cores busy on average")


if __name__ == "__main__":
    main()
