"""npumem view's server: the token, the routes and their answers, checked against what
`npumem report` and `npumem tune` say of the same files; every input kind; the command's
errors and Ctrl-C. (The page in a real browser: test_view_browser.py.)"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest
from click.testing import CliRunner

from npumem.cli import main
from npumem.profile.analysis import analyze_snapshot
from npumem.profile.report import build_report
from npumem.view.api import App, open_sources
from npumem.view.levels import BLOCK, Levels
from npumem.view.server import ViewServer, new_token

DATA = os.path.join(os.path.dirname(__file__), "data")
GPT = os.path.join(DATA, "cuda_snapshots", "gpt_train.pickle.gz")
OOM = os.path.join(DATA, "cuda_oom_h200", "snapshots", "mlp", "116MiB_default.pickle.gz")
JSONL = os.path.join(DATA, "cpu_recordings", "mlp_12_steps.jsonl.gz")
MSPROF = os.path.join(DATA, "msprof", "worker0_20250101080000000_ascend_pt")
SHARED = "/work/shared/data/snapshots"


# --- exact ranges -----------------------------------------------------------------------------

def test_levels_give_the_exact_min_and_max_of_every_range():
    rng = np.random.default_rng(62)
    for n in (1, 5, BLOCK - 1, BLOCK, 3 * BLOCK + 7, 5000):
        values = rng.integers(-10**9, 10**9, n).astype(np.int64)
        levels = Levels(values)
        starts = rng.integers(0, n, 300)
        stops = np.minimum(starts + rng.integers(1, n + 1, 300), n)
        starts = np.r_[starts, 0, n - 1]
        stops = np.r_[stops, n, n]
        low, high = levels.min_max(starts, stops)
        for s, e, lo, hi in zip(starts, stops, low, high):
            assert lo == values[s:e].min() and hi == values[s:e].max()


# --- a server over a real snapshot ------------------------------------------------------------

class Served:
    def __init__(self, paths):
        self.app = App(open_sources(paths))
        self.token = new_token()
        self.server = ViewServer(("127.0.0.1", 0), self.app, self.token)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"

    def call(self, route, token=True, body=None, headers=None):
        """(status, decoded JSON or bytes, response headers)."""
        url = self.base + route
        if token:
            url += ("&" if "?" in url else "?") + "token=" + self.token
        request = urllib.request.Request(url, data=None if body is None else json.dumps(
            body).encode(), headers=headers or {}, method="POST" if body is not None else "GET")
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                status, data, got = answer.status, answer.read(), answer.headers
        except urllib.error.HTTPError as exc:
            status, data, got = exc.code, exc.read(), exc.headers
        if got.get("Content-Type", "").startswith("application/json"):
            data = json.loads(data)
        return status, data, got

    def get(self, route):
        status, data, _ = self.call(route)
        assert status == 200, data
        return data

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def gpt():
    served = Served([GPT])
    yield served
    served.close()


def test_every_request_needs_the_token(gpt):
    for route in ("/", "/api/info", "/api/timeline", "/static/app.js", "/nowhere"):
        status, data, _ = gpt.call(route, token=False)
        assert status == 403 and "token" in data["error"]
    assert gpt.call("/api/info?token=wrong", token=False)[0] == 403
    assert gpt.call("/api/info", token=False, headers={"X-Npumem-Token": gpt.token})[0] == 200
    # opening the page sets a cookie that lets its own scripts load
    status, _, headers = gpt.call("/")
    assert status == 200
    cookie = headers["Set-Cookie"].split(";")[0]
    assert gpt.call("/api/info", token=False, headers={"Cookie": cookie})[0] == 200


def test_only_the_viewers_routes_answer(gpt):
    for route in ("/etc/passwd", "/static/../server.py", "/static/%2e%2e%2fserver.py",
                  "/static/", "/api/nope", "/static/API.md.bak", "/favicon.ico"):
        status, data, _ = gpt.call(route)
        assert status == 404, route
        assert set(data) == {"error"}
    assert gpt.call("/api/info", body={})[0] == 405


def test_info_and_timeline_match_the_report(gpt):
    info = gpt.get("/api/info")
    source = info["sources"][0]
    assert source["kind"] == "snapshot" and source["time_unit"] == "us"
    assert source["entries"] == 3646 and source["segments"] == 37
    assert source["t_min"] == 0 and source["t_max"] > 0
    device = analyze_snapshot(gpt.app.sources[0].data)[0]
    assert source["peak_allocated"] == device.peak_allocated
    assert source["peak_reserved"] == device.peak_reserved
    assert any(s["value"] == "expandable_segments:True" for s in info["settings"])
    line = gpt.get("/api/timeline?source=0&width=300")
    assert len(line["t"]) == 300 and len(line["allocated"]["max"]) == 300
    assert max(line["allocated"]["max"]) == device.peak_allocated
    assert max(line["reserved"]["max"]) == device.peak_reserved
    assert all(lo <= hi for lo, hi in zip(line["reserved"]["min"], line["reserved"]["max"]))
    assert all(r >= a for r, a in zip(line["reserved"]["max"], line["allocated"]["max"]))
    assert line["events_in_range"] == 3646
    assert line["segments_marks"] and {m["kind"] for m in line["segments_marks"]} <= {
        "map", "unmap"}
    # a zoom: never more buckets than asked (up to the cap), whatever the range
    zoom = gpt.get(f"/api/timeline?t0={source['t_max'] / 2}&t1={source['t_max'] / 2 + 50}"
                   "&width=100000")
    assert len(zoom["t"]) == 4000
    assert gpt.call("/api/timeline?t0=abc")[0] == 400
    assert gpt.call("/api/timeline?source=7")[0] == 404


def test_a_moment_adds_up_to_the_timeline(gpt):
    source = gpt.get("/api/info")["sources"][0]
    for share in (0.1, 0.5, 0.93):
        t = source["t_max"] * share
        moment = gpt.get(f"/api/moment?t={t}")
        # the level of the bucket that starts at t's entry is the moment's
        line = gpt.get(f"/api/timeline?t0={t}&t1={t + 1e-3}&width=1")
        entry = moment["entry"]
        series = gpt.app.sources[0].series
        assert moment["live_bytes"] == series.allocated.values[entry]
        assert line["allocated"]["max"][0] >= moment["live_bytes"]
        assert sum(row["bytes"] for row in moment["by_category"]) == moment["live_bytes"]
        assert moment["flame"]["bytes"] == moment["live_bytes"]
        assert sum(c["bytes"] for c in moment["flame"]["children"]) == moment["live_bytes"]
        reserved = sum(segment["size"] for segment in moment["segments"])
        assert reserved == series.reserved.values[entry]
        for segment in moment["segments"]:
            assert sum(block["size"] for block in segment["blocks"]) == segment["size"]
            offsets = [block["offset"] for block in segment["blocks"]]
            assert offsets == sorted(offsets)
        allocated = sum(block["size"] for segment in moment["segments"]
                        for block in segment["blocks"] if block["state"] == "allocated")
        assert allocated == moment["live_bytes"]


def test_the_peaks_moment_is_the_reports():
    from npumem.profile.analysis import by_category, live_after, start_of
    from npumem.trace.snapshot.schema import check_snapshot

    entries, t = [], 0
    for step in range(4):
        for slot, (kind, size, asked) in enumerate((("parameter", 1024, 1000),
                                                    ("activation", 512, 300),
                                                    ("temporary", 512, 50))):
            t += 1
            entries.append({"action": "alloc", "addr": (1 << 20) + (step << 12) + (slot << 10),
                            "size": size, "requested_size": asked, "stream": 0, "time_us": t,
                            "category": kind})
        t += 1                                   # the temporary dies within its step
        entries.append({"action": "free_requested", "addr": (1 << 20) + (step << 12) + (2 << 10),
                        "size": 512, "stream": 0, "time_us": t})
    data = check_snapshot({"segments": [], "device_traces": [entries]}, "made")
    from npumem.view.source import Source
    from npumem.view.sources import Loaded
    from npumem.view.moment import moment

    source = Source(0, Loaded("made", "made", "snapshot", data))
    info = source.info()
    device = analyze_snapshot(data)[0]
    assert info["peak_entry"] == device.peak_entry
    at_peak = moment(source, info["peak_t"])
    assert at_peak["live_bytes"] == device.peak_allocated
    expected = by_category(live_after(start_of(data, 0)[0], data["device_traces"][0],
                                      device.peak_entry))
    assert {row["name"]: row["requested"] for row in at_peak["by_category"]} == expected
    assert expected == device.peak_categories


def test_a_flame_starts_at_the_users_line(gpt):
    moment = gpt.get(f"/api/moment?t={gpt.get('/api/info')['sources'][0]['t_max']}")
    names = [child["name"] for child in moment["flame"]["children"]]
    assert "allocated before the trace began" in names
    assert any(name.startswith(("/work/main/bench/record_workloads.py", "bench/")) or
               "record_workloads.py" in name for name in names)


def test_an_allocation(gpt):
    moment = gpt.get("/api/moment?t=50000")
    block = next(b for s in moment["segments"] for b in s["blocks"] if b["alloc_id"] is not None)
    one = gpt.get(f"/api/allocation?id={block['alloc_id']}")
    assert one["size"] == block["size"] and one["t_alloc"] <= 50000
    assert one["t_free"] is None or one["t_free"] > 50000
    assert one["stack"] and {"file", "line", "name"} <= set(one["stack"][0])
    for wrong in (0, -5, 10**9):                     # a segment entry, none at all
        assert gpt.call(f"/api/allocation?id={wrong}")[0] == 404
    assert gpt.call("/api/allocation")[0] == 400


def test_whatif_replays_with_tunes_verdict(gpt):
    status, data, _ = gpt.call("/api/whatif", body={"source": 0, "setting": "bogus_key:1"})
    assert status == 400 and "unknown key 'bogus_key'" in data["error"]
    assert gpt.call("/api/whatif", body={"setting": 3})[0] == 400
    job = gpt.get_post = gpt.call("/api/whatif", body={"source": 0,
                                                       "setting": "expandable_segments:True"})
    assert job[0] == 200
    name = job[1]["job"]
    state = _finished(gpt, name)
    assert state["error"] is None and state["progress"] == 1
    result = state["result"]
    from npumem.whatif.torch_tune import tune_recording

    tuning = tune_recording(gpt.app.sources[0].recording,
                            candidates=("", "expandable_segments:True"), workers=1)
    chosen = next(c for c in tuning.candidates
                  if c.config.describe() == "expandable_segments:True")
    # a run that finished, judged on no device size: what the setting saves, as tune's table
    # says ("fits [recorded]" would mean nothing; it was said here until tune stopped saying it)
    from npumem.units import format_size

    saving = (tuning.recorded.decisive.peak_reserved_bytes
              - chosen.decisive.peak_reserved_bytes)
    assert saving >= 0 and all(c.finishes for c in tuning.candidates)
    assert result["verdict"] == f"saves {format_size(saving)} against the recorded settings"
    assert result["peak_reserved"] == chosen.decisive.peak_reserved_bytes
    assert max(result["reserved"]) == result["peak_reserved"]
    assert len(result["t"]) == len(result["reserved"])
    assert gpt.call("/api/job?id=nope")[0] == 404


def _finished(served, name):
    import time
    for _ in range(600):
        state = served.get(f"/api/job?id={name}")
        if state["done"]:
            return state
        time.sleep(0.05)
    raise AssertionError("the what-if job did not finish")


def test_leaks_are_the_reports(gpt):
    leaks = gpt.get("/api/leaks")
    report = build_report(gpt.app.sources[0].data, "r")
    assert leaks["heading"] == report.leak_heading
    assert leaks["steps"]["count"] == len(leaks["steps"]["t"])
    info = gpt.get("/api/info")["sources"][0]           # the analysis is done now
    assert not info["steps_pending"] and len(info["steps"]) == leaks["steps"]["count"]
    assert gpt.get("/api/host") == {"host": False}


# --- every input kind ---------------------------------------------------------------------------

def test_every_input_kind(tmp_path):
    from npumem.trace.snapshot import load_snapshot, save

    folder = tmp_path / "run"
    folder.mkdir()
    data = load_snapshot(GPT)
    save(data, str(folder / "torch_snapshot.pickle"))
    predicted = dict(data, npumem={"source": "npumem estimate (test)"})
    save(predicted, str(tmp_path / "predicted.pickle"))
    kinds = {}
    for path in (str(folder), str(tmp_path / "predicted.pickle"), JSONL, MSPROF, OOM):
        app = App(open_sources([path]))
        info = app.info({}, None)["sources"][0]
        kinds[path] = info["kind"]
        line = app.timeline({"width": "50"}, None)
        assert max(line["allocated"]["max"]) == info["peak_allocated"] > 0
        app.moment({"t": str(info["t_max"])}, None)
    assert list(kinds.values()) == ["profile", "predicted", "jsonl", "msprof", "snapshot"]
    usage = App(open_sources([MSPROF])).usage({}, None)          # msprof's own totals too
    assert {"PTA", "GE", "APP"} <= {curve["component"] for curve in usage["curves"]}
    assert App(open_sources([JSONL])).usage({}, None)["curves"] == []


def test_an_oom_snapshot_marks_and_explains_it():
    app = App(open_sources([OOM]))
    source = app.sources[0]
    info = app.info({}, None)["sources"][0]
    assert info["oom"]["entry"] == 111 and "out of memory" in info["oom"]["message"]
    assert info["oom"]["t"] == info["t_max"] and info["oom"]["explanation_pending"]
    from npumem.view.panels import analyze_later
    analyze_later(source)
    import time
    for _ in range(600):
        if source.extras.get("oom_explanation") is not None:
            break
        time.sleep(0.05)
    explained = app.info({}, None)["sources"][0]["oom"]
    assert not explained["explanation_pending"]
    report = build_report(source.data, source.loaded.file)
    assert explained["explanation"] == "\n".join(report.oom)


def test_two_runs_share_one_axis():
    app = App(open_sources([GPT, OOM]))
    info = app.info({}, None)
    assert info["aligned"] == "start"
    assert [s["t_min"] for s in info["sources"]] == [0, 0]
    assert app.timeline({"source": "1", "width": "20"}, None)["source"] == 1
    mixed = App(open_sources([GPT, JSONL]))      # both timed: still by time
    assert mixed.info({}, None)["aligned"] == "start"
    # what grew between them: npumem diff's own lines
    printed = CliRunner().invoke(main, ["diff", GPT, OOM, "--top", "5"]).output
    assert "\n".join(app.diff({"top": "5"}, None)["lines"]) in printed


def test_categories_are_stacked():
    from npumem.trace.snapshot.schema import check_snapshot

    entries, t = [], 0
    for step in range(3):
        for kind, size in (("parameter", 1000), ("activation", 300), ("temporary", 50)):
            t += 1
            entries.append({"action": "alloc", "addr": 10_000 * step + size, "size": size,
                            "stream": 0, "time_us": t, "category": kind})
        t += 1
        entries.append({"action": "free_requested", "addr": 10_000 * step + 50, "size": 50,
                        "stream": 0, "time_us": t})
    data = check_snapshot({"segments": [], "device_traces": [entries]}, "made")
    from npumem.view.source import Source
    from npumem.view.sources import Loaded
    from npumem.view.aggregate import timeline

    source = Source(0, Loaded("made", "made", "snapshot", data))
    assert sorted(source.info()["categories"]) == ["activation", "parameter", "temporary"]
    line = timeline(source, None, None, 12)
    assert max(line["by_category"]["parameter"]) == 3000
    assert max(line["by_category"]["temporary"]) == 50
    from npumem.view.moment import moment
    at_end = moment(source, float(t))
    assert {row["name"]: row["bytes"] for row in at_end["by_category"]} == {
        "parameter": 3000, "activation": 900}


@pytest.mark.parametrize("name", ["eor_snapshot.pickle", "cs336_logs_ctx128_forward.pickle"])
def test_real_snapshots(name):
    path = os.path.join(SHARED, name)
    if not os.path.exists(path):
        pytest.skip(f"{path} is not on this machine")
    app = App(open_sources([path]))
    info = app.info({}, None)["sources"][0]
    device = analyze_snapshot(app.sources[0].data)[info["device"]]
    assert info["peak_allocated"] == device.peak_allocated
    assert info["peak_reserved"] == device.peak_reserved
    moment = app.moment({"t": str(info["t_max"] / 2)}, None)
    assert moment["live_bytes"] == app.sources[0].series.allocated.values[moment["entry"]]


# --- the command --------------------------------------------------------------------------------

def test_bad_paths_and_files_end_in_one_line(tmp_path):
    runner = CliRunner()
    result = runner.invoke(main, ["view", str(tmp_path / "missing.pickle"), "--no-browser"])
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert result.output.startswith("error: ")
    broken = tmp_path / "broken.pickle"
    with open(GPT, "rb") as whole:
        import gzip
        broken.write_bytes(gzip.decompress(whole.read())[:5000])
    result = runner.invoke(main, ["view", str(broken), "--no-browser"])
    assert result.exit_code == 2 and result.output.startswith("error: ")
    assert "Traceback" not in result.output


def test_a_port_in_use_ends_in_one_line():
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        result = CliRunner().invoke(main, ["view", GPT, "--no-browser", "--port",
                                           str(taken.getsockname()[1])])
    finally:
        taken.close()
    assert result.exit_code == 2
    assert result.output.startswith("error: cannot serve on 127.0.0.1:")


def test_serving_line_and_ctrl_c(tmp_path):
    process = subprocess.Popen([sys.executable, "-m", "npumem", "view", GPT, "--no-browser"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = process.stdout.readline()
        assert first.startswith(f"serving {GPT} at http://127.0.0.1:")
        address = first.split(" at ", 1)[1].strip()
        assert "/?token=" in address
        with urllib.request.urlopen(address.replace("/?", "/api/info?"), timeout=30) as answer:
            assert json.loads(answer.read())["sources"][0]["entries"] == 3646
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0
    assert out.strip() == "stopped" and "Traceback" not in err



def test_a_damaged_recording_is_refused_in_one_line(tmp_path):
    from npumem.trace.snapshot import save

    entries = [{"action": "alloc", "addr": 4096, "size": 1 << 60, "stream": 0, "time_us": 1},
               {"action": "free_requested", "addr": 4096, "size": 1 << 60, "stream": 0,
                "time_us": 2}]
    path = tmp_path / "made_up.pickle"
    save({"segments": [], "device_traces": [entries]}, str(path))
    result = CliRunner().invoke(main, ["view", str(path), "--no-browser"])
    assert result.exit_code == 2 and result.output.startswith("error: ")
    assert "more than any device holds" in result.output and "Traceback" not in result.output


def test_a_device_the_snapshot_lacks_is_named():
    result = CliRunner().invoke(main, ["view", GPT, "--device", "3", "--no-browser"])
    assert result.exit_code == 2
    assert result.output.startswith("error: ") and "no device 3" in result.output


def test_pinned_host_memory_as_read(tmp_path):
    from npumem.trace.snapshot import load_snapshot, save

    data = load_snapshot(GPT)
    start = int(data["device_traces"][0][0]["time_us"])
    # 2.14.1's shape (docs/formats.md, "Pinned host memory"): one segment per pinned allocation
    # with the device segment's keys and one block; one flat list of device-shaped entries
    data["host_segments"] = [
        {"device": 0, "address": (1 << 40) + i * (1 << 20), "total_size": 1 << 20,
         "allocated_size": 1 << 20, "active_size": 1 << 20, "requested_size": 1 << 20,
         "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
         "frames": [], "blocks": [{"address": (1 << 40) + i * (1 << 20), "size": 1 << 20,
                                   "requested_size": 1 << 20, "state": "active_allocated",
                                   "frames": []}]} for i in (1, 2)]
    data["host_traces"] = [
        {"action": action, "addr": (1 << 40) + i * (1 << 20), "size": 1 << 20, "stream": 0,
         "time_us": start + when, "compile_context": "N/A", "user_metadata": ""}
        for action, i, when in [("alloc", 0, 0), ("alloc", 1, 1000), ("alloc", 2, 2000),
                                ("free_requested", 0, 5000)]]
    path = tmp_path / "pinned.pickle"
    save(data, str(path))
    app = App(open_sources([str(path)]))
    assert app.info({}, None)["sources"][0]["host"]
    host = app.host({}, None)
    assert host["host"] and host["segment_count"] == 2 and host["reserved"] == 2 << 20
    assert [s["allocated"] for s in host["segments"]] == [1 << 20, 1 << 20]
    assert host["timeline"]["allocated"] == [1 << 20, 2 << 20, 3 << 20, 2 << 20]
    assert host["timeline"]["t"] == [0.0, 1000.0, 2000.0, 5000.0]
    # a damaged time (NaN, inf) is placed by its entry number: the answer stays valid JSON
    data["host_traces"][1]["time_us"] = float("nan")
    data["host_traces"][2]["time_us"] = float("inf")
    save(data, str(path))
    times = App(open_sources([str(path)])).host({}, None)["timeline"]["t"]
    assert times == [0.0, 1, 2, 5000.0]
    json.dumps(times, allow_nan=False)


def test_a_growing_site_is_the_reports_leak():
    from npumem.trace.snapshot.schema import check_snapshot
    from npumem.view.source import Source
    from npumem.view.sources import Loaded
    from npumem.view.panels import leaks

    kept = [{"filename": "/home/user/train.py", "line": 42, "name": "step"}]
    temporary = [{"filename": "/home/user/train.py", "line": 30, "name": "step"}]
    entries, notes, t = [], [], 0
    for step in range(12):
        t += 1
        notes.append({"name": "npumem.memory.step", "stage": "START", "time_us": t, "device": 0})
        for at, frames, size in (((2 << 30) + step * 4096, kept, 4096),
                                 ((1 << 30), temporary, 1 << 20)):
            t += 1
            entries.append({"action": "alloc", "addr": at, "size": size, "stream": 0,
                            "time_us": t, "frames": frames})
        t += 1
        entries.append({"action": "free_requested", "addr": 1 << 30, "size": 1 << 20,
                        "stream": 0, "time_us": t, "frames": temporary})
    data = check_snapshot({"segments": [], "device_traces": [entries],
                           "external_annotations": notes}, "made")
    source = Source(0, Loaded("made", "made", "snapshot", data))
    answer = leaks(source)
    report = build_report(data, "made")
    assert answer["heading"] == report.leak_heading == "Leaks: growing step over step"
    assert [row["where"] for row in answer["growing"]] == [
        leak.where for leak in report.step_leaks] == ["/home/user/train.py:42 in step"]
    assert answer["growing"][0]["describe"] == report.step_leaks[0].describe()
    assert answer["steps"]["source"] == "marked" and answer["steps"]["count"] == 12
    assert len(source.info()["steps"]) == 12
