"""Replay at scale: a JSONL trace of millions of events replayed through the model of PyTorch's
allocator and through npumem's pool, each in a fresh process with its peak RSS, against Python's
own json reading the same file (what the reader was); then an 8-configuration sweep, serially
and in local worker processes.

    python bench/replay_scale.py [--events 1M,10M] [--keep DIR] [--no-sweep] [--json]

The trace is ../shared/data/traces/opt_generate.jsonl.gz (else a bundled recording) repeated,
addresses renamed per copy, until it has --events events, written as gzip JSONL (kept in --keep,
made again only when missing).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time

from defaults import one_trace
from snapshot_scale import cpu_name, entry_count, run
from npumem.trace import read_trace, write_trace
from npumem.whatif.sweep import ReplayJob, run_jobs, sweep_settings

SWEEP = ["expandable_segments=True,False", "roundup_power2_divisions=0,4", "segment_size_mb=4,20"]
# the peer: each line through Python's json, as npumem's reader did before its C parser
PEER = ("import gzip, json, sys\n"
        "with gzip.open(sys.argv[1], 'rt') as lines:\n"
        "    print(sum(1 for line in lines if json.loads(line)['action']))\n")


def build_trace(path: str, at_least: int) -> int:
    """Written as it is made: this process stays small (a child's peak RSS starts from it)."""
    base = list(read_trace(one_trace("opt_generate.jsonl.gz", "gpt_generate.pickle.gz")))
    span = base[-1].t_us + 1

    def events():
        for copy in range(-(-at_least // len(base))):
            shift, offset = copy << 48, copy * span
            yield from (e._replace(addr=e.addr ^ shift, t_us=e.t_us + offset) for e in base)

    return write_trace(events(), path)


def kept_trace(folder: str, at_least: int) -> tuple[str, int]:
    path = os.path.join(folder, f"replay_scale_{at_least}.jsonl.gz")
    count_file = path + ".events"
    if not (os.path.isfile(path) and os.path.isfile(count_file)):
        print(f"writing {path} ...", file=sys.stderr)
        count = build_trace(path, at_least)
        with open(count_file, "w") as out:
            out.write(str(count))
    with open(count_file) as counted:
        return path, int(counted.read())


def replays(path: str, count: int) -> dict:
    npumem = [sys.executable, "-m", "npumem", "replay"]
    commands = {"replay --allocator torch": npumem + ["--allocator", "torch", path],
                "replay --allocator pool": npumem + ["--allocator", "pool", path],
                "peer: json.loads per line": [sys.executable, "-c", PEER, path]}
    rows = {}
    for name, command in commands.items():
        seconds, peak, status, last = run(command)
        rows[name] = {"seconds": round(seconds, 2), "events_per_s": round(count / seconds),
                      "peak_rss_mib": round(peak * 1024), "exit": status}
        if status:
            rows[name]["last_line"] = last
    return rows


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def sweep(path: str) -> dict:
    jobs = [ReplayJob(path, "pool", s) for s in sweep_settings("", SWEEP)]
    start = time.perf_counter()
    run_jobs(jobs, "serial")
    serial_s = time.perf_counter() - start
    cpu_before, start = children_cpu(), time.perf_counter()
    run_jobs(jobs, "processes")
    parallel_s = time.perf_counter() - start
    return {"configs": len(jobs), "serial_s": round(serial_s, 2),
            "processes_s": round(parallel_s, 2), "speedup": round(serial_s / parallel_s, 2),
            "cores_busy": round((children_cpu() - cpu_before) / parallel_s, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", default="1M,10M", help="comma-separated counts (1M, 500K)")
    parser.add_argument("--keep", help="a folder to keep the traces in between runs")
    parser.add_argument("--no-sweep", action="store_true", help="only the single replays")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sizes = [entry_count(text) for text in args.events.split(",")]
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.keep or scratch
        os.makedirs(folder, exist_ok=True)
        report = {"machine": f"{cpu_name()}, {os.cpu_count()} cores", "sizes": []}
        for size in sizes:
            path, count = kept_trace(folder, size)
            rows = replays(path, count)
            report["sizes"].append({"events": count, **rows})
            if not args.json:
                print(f"{count:,} events ({os.path.getsize(path) / 2**20:,.0f} MiB gzip JSONL)")
                peer = rows["peer: json.loads per line"]["seconds"]
                for name, row in rows.items():
                    ratio = "" if name.startswith("peer") else f"  {row['seconds'] / peer:.2f}x the peer"
                    print(f"  {name:28s} {row['seconds']:7.2f} s  {row['events_per_s'] / 1e6:5.2f}M "
                          f"events/s  peak RSS {row['peak_rss_mib']:6,} MiB  exit {row['exit']}{ratio}")
        if not args.no_sweep:
            path, count = kept_trace(folder, sizes[0])
            report["sweep"] = {"events": count, **sweep(path)}
            if not args.json:
                s = report["sweep"]
                print(f"{s['configs']}-config pool sweep of {count:,} events: serial "
                      f"{s['serial_s']:.2f} s, {os.cpu_count()} processes {s['processes_s']:.2f} s "
                      f"-> {s['speedup']:.2f}x, {s['cores_busy']:.2f} cores busy on average")
    if args.json:
        print(json.dumps(report))
    else:
        print(f"machine: {report['machine']}")


if __name__ == "__main__":
    main()
