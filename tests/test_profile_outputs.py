"""Profiler outputs: snapshots PyTorch reads, Chrome trace, msprof CSVs, HTML, fragmentation,
the `npumem profile / report / diff` commands and the pytest plugin."""

import csv
import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import npumem
import npumem.memory as mem
from npumem import profile
from npumem.cli import main
from npumem.profile.chrome import chrome_events
from npumem.profile.fragmentation import analyze, analyze_segment
from npumem.profile.msprof import (
    MEMORY_RECORD_COLUMNS, OPERATOR_MEMORY_COLUMNS, write_memory_record, write_operator_memory,
)
from npumem.units import KiB, MiB

SCRIPT = textwrap.dedent("""\
    import sys
    import numpy as np
    import npumem, npumem.memory as mem
    from npumem import profile

    npumem.init(); npumem.set_device(0)
    stream = npumem.create_stream()
    with profile.range("load"):
        weights = npumem.from_numpy(np.ones((128, 128), np.float32), stream=stream)
    out = npumem.empty((128, 128), "float32")
    npumem.aclnn.run_with_pool_workspace(
        npumem.aclnn.matmul, npumem.aclnn.matmul_get_workspace_size(weights.t(), weights, out),
        stream)
    profile.mark("matmul queued")
    leaked = mem.caching_allocator_alloc(1 << 20)    # line 15: planted leak
    stream.synchronize()
    sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
""")


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "job.py"
    path.write_text(SCRIPT)
    return path


def profile_run(args, out):
    return CliRunner().invoke(main, ["profile", "--out", str(out), *args])


