"""`npumem view` in a real browser on snapshots of millions of entries, next to PyTorch's
MemoryViz on the same files.

    python bench/view_browser.py [--entries 1M,10M] [--keep DIR] [--no-peer] [--rounds 5]

For each size it writes (or reuses, from --keep) the snapshot bench/snapshot_scale.py makes: the
project's real H100 gpt_train recording with its steady step repeated. Then, with headless
chromium already running (Debian's /usr/bin/chromium through chromedriver, so its own start is
not counted):

- command to first drawn timeline: from starting `npumem view --no-browser` to the page's
  `data-npumem-ready="1"` (the first timeline drawn), through reading the file, the server's
  precomputation, loading the page and its first /api/info and /api/timeline;
- zoom, pan and click round trips, measured in the page: from the call that changes the range
  (the one the wheel, a drag and the keys make) to the new timeline drawn, and from a click to
  the moment panel or the allocation panel filled in; each with the part spent in fetch (the
  request's time at the server plus the loopback);
- the server's RSS, now and at its peak (/proc's VmRSS and VmHWM).

The peer: `python -m torch.cuda._memory_viz trace_plot FILE -o OUT.html` (PyTorch's own way to
make MemoryViz's page from a pickle, no GPU needed), timed with its peak RSS, then the page
opened in the same browser and given --peer-wait seconds to draw an <svg>. torch 2.13.0 does
not install MemoryViz.js: the page imports it from a CDN, and MemoryViz imports d3 from another,
so on a machine without the network it draws nothing, and the bench says so with the console's
error.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from snapshot_scale import cpu_name, entry_count, make_snapshot  # noqa: E402

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"

# In the page: change the range, then wait for the timeline drawn from the server's answer.
SET_VIEW = """
const done = arguments[arguments.length - 1], root = document.documentElement;
const before = +root.getAttribute('data-npumem-draws'), start = performance.now();
NV.timeline.setView(arguments[0], arguments[1], 'now');
(function poll() {
  if (+root.getAttribute('data-npumem-draws') > before)
    done({ms: performance.now() - start, fetch: NV.timeline.state.lastMs});
  else if (performance.now() - start > 60000) done({error: document.getElementById('errors').innerText});
  else setTimeout(poll, 1);
})();
"""
# A click on the timeline at t: the moment panel filled in from /api/moment.
MOMENT = """
const done = arguments[arguments.length - 1], t = arguments[0], start = performance.now();
const panel = document.getElementById('panel-moment');
panel.removeAttribute('data-moment-t');
NV.moment.show(NV.timeline.state.info, 0, t);
(function poll() {
  if (panel.getAttribute('data-moment-t') !== null) done({ms: performance.now() - start});
  else if (performance.now() - start > 60000) done({error: document.getElementById('errors').innerText});
  else setTimeout(poll, 1);
})();
"""
# A click on the largest live block that has a record: the allocation panel filled in.
ALLOCATION = """
const done = arguments[arguments.length - 1];
const button = document.querySelector('#panel-moment .largest button');
if (!button) { done({error: 'no allocation to click'}); return; }
const start = performance.now();
NV.allocation.show(NV.timeline.state.info, 0, button.getAttribute('data-alloc-id'))
  .then(() => done({ms: performance.now() - start}));
"""


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1400,1000", "--no-first-run"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_script_timeout(120)
    return driver


def rss(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process, GiB."""
    values = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, kib = line.split()[:2]
                values[key] = int(kib) / 2**20
    return values["VmRSS:"], values["VmHWM:"]


def wait_ready(driver, timeout: float) -> bool:
    end = time.perf_counter() + timeout
    while time.perf_counter() < end:
        if driver.execute_script(
                "return document.documentElement.getAttribute('data-npumem-ready')") == "1":
            return True
        time.sleep(0.02)
    return False


def summary(label: str, samples: list[dict]) -> str:
    errors = [s["error"] for s in samples if "error" in s]
    if errors:
        return f"  {label:34s} FAILED: {errors[0]}"
    ms = sorted(s["ms"] for s in samples)
    text = f"  {label:34s} median {ms[len(ms) // 2]:6.0f} ms, worst {ms[-1]:6.0f} ms"
    fetch = sorted(s["fetch"] for s in samples if s.get("fetch") is not None)
    if fetch:
        text += f"  (fetch: median {fetch[len(fetch) // 2]:.0f} ms, worst {fetch[-1]:.0f} ms)"
    return text + f"  [{len(ms)}]"


