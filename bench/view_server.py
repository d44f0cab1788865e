"""npumem view's server at scale: make PyTorch-shaped snapshots of 1M and 10M trace entries (as
bench/snapshot_scale.py makes them: a real recording's steady step repeated), start
`npumem view FILE --no-browser` on each, and time what a page asks for:

- ready: from the command's start to its first line (`serving ...`), and to the first
  /api/info + /api/timeline answered (what the page needs for its first drawing);
- when the background analysis (steps, leaks: the report's) is done;
- per request, once it is, at the server (the time from sending to the whole answer, on this
  machine's loopback): zooms and pans of the timeline (width 800, random ranges from the whole trace down
  to a few hundred entries), moments at random times, allocations clicked from a moment; p50,
  p99 and the worst;
- the server's RSS, now and at its peak (VmHWM), after every request.

    python bench/view_server.py [--entries 1M,10M] [--keep DIR] [--requests 200] [--whatif]

The browser's own drawing is bench/view_browser.py's (the front-end's); this one is the
server alone, so that its figures are not the browser's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from snapshot_scale import cpu_name, entry_count, make_snapshot  # noqa: E402


def rss(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process, in bytes."""
    found = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                found[name] = int(value.split()[0]) * 1024
    return found.get("VmRSS", 0), found.get("VmHWM", 0)


class Client:
    def __init__(self, address: str):
        self.base, _, self.token = address.partition("/?token=")

    def get(self, route: str, **query) -> tuple[dict, float]:
        query["token"] = self.token
        url = self.base + route + "?" + "&".join(f"{k}={v}" for k, v in query.items())
        start = time.perf_counter()
        with urllib.request.urlopen(url, timeout=600) as answer:
            data = answer.read()
        took = time.perf_counter() - start
        return json.loads(data), took

    def post(self, route: str, body: dict) -> dict:
        request = urllib.request.Request(self.base + route + "?token=" + self.token,
                                         data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=60) as answer:
            return json.loads(answer.read())


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))]


def measure(path: str, entries: int, requests: int, whatif: bool) -> dict:
    start = time.perf_counter()
    server = subprocess.Popen([sys.executable, "-m", "npumem", "view", path, "--no-browser"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = server.stdout.readline()
        serving = time.perf_counter() - start
        if not first.startswith("serving "):
            raise SystemExit(f"npumem view did not start: {first}{server.stderr.read()}")
        client = Client(first.rsplit(" at ", 1)[1].strip())
        info, _ = client.get("/api/info")
        source = info["sources"][0]
        client.get("/api/timeline", source=0, width=800)
        ready = time.perf_counter() - start
        # the report's leak analysis (steps, leaks, an OOM's explanation) runs in the
        # background from here; clicks are timed once it is done, and its time is said apart
        while any(s["steps_pending"] for s in client.get("/api/info")[0]["sources"]):
            time.sleep(0.1)
        analysed = time.perf_counter() - start
        rng = random.Random(62)
        t_min, t_max = source["t_min"], source["t_max"]
        span = t_max - t_min
        times = {"timeline": [], "moment": [], "allocation": []}
        ids: list[int] = []
        for number in range(requests):
            width = span * 10 ** rng.uniform(-4.5, 0)          # whole trace to ~300 entries
            t0 = t_min + rng.uniform(0, span - width)
            kind = ("timeline", "timeline", "moment", "allocation")[number % 4]
            if kind == "timeline":
                _, took = client.get("/api/timeline", source=0, t0=t0, t1=t0 + width, width=800)
            elif kind == "moment":
                answer, took = client.get("/api/moment", source=0, t=t0)
                ids += [b["alloc_id"] for s in answer["segments"] for b in s["blocks"]
                        if b["alloc_id"] is not None][:50]
            else:
                if not ids:
                    continue
                _, took = client.get("/api/allocation", source=0, id=rng.choice(ids))
            times[kind].append(took)
        now, peak = rss(server.pid)
        result = {"entries": entries, "serving_s": serving, "ready_s": ready,
                  "analysis_done_s": analysed,
                  "rss_bytes": now, "peak_rss_bytes": peak,
                  "latency_ms": {kind: {"n": len(v), "p50": 1e3 * percentile(v, 0.5),
                                        "p99": 1e3 * percentile(v, 0.99),
                                        "max": 1e3 * max(v)}
                                 for kind, v in times.items() if v}}
        if whatif:
            began = time.perf_counter()
            job = client.post("/api/whatif", {"source": 0, "setting": "expandable_segments:True"})
            while True:
                state, _ = client.get("/api/job", id=job["job"])
                if state["done"]:
                    break
                time.sleep(0.5)
            result["whatif_s"] = time.perf_counter() - began
            result["whatif_error"] = state["error"]
            result["peak_rss_bytes"] = rss(server.pid)[1]
        return result
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", default="1M,10M", help="comma-separated counts (1M, 500K)")
    parser.add_argument("--keep", help="write the snapshots to this folder and keep them")
    parser.add_argument("--requests", type=int, default=200, help="requests per snapshot")
    parser.add_argument("--whatif", action="store_true", help="also time one what-if replay")
    args = parser.parse_args()
    folder = args.keep or tempfile.mkdtemp(prefix="npumem-view-")
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    for count in map(entry_count, args.entries.split(",")):
        path = os.path.join(folder, f"scale_{count}_shared.pickle")
        if os.path.exists(path + ".entries"):              # kept from an earlier run
            with open(path + ".entries") as f:
                written = int(f.read())
        else:
            began = time.perf_counter()
            written = make_snapshot(path, count, "shared")
            with open(path + ".entries", "w") as f:
                f.write(str(written))
            print(f"wrote {written:,} entries in {time.perf_counter() - began:.0f} s: {path}")
        result = measure(path, written, args.requests, args.whatif)
        print(f"{written:,} entries ({os.path.getsize(path) / 2**20:,.0f} MiB): serving after "
              f"{result['serving_s']:.1f} s, first timeline after {result['ready_s']:.1f} s, "
              f"steps and leaks after {result['analysis_done_s']:.1f} s; "
              f"RSS {result['rss_bytes'] / 2**20:,.0f} MiB (peak "
              f"{result['peak_rss_bytes'] / 2**20:,.0f} MiB)"
              + (f"; what-if {result['whatif_s']:.1f} s" if "whatif_s" in result else ""))
        for kind, row in result["latency_ms"].items():
            print(f"  {kind:<10} n={row['n']:<4} p50 {row['p50']:7.1f} ms  p99 "
                  f"{row['p99']:7.1f} ms  max {row['max']:7.1f} ms")
        print("  " + json.dumps(result))


if __name__ == "__main__":
    main()