def test_profile_writes_every_output_and_passes_the_exit_code(tmp_path, script):
    out = tmp_path / "prof"
    result = profile_run(["--stacks", "--", str(script), "7"], out)
    assert result.exit_code == 7, result.output
    assert sorted(p.name for p in out.iterdir()) == sorted(profile.folder.OUTPUTS)
    leaks = (out / "leaks.txt").read_text()
    assert f"1.00 MiB in 1 allocation(s) at {script}:15 in <module>" in leaks
    # live when the script's code ended: the planted leak, and the tensors its globals still hold
    assert "3 leaked allocation(s), 1.12 MiB" in result.output
    summary = (out / "summary.txt").read_text()
    assert "peak allocated" in summary and "MatMul" in summary and f"{script}:15" in summary
    snapshot = pickle.loads((out / "snapshot.pickle").read_bytes())
    leaked = [b for s in snapshot["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    assert sorted(b["requested_size"] for b in leaked) == [1 << 16, 1 << 16, 1 << 20]
    assert [b["frames"][0]["line"] for b in leaked if b["requested_size"] == 1 << 20] == [15]
    trace = json.loads((out / "trace.json").read_text())["traceEvents"]
    assert {"C", "i", "X", "M"} <= {e["ph"] for e in trace}
    assert any(e["ph"] == "X" and e["name"] == "MatMul" for e in trace)
    assert any(e["ph"] == "X" and e["name"] == "load" for e in trace)
    assert any(e["ph"] == "i" and e["name"] == "matmul queued" for e in trace)


def test_profile_of_a_script_that_raises_keeps_the_results(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import npumem, npumem.memory as mem\nnpumem.init(); npumem.set_device(0)\n"
                   "p = mem.caching_allocator_alloc(4096)\nraise RuntimeError('boom')\n")
    out = tmp_path / "prof"
    result = profile_run(["--", str(bad)], out)
    assert result.exit_code == 1
    assert "RuntimeError: boom" in result.output
    assert (out / "report.html").exists() and "1 allocation(s) still live" in (out / "leaks.txt").read_text()


def test_profile_refuses_a_used_folder_and_a_missing_script(tmp_path, script):
    out = tmp_path / "prof"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = profile_run(["--", str(script)], out)
    assert result.exit_code == 2 and "not empty" in result.output and "--force" in result.output
    assert (out / "keep.txt").read_text() == "mine"
    assert profile_run(["--force", "--", str(script)], out).exit_code == 0
    missing = profile_run(["--", str(tmp_path / "nope.py")], tmp_path / "p2")
    assert missing.exit_code == 2 and "no such script" in missing.output
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert "is a file" in profile_run(["--", str(script)], blocked).output


def test_report_and_diff_commands(tmp_path, script):
    out = tmp_path / "prof"
    profile_run(["--stacks", "--", str(script)], out)
    result = CliRunner().invoke(main, ["report", str(out), "--html", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    assert f"{script}:15 in <module>" in result.output
    assert "Fragmentation" in result.output and (tmp_path / "r.html").exists()

    with pytest.warns(npumem.errors.LiveAllocationsWarning):   # the script's planted leak
        npumem.finalize()                                       # (it ran in this process)
    npumem.init()
    npumem.set_device(0)
    mem.record_memory_history()
    before = mem.memory_snapshot()
    grown = [mem.caching_allocator_alloc(2 * MiB) for _ in range(3)]
    after = mem.memory_snapshot()
    for name, snap in (("a.pickle", before), ("b.pickle", after)):
        profile.save_snapshot(snap, tmp_path / name)
    result = CliRunner().invoke(main, ["diff", str(tmp_path / "a.pickle"), str(tmp_path / "b.pickle")])
    assert result.exit_code == 0, result.output
    assert "+6.00 MiB" in result.output and "test_report_and_diff_commands" in result.output
    for ptr in grown:
        mem.caching_allocator_delete(ptr)


def test_report_rejects_unreadable_files(tmp_path, script):
    out = tmp_path / "prof"
    profile_run(["--", str(script)], out)
    data = (out / "snapshot.pickle").read_bytes()
    (tmp_path / "cut.pickle").write_bytes(data[: len(data) // 2])
    (tmp_path / "list.pickle").write_bytes(pickle.dumps([1, 2]))
    runner = CliRunner()
    cut = runner.invoke(main, ["report", str(tmp_path / "cut.pickle")])
    assert cut.exit_code == 2 and "truncated" in cut.output and "cut.pickle" in cut.output
    wrong = runner.invoke(main, ["report", str(tmp_path / "list.pickle")])
    assert wrong.exit_code == 2 and "not a memory snapshot" in wrong.output
    missing = runner.invoke(main, ["report", str(tmp_path / "none.pickle")])
    assert missing.exit_code == 2 and "no such file" in missing.output
    assert runner.invoke(main, ["report", str(tmp_path)]).exit_code == 2   # no snapshot.pickle


def make_profiled_run(rt):
    with profile.track(stacks=True) as tracker:
        a = mem.caching_allocator_alloc(3000)
        b = mem.caching_allocator_alloc(64 * KiB)
        mem.caching_allocator_delete(a)
        d = npumem.malloc(100)
        npumem.free(d)
    return tracker, b


def test_msprof_csvs(rt, tmp_path):
    tracker, b = make_profiled_run(rt)
    assert write_memory_record(tmp_path / "m.csv", tracker) == len(tracker.events())
    with open(tmp_path / "m.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert tuple(rows[0]) == MEMORY_RECORD_COLUMNS
    assert rows[1][0] == "NPUMEM_POOL" and rows[1][-1] == "NPU:0" and float(rows[1][3]) == 2.0
    assert write_operator_memory(tmp_path / "o.csv", tracker) == 3
    with open(tmp_path / "o.csv", newline="") as f:
        records = list(csv.DictReader(f))
    assert tuple(records[0]) == OPERATOR_MEMORY_COLUMNS
    first, live, driver = records
    assert float(first["Size(KB)"]) == round(3000 / 1024, 3)
    assert float(first["Duration(us)"]) >= 0 and first["Release Time(us)"]
    assert live["Release Time(us)"] == "" and "test_profile_outputs" in live["Name"]
    assert float(driver["Size(KB)"]) == round(100 / 1024, 3)
    mem.caching_allocator_delete(b)


def test_chrome_trace_counters_follow_the_totals(rt):
    tracker, b = make_profiled_run(rt)
    events = chrome_events(tracker)
    counters = [e for e in events if e["ph"] == "C" and e["name"] == "memory"]
    assert [c["args"]["allocated"] for c in counters] == [e.allocated for e in tracker.events()]
    assert all(c["ts"] >= 0 for c in counters)
    assert json.loads(json.dumps({"traceEvents": events}))
    mem.caching_allocator_delete(b)


def _check_trace_event_format(events: list[dict]) -> None:
    """The Trace Event Format's rules that viewers depend on."""
    named = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    for event in events:
        assert event["ph"] in "MCiX" and isinstance(event["name"], str) and event["name"]
        assert isinstance(event["pid"], int) and 0 <= event["pid"] < 2**31
        if event["ph"] != "M":
            assert isinstance(event["ts"], (int, float)) and event["ts"] >= 0
        if event["ph"] == "C":
            assert all(isinstance(v, (int, float)) for v in event["args"].values())
            continue
        if event["ph"] == "X":
            assert event["dur"] >= 0
        if event["ph"] == "i":
            assert event["s"] in "gpt"
        if "tid" in event:
            assert isinstance(event["tid"], int) and 0 <= event["tid"] < 2**31
            assert event["ph"] == "M" or (event["pid"], event["tid"]) in named, event


def test_chrome_trace_has_a_named_small_track_per_stream_and_thread(rt):
    first, second = npumem.create_stream(), npumem.create_stream()
    with profile.track() as tracker:
        with profile.range("step"):
            a = npumem.from_numpy(np.ones((64, 64), np.float32), stream=first)
            b = npumem.from_numpy(np.ones((64, 64), np.float32), stream=second)
            for stream, x in ((first, a), (second, b)):
                out = npumem.empty((64, 64), "float32", stream=stream)
                npumem.aclnn.run_with_pool_workspace(
                    npumem.aclnn.matmul, npumem.aclnn.matmul_get_workspace_size(x, x, out), stream)
                stream.synchronize()
        profile.mark("done")
    events = chrome_events(tracker)
    _check_trace_event_format(events)
    names = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {f"stream 0x{first.handle:x}", f"stream 0x{second.handle:x}"} <= names
    assert any(name.startswith("thread ") for name in names)          # the range and the mark
    ops = {(e["pid"], e["tid"]) for e in events if e.get("cat") == "op"}
    assert len(ops) == 2                                              # one track per stream
    del a, b


def test_fragmentation_of_a_known_segment():
    segment = {"device": 0, "address": 0, "total_size": 1000, "blocks": [
        {"address": 0, "size": 100, "state": "inactive"},
        {"address": 100, "size": 200, "state": "active_allocated"},
        {"address": 300, "size": 300, "state": "inactive"},
        {"address": 600, "size": 100, "state": "inactive"},
        {"address": 700, "size": 300, "state": "active_pending_free"}]}
    result = analyze_segment(segment, width=10)
    assert (result.free, result.largest_free, result.allocated) == (500, 400, 200)
    assert result.ratio == pytest.approx(0.2)
    assert result.map == ".##....+++"
    (pool,) = analyze({"segments": [segment]})
    assert pool.ratio == pytest.approx(0.2) and pool.reserved == 1000


def test_fragmentation_matches_the_pool(rt):
    held = [mem.caching_allocator_alloc(100 * KiB) for _ in range(10)]
    for ptr in held[::2]:
        mem.caching_allocator_delete(ptr)
    (pool,) = analyze(mem.memory_snapshot())
    mine = mem.get_allocator().fragmentation()
    assert (pool.free, pool.largest_free) == (mine["free"], mine["largest_free"])
    assert pool.ratio == pytest.approx(mine["ratio"]) and pool.ratio > 0
    for ptr in held[1::2]:
        mem.caching_allocator_delete(ptr)


def test_html_report_is_self_contained(tmp_path, script):
    out = tmp_path / "prof"
    profile_run(["--stacks", "--", str(script)], out)
    page = (out / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<polyline" in page
    assert "http://" not in page and "https://" not in page and "<script src" not in page
    assert page.count("<script>") == 1                     # the zoom, inline
    assert "Leaks" in page and "Fragmentation and block map" in page and "job.py:15" in page


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed")
def test_html_report_renders_in_headless_chromium(tmp_path, script):
    out = tmp_path / "prof"
    profile_run(["--stacks", "--", str(script)], out)
    dom = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'chrome'}", "--dump-dom", (out / "report.html").as_uri()],
        capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr
    assert "<polyline" in dom.stdout and "job.py:15" in dom.stdout
    picture = tmp_path / "report.png"
    shot = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'chrome'}", "--window-size=1280,1600",
         f"--screenshot={picture}", (out / "report.html").as_uri()],
        capture_output=True, text=True, timeout=120)
    assert shot.returncode == 0, shot.stderr
    png = picture.read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 20_000      # a drawn page, not a blank one


def _memory_viz(args, cwd):
    return subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", *args],
                          capture_output=True, text=True, timeout=300, cwd=cwd)


def test_pytorch_memory_viz_reads_our_snapshot(tmp_path, script):
    pytest.importorskip("torch")
    out = tmp_path / "prof"
    profile_run(["--stacks", "--", str(script)], out)
    snapshot = str(out / "snapshot.pickle")
    with open(snapshot, "rb") as handle:
        data = pickle.load(handle)
    addresses = [s["address"] for s in data["segments"]] + \
        [e["addr"] for trace in data["device_traces"] for e in trace]
    assert addresses and all(0 < a < 2**53 for a in addresses)   # exact in MemoryViz's JavaScript
    stats = _memory_viz(["stats", snapshot], tmp_path)
    assert stats.returncode == 0, stats.stderr
    assert "total_reserved" in stats.stdout and "segments:" in stats.stdout
    trace = _memory_viz(["trace", snapshot], tmp_path)
    assert trace.returncode == 0, trace.stderr
    assert "Device 0" in trace.stdout and "free completed" in trace.stdout
    for kind in ("trace_plot", "segment_plot"):
        html = tmp_path / f"{kind}.html"
        result = _memory_viz([kind, snapshot, "-o", str(html)], tmp_path)
        assert result.returncode == 0, result.stderr
        assert "snapshot.pickle" in html.read_text()


def test_report_reads_a_pytorch_snapshot(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        snapshot = {  # what torch.cuda.memory._snapshot() returns, written out by hand on CPU
            "segments": [{"device": 0, "address": 1 << 20, "total_size": 2 << 20,
                          "allocated_size": 512, "active_size": 512, "requested_size": 500,
                          "stream": 0, "segment_type": "small", "blocks": [
                              {"address": 1 << 20, "size": 512, "requested_size": 500,
                               "state": "active_allocated",
                               "frames": [{"filename": "/app/train.py", "line": 3, "name": "f"}]},
                              {"address": (1 << 20) + 512, "size": (2 << 20) - 512,
                               "requested_size": 0, "state": "inactive", "frames": []}]}],
            "device_traces": [[
                {"action": "segment_alloc", "addr": 1 << 20, "size": 2 << 20, "stream": 0,
                 "time_us": 1, "frames": []},
                {"action": "alloc", "addr": 1 << 20, "size": 512, "stream": 0, "time_us": 2,
                 "frames": [{"filename": "/app/train.py", "line": 3, "name": "f"}]}]]}
    else:
        torch.cuda.memory._record_memory_history()
        x = torch.empty(500, dtype=torch.uint8, device="cuda")
        snapshot = torch.cuda.memory._snapshot()
        del x
    path = tmp_path / "torch.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    result = CliRunner().invoke(main, ["report", str(path)])
    assert result.exit_code == 0, result.output
    assert "still live at its end" in result.output and "peak allocated" in result.output


def test_pytest_plugin_markers(pytester):
    pytester.makeconftest("")
    pytester.makepyfile(test_markers="""
        import pytest
        import npumem, npumem.memory as mem

        @pytest.fixture(autouse=True)
        def device():
            npumem.init(); npumem.set_device(0)
            yield
            npumem.finalize()

        @pytest.mark.no_device_leaks
        def test_clean():
            mem.caching_allocator_delete(mem.caching_allocator_alloc(1000))

        @pytest.mark.no_device_leaks
        def test_leaky():
            test_leaky.kept = mem.caching_allocator_alloc(5000)

        @pytest.mark.limit_device_memory("1 MiB")
        def test_small():
            mem.caching_allocator_delete(mem.caching_allocator_alloc(1000))

        @pytest.mark.limit_device_memory("1 MiB")
        def test_big():
            a = mem.caching_allocator_alloc(800 * 1024)
            b = mem.caching_allocator_alloc(800 * 1024)
            mem.caching_allocator_delete(a); mem.caching_allocator_delete(b)

        @pytest.mark.limit_device_memory("1 MiB")
        def test_exactly_the_limit():
            mem.caching_allocator_delete(mem.caching_allocator_alloc(1 << 20))

        @pytest.mark.no_device_leaks
        def test_fails_on_its_own():
            assert 1 == 2, "the test's own failure"
    """)
    result = pytester.runpytest("-p", "no:cacheprovider", "-W", "ignore",
                                "-W", "error::pluggy.PluggyTeardownRaisedWarning")
    result.assert_outcomes(passed=3, failed=3)
    result.stdout.fnmatch_lines([
        "*device memory leaked by the test*",
        "*4.88 KiB in 1 allocation(s) at *test_markers.py:16 in test_leaky*",
        "*peak 1.56 MiB asked for through npumem (1.56 MiB in pool blocks) exceeds the 1.00 MiB limit*",
        "*test_markers.py:24 in test_big*",
        "*the test's own failure*",
    ])
    assert "PluggyTeardownRaisedWarning" not in result.stdout.str()


def test_stacks_end_where_the_test_runner_called_the_test():
    from npumem.profile.stacks import capture, resolve

    frames = resolve(capture(50))
    assert frames[0].name == "test_stacks_end_where_the_test_runner_called_the_test"
    assert not any(f"{os.sep}_pytest{os.sep}" in f.filename or f"{os.sep}pluggy{os.sep}" in f.filename
                   for f in frames)


def test_pytest_plugin_bad_limit_is_a_usage_error(pytester):
    pytester.makepyfile(test_bad="""
        import pytest

        @pytest.mark.limit_device_memory("lots")
        def test_anything():
            pass
    """)
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_anything: limit_device_memory:*"])
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_timeline_ticks_are_round_in_one_unit():
    from npumem.profile.analysis import Point
    from npumem.profile.html import render_html, timeline_svg
    from npumem.profile.report import build_report

    points = [Point(1000.0 + i * 99.0, i * 1024, i * 2048, i * 1024) for i in range(201)]   # 19.8 ms
    svg = timeline_svg(points)
    import re

    xticks = svg.split("<g class=xticks>")[1].split("</g>")[0]
    labels = re.findall(r">([^<]+)</text>", xticks)
    assert labels == ["0 ms", "5 ms", "10 ms", "15 ms"], labels
    page = render_html(build_report({"segments": [], "device_traces": [[]]}, "t"))
    assert '<meta name=viewport content="width=device-width,initial-scale=1">' in page


def test_icicle_of_live_memory_at_the_peak():
    from npumem.profile.html import icicle_svg

    stacks = {("train.py:1 in <module>", "train.py:9 in step", "torch/nn/linear.py:5 in forward"): 3 << 20,
              ("train.py:1 in <module>", "train.py:4 in build"): 1 << 20}
    svg = icicle_svg(stacks, width=1000)
    assert svg == icicle_svg(stacks, width=1000)                  # the same page every run
    assert "<title>train.py:1 in &lt;module&gt;: 4.00 MiB (100.0%)</title>" in svg
    assert '<title>train.py:9 in step: 3.00 MiB (75.0%)</title><rect x="0.0" y="20" width="749.0"' in svg
    assert '<title>train.py:4 in build: 1.00 MiB (25.0%)</title><rect x="750.0" y="20"' in svg
    assert "Nothing was live" in icicle_svg({})


def test_timeline_shows_ranges_marks_ops_and_the_largest_allocations(tmp_path):
    script = tmp_path / "steps.py"
    script.write_text(textwrap.dedent("""\
        import numpy as np
        import npumem
        from npumem import profile

        npumem.init(); npumem.set_device(0)
        stream = npumem.create_stream()
        with profile.range("load weights"):
            w = npumem.from_numpy(np.ones((256, 256), np.float32), stream=stream)
        out = npumem.empty((256, 256), "float32", stream=stream)
        npumem.aclnn.run_with_pool_workspace(
            npumem.aclnn.matmul, npumem.aclnn.matmul_get_workspace_size(w, w, out), stream)
        stream.synchronize()
        profile.mark("step done")
    """))
    out = tmp_path / "prof"
    result = profile_run(["--stacks", "--", str(script)], out)
    assert result.exit_code == 0, result.output
    page = (out / "report.html").read_text()
    assert "<title>range load weights:" in page and "<title>mark step done at" in page
    assert "<title>op MatMul:" in page and ">thread 1</text>" in page and ">stream 1</text>" in page
    assert "<title>alloc 256.00 KiB at" in page and "steps.py:8 in &lt;module&gt;" in page


ZOOM_PROBE = """<script>
const svg = document.querySelector("svg.timeline");
const box = svg.getBoundingClientRect();
const x = (f) => box.left + box.width * f, y = box.top + box.height * 0.4;
svg.dispatchEvent(new MouseEvent("mousedown", {clientX: x(0.3), clientY: y, bubbles: true}));
svg.dispatchEvent(new MouseEvent("mousemove", {clientX: x(0.6), clientY: y, bubbles: true}));
window.dispatchEvent(new MouseEvent("mouseup", {clientX: x(0.6), clientY: y, bubbles: true}));
document.body.dataset.zoomed = svg.querySelector(".plot").getAttribute("transform");
svg.dispatchEvent(new MouseEvent("dblclick", {bubbles: true}));
document.body.dataset.reset = svg.querySelector(".plot").getAttribute("transform");
</script></body>"""


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed")
def test_dragging_across_the_timeline_zooms_in_and_a_double_click_zooms_out(tmp_path, script):
    import re

    out = tmp_path / "prof"
    profile_run(["--stacks", "--", str(script)], out)
    probe = out / "probe.html"
    probe.write_text((out / "report.html").read_text().replace("</body>", ZOOM_PROBE))
    dom = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'chromium'}", "--window-size=1280,900", "--dump-dom",
         probe.as_uri()], capture_output=True, text=True, timeout=120)
    zoomed = re.search(r'data-zoomed="matrix\(([\d.e+-]+) ', dom.stdout)
    assert zoomed and 2.5 < float(zoomed.group(1)) < 3.5, dom.stdout[-500:]     # a third of it
    assert 'data-reset="matrix(1 0 0 1 0 0)"' in dom.stdout


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
def test_the_report_script_is_valid_javascript(tmp_path):
    from npumem.profile.html import _MOMENTS, _ZOOM

    path = tmp_path / "report.js"
    path.write_text(_ZOOM + _MOMENTS)
    checked = subprocess.run(["node", "--check", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


def test_block_maps_at_moments_of_the_trace():
    from npumem.profile.fragmentation import maps_over_time

    mib = 1 << 20
    entries = [
        {"action": "segment_alloc", "addr": 0, "size": 2 * mib, "time_us": 0},
        {"action": "alloc", "addr": 0, "size": mib, "time_us": 1},
        {"action": "alloc", "addr": mib, "size": mib, "time_us": 2},            # the peak
        {"action": "free_requested", "addr": 0, "size": mib, "time_us": 3},
        {"action": "free_completed", "addr": 0, "size": mib, "time_us": 4},
        {"action": "segment_alloc", "addr": 8 * mib, "size": 2 * mib, "time_us": 5},
    ]
    snapshot = {"segments": [{"address": 0, "total_size": 2 * mib, "device": 0, "blocks": [
        {"address": 0, "size": mib, "state": "inactive"},
        {"address": mib, "size": mib, "state": "active_allocated"}]},
        {"address": 8 * mib, "total_size": 2 * mib, "device": 0, "blocks": [
            {"address": 8 * mib, "size": 2 * mib, "state": "inactive"}]}],
        "device_traces": [entries]}
    moments = maps_over_time(snapshot, 0, moments=6, also=2, width=4)
    by_time = {time_us: (allocated, maps) for time_us, allocated, maps in moments}
    assert by_time[0] == (0, [(0, 2 * mib, "....")])
    assert by_time[2] == (2 * mib, [(0, 2 * mib, "####")])
    assert by_time[3][1] == [(0, 2 * mib, "++##")]                   # freed, not yet reusable
    assert by_time[5] == (mib, [(0, 2 * mib, "..##"), (8 * mib, 2 * mib, "....")])


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed")
def test_the_block_map_slider_shows_each_moment(tmp_path):
    recorded = Path(__file__).parent / "data" / "cuda_snapshots" / "mlp.pickle.gz"
    page = tmp_path / "r.html"
    result = CliRunner().invoke(main, ["report", str(recorded), "--html", str(page)])
    assert result.exit_code == 0, result.output
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace("</body>", """<script>
const slider = document.querySelector("input.moment-slider");
document.body.dataset.peak = document.getElementById("moments-0-label").textContent;
slider.value = 0; slider.dispatchEvent(new Event("input"));
document.body.dataset.first = document.getElementById("moments-0-label").textContent;
</script></body>"""))
    dom = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'chromium'}", "--dump-dom", probe.as_uri()],
        capture_output=True, text=True, timeout=120)
    assert 'data-peak="at ' in dom.stdout and "111.23 MiB allocated" in dom.stdout, dom.stdout[-400:]
    assert 'data-first="at 0 us:' in dom.stdout and "(moment 1 of " in dom.stdout


def test_kernel_launches_show_their_ai_core_timelines(rt, tmp_path, monkeypatch):
    from npumem.profile.session import ProfileSession

    monkeypatch.setenv("NPUMEM_SIM_KERNELS", "tiled")
    session = ProfileSession().start()
    stream = npumem.create_stream()
    x = npumem.from_numpy(np.random.default_rng(0).random((16, 256)).astype(np.float32))
    out = npumem.empty((16, 256))
    npumem.aclnn.run_with_pool_workspace(
        npumem.aclnn.softmax, npumem.aclnn.softmax_get_workspace_size(x, -1, out), stream)
    stream.synchronize()
    session.stop()
    assert session.write(tmp_path, "kernels") == []
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    _check_trace_event_format(events)
    lanes = {e["args"]["name"] for e in events if e["ph"] == "M" and e.get("pid", 0) >= 1000
             and e["name"] == "thread_name"}
    assert {"core 0 MTE2", "core 0 Vector", "core 0 MTE3"} <= lanes
    assert "kernel softmax_rows" in (tmp_path / "summary.txt").read_text()
    html = (tmp_path / "report.html").read_text()
    assert "AI cores: kernel timelines (modelled)" in html and "core 0 Vector" in html