def measure_npumem(driver, path: str, rounds: int) -> None:
    start = time.perf_counter()
    server = subprocess.Popen([sys.executable, "-m", "npumem", "view", "--no-browser",
                               "--port", "0", path],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = server.stdout.readline()
        printed = time.perf_counter() - start
        match = re.search(r"http://\S+", first)
        if not match:
            print(f"  npumem view failed: {first!r} {server.stderr.read()[-1000:]}")
            return
        driver.get(match.group(0))
        if not wait_ready(driver, 300):
            print("  the page never drew its timeline:",
                  driver.execute_script("return document.getElementById('errors').innerText"))
            return
        drawn = time.perf_counter() - start
        now, peak = rss(server.pid)
        print(f"  command to address printed       {printed:6.1f} s")
        print(f"  command to first drawn timeline  {drawn:6.1f} s   server RSS {now:.2f} GiB "
              f"(peak {peak:.2f} GiB)")

        full = driver.execute_script("return NV.timeline.state.full")
        zooms, pans, moments, allocations = [], [], [], []
        for k in range(rounds):
            centre = full * (k + 0.5) / rounds
            span = full
            for _ in range(3):                       # wheel-like zooms, 10x each, to 1/1000
                span /= 10
                zooms.append(driver.execute_async_script(SET_VIEW, centre - span / 2,
                                                         centre + span / 2))
            for step in (0.3, 0.3, -0.6):            # drags and arrow keys
                centre += span * step
                pans.append(driver.execute_async_script(SET_VIEW, centre - span / 2,
                                                        centre + span / 2))
            moments.append(driver.execute_async_script(MOMENT, centre))
            allocations.append(driver.execute_async_script(ALLOCATION))
            zooms.append(driver.execute_async_script(SET_VIEW, 0, full))   # back to the whole
        print(summary("zoom (10x in, and out to whole)", zooms))
        print(summary("pan (30% of the range)", pans))
        print(summary("click: moment panel", moments))
        print(summary("click: allocation panel", allocations))
        now, peak = rss(server.pid)
        print(f"  server RSS after the clicks      {now:.2f} GiB (peak {peak:.2f} GiB)")
        errors = driver.execute_script("return document.getElementById('errors').innerText")
        if errors:
            print(f"  errors shown in the page: {errors!r}")
    finally:
        server.terminate()
        server.wait(20)


def measure_memoryviz(driver, path: str, wait: float) -> None:
    with tempfile.TemporaryDirectory() as folder:
        html = os.path.join(folder, "memory_viz.html")
        start = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot",
                                  path, "-o", html],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        output = child.stdout.read()
        _, status, usage = os.wait4(child.pid, 0)
        made = time.perf_counter() - start
        if status or not os.path.exists(html):
            print(f"  peer: trace_plot failed after {made:.1f} s: {output.strip()[-300:]}")
            return
        size = os.path.getsize(html) / 2**20
        print(f"  peer: trace_plot wrote its page   {made:6.1f} s   peak RSS "
              f"{usage.ru_maxrss / 2**20:.2f} GiB, {size:,.0f} MiB of HTML")
        driver.get_log("browser")                     # only this page's messages below
        opened = time.perf_counter()
        driver.get("file://" + html)
        drawn = None
        while time.perf_counter() - opened < wait:
            if driver.execute_script("return document.querySelectorAll('svg').length > 0"):
                drawn = time.perf_counter() - opened
                break
            time.sleep(0.1)
        if drawn is not None:
            print(f"  peer: MemoryViz drew its first svg {made + drawn:6.1f} s after the command")
            return
        errors = [entry["message"] for entry in driver.get_log("browser")
                  if entry["level"] == "SEVERE"]
        print(f"  peer: MemoryViz drew nothing in {wait:.0f} s after loading its page"
              + (f": {errors[0][:240]}" if errors else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", default="1M,10M", help="comma-separated counts (1M, 500K)")
    parser.add_argument("--keep", help="write the snapshots to this folder and keep them "
                                       "(bench/snapshot_scale.py's names: it reuses them)")
    parser.add_argument("--rounds", type=int, default=5, help="zoom/pan/click rounds per file")
    parser.add_argument("--no-peer", action="store_true", help="skip PyTorch's MemoryViz")
    parser.add_argument("--peer-wait", type=float, default=30.0,
                        help="seconds MemoryViz's page gets to draw")
    args = parser.parse_args()
    for tool in (CHROMIUM, CHROMEDRIVER):
        if not os.access(tool, os.X_OK):
            sys.exit(f"{tool} is missing: apt-get install chromium chromium-driver")
    folder = args.keep or tempfile.mkdtemp(prefix="npumem-view-")
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores, Python {sys.version.split()[0]}, "
          f"{subprocess.run([CHROMIUM, '--version'], capture_output=True, text=True).stdout.strip()}")
    driver = browser()
    try:
        for count in map(entry_count, args.entries.split(",")):
            path = os.path.join(folder, f"scale_{count}_shared.pickle")
            if os.path.exists(path + ".entries"):
                with open(path + ".entries") as f:
                    written = int(f.read())
            else:
                written = make_snapshot(path, count, "shared")
                with open(path + ".entries", "w") as f:
                    f.write(str(written))
            print(f"{written:,} entries, {os.path.getsize(path) / 2**20:,.0f} MiB snapshot")
            measure_npumem(driver, path, args.rounds)
            if not args.no_peer:
                measure_memoryviz(driver, path, args.peer_wait)
    finally:
        driver.quit()
        if not args.keep:
            for name in os.listdir(folder):
                os.remove(os.path.join(folder, name))
            os.rmdir(folder)


if __name__ == "__main__":
    main()
