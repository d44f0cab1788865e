"""What a demanding new user tripped on, trying issues 61, 62 and 63 from the README: each a
regression test of one fix (no timing assertions)."""

from __future__ import annotations

import gzip
import json
import os
import socket
import struct
import threading
import time
import urllib.error
import urllib.request

import pytest
from click.testing import CliRunner

from npumem.cli import main

DATA = os.path.join(os.path.dirname(__file__), "data")
GPT = os.path.join(DATA, "cuda_snapshots", "gpt_train.pickle.gz")
JSONL = os.path.join(DATA, "cpu_recordings", "mlp_12_steps.jsonl.gz")


def _one_line_refusal(result, folder) -> str:
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert not os.path.exists(folder)
    return lines[0]


# --- npumem profile: what is not a script ----------------------------------------------------

@pytest.mark.parametrize("kind", ["jsonl", "jsonl.gz", "json", "no-extension", "csv"])
def test_profile_refuses_a_recording_that_python_would_compile(tmp_path, kind):
    """A JSONL trace or a JSON snapshot is a dict literal to Python: it compiled, ran as a
    script and left an empty report ('0 leaked allocation(s)')."""
    line = json.dumps({"action": "alloc", "addr": 4096, "size": 512, "stream": 0}) + "\n"
    target = tmp_path / {"jsonl": "run.jsonl", "jsonl.gz": "run.jsonl.gz", "json": "snap.json",
                         "no-extension": "trace", "csv": "log.csv"}[kind]
    if kind == "jsonl.gz":
        target.write_bytes(gzip.compress(line.encode() * 3))
    elif kind == "json":
        target.write_text(json.dumps({"segments": [], "device_traces": [[]]}))
    elif kind == "csv":
        target.write_text("Thread,Time,Action,Pointer,Size,Stream\n1,2,allocate,0x1,8,0\n")
    else:
        target.write_text(line * 3)
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["profile", "--out", str(out), "--", str(target)])
    message = _one_line_refusal(result, out)
    assert message.startswith(f"error: {target} is a recording (")
    assert "not a script" in message and "npumem report" in message


def test_profile_still_runs_a_script_whose_first_line_is_a_string(tmp_path):
    script = tmp_path / "doc.py"
    script.write_text('"A docstring on one line, which is JSON too."\nprint("ran")\n')
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["profile", "--no-torch", "--out", str(out), "--",
                                       str(script)])
    assert result.exit_code == 0, result.output
    assert "ran" in result.output


def test_profile_refuses_a_gzip_file_that_is_not_a_recording(tmp_path):
    target = tmp_path / "blob.gz"
    target.write_bytes(gzip.compress(b"print(1)\n"))
    out = tmp_path / "out"
    message = _one_line_refusal(CliRunner().invoke(
        main, ["profile", "--out", str(out), "--", str(target)]), out)
    assert message == (f"error: {target} is gzip-compressed, not a Python script (if it is a "
                       "recording, npumem report, replay, tune and view read it)")


@pytest.mark.parametrize("option", ["--bogus", "--stack", "--bogus=3"])
def test_profile_names_an_option_it_does_not_have(tmp_path, option):
    """It said 'no such script: --bogus' (the option was taken for the script)."""
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["profile", "--out", str(out), option, "--", "train.py"])
    assert result.exit_code == 2, result.output
    name = option.partition("=")[0]
    assert f"No such option '{name}'" in result.output
    assert "no such script" not in result.output and not out.exists()


# --- npumem view's server ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def served():
    from npumem.view.api import App, open_sources
    from npumem.view.server import ViewServer, new_token

    token = new_token()
    server = ViewServer(("127.0.0.1", 0), App(open_sources([JSONL])), token)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}", token
    server.shutdown()
    server.server_close()


def _call(url, method="GET", data=None):
    request = urllib.request.Request(url, method=method, data=data)
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_a_connection_reset_between_requests_prints_nothing(served, capfd):
    """A browser that resets an idle keep-alive connection printed socketserver's
    'Exception occurred during processing of request' and a traceback in the terminal."""
    server, base, token = served
    host, port = server.server_address[:2]
    capfd.readouterr()
    for request in (b"", f"GET /api/info?token={token} HTTP/1.1\r\nHost: x\r\n\r\n".encode()):
        connection = socket.create_connection((host, port), timeout=30)
        if request:
            connection.sendall(request)
            assert connection.recv(12).startswith(b"HTTP/1.1 200")
        time.sleep(0.2)      # the server waits in readline for the next request line
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        connection.close()   # a reset, not a close
    assert _call(f"{base}/api/info?token={token}")[0] == 200    # the server goes on
    time.sleep(0.2)
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception occurred" not in err, err


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH", "OPTIONS"])
def test_other_methods_need_the_token_then_are_refused_in_json(served, method):
    """They were answered 501 in an HTML page, token or not."""
    _, base, token = served
    status, body = _call(f"{base}/api/info", method, b"{}")
    assert status == 403 and "token" in json.loads(body)["error"]
    status, body = _call(f"{base}/?token={token}", method, b"{}")
    assert status == 405 and "GET and POST" in json.loads(body)["error"]


def test_head_is_answered_as_get_without_a_body(served):
    _, base, token = served
    assert _call(f"{base}/api/info", "HEAD") == (403, b"")
    status, body = _call(f"{base}/?token={token}", "HEAD")
    assert status == 200 and body == b""


# --- a leak freed before the recording ended -------------------------------------------------

def test_a_leak_freed_when_the_run_ended_keeps_its_line():
    """A list of losses grows step over step and is let go when the script ends (estimate's
    predicted.pickle records that): the leak's JSON had file and line None, and its text said
    '(0 B live in 0 allocation(s))'."""
    from npumem.profile.leak_analysis import analyze_leaks
    from tests.test_step_evidence import entry, loop

    snapshot = loop(8, leak=4096, marks="ProfilerStep#0")
    trace = snapshot["device_traces"][0]
    kept = [e for e in trace if e["action"] == "alloc" and e["frames"][0]["line"] == 20]
    t = trace[-1]["time_us"] + 10
    for e in kept:                       # the script ends: its list goes
        trace += [entry("free_requested", e["addr"], e["size"], t),
                  entry("free_completed", e["addr"], e["size"], t)]
    leak, = analyze_leaks(snapshot).leaks
    data = leak.to_json()
    assert (data["file"], data["line"], data["function"]) == ("train.py", 20, "step")
    assert data["growth_per_step_bytes"] == 4096 and data["live_bytes"] == 0
    text = leak.describe()
    assert text.endswith("at train.py:20 in step (all of it freed before the recording ended)")
    assert "0 allocation(s)" not in text


@pytest.mark.parametrize("count, said", [(1, "only 1 allocation,"), (2, "only 2 allocations,")])
def test_too_few_allocations_for_steps_is_said_in_good_english(count, said):
    """It said '(only 1 allocations)' on RMM and msprof logs of one allocation."""
    from npumem.profile.step_inference import find_steps
    from tests.test_step_evidence import entry

    trace = [entry("alloc", 4096 * (k + 1), 512, k) for k in range(count)]
    reason = find_steps({"segments": [], "device_traces": [trace]}, 0).reason
    assert said in reason and "too few for a step to repeat 4 times" in reason


def test_whatif_on_an_oom_snapshot_keeps_tunes_verdict():
    """Where the run died, tune's table has verdicts, and so has the what-if (only a run that
    finished on no --memory trades them for the saving)."""
    from npumem.view.api import open_sources
    from npumem.view.whatif import _tune_verdict, check_setting

    oom = os.path.join(DATA, "cuda_oom_h200", "snapshots", "mlp", "116MiB_default.pickle.gz")
    source, = open_sources([oom])
    config = check_setting(source, "expandable_segments:True")
    verdict = _tune_verdict(source, config, "expandable_segments:True", lambda done: None)[0]
    assert verdict.startswith(("fits [", "OOM ")), verdict


@pytest.mark.parametrize("how", ["script", "module"])
def test_a_script_that_raises_shows_its_own_traceback_from_its_own_line(tmp_path, how):
    """The traceback began in npumem/profile/run.py's exec (and runpy's frames for -m), where
    `python train.py` shows only the script's frames."""
    import subprocess
    import sys

    (tmp_path / "boom.py").write_text("x = 1\nraise RuntimeError('boom')\n")
    target = ["--", "boom.py"] if how == "script" else ["-m", "boom"]
    done = subprocess.run([sys.executable, "-m", "npumem", "profile", "--no-torch", "--out",
                           str(tmp_path / "out"), *target], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    start = lines.index("Traceback (most recent call last):")
    assert lines[start + 1].startswith(f'  File "{tmp_path / "boom.py"}", line 2, in <module>')
    assert "RuntimeError: boom" in lines and "npumem" not in lines[start + 1]
    assert "runpy" not in done.stderr and "run_target" not in done.stderr


@pytest.mark.parametrize("verb", ["report", "view"])
def test_a_gz_name_on_a_file_that_is_not_gzip_is_said(tmp_path, verb):
    """It said 'unknown trace format' and listed the formats, of a file whose name promised
    gzip."""
    fake = tmp_path / "snap.pickle.gz"
    fake.write_text("hi\n")
    result = CliRunner().invoke(main, [verb, *(["--no-browser"] if verb == "view" else []),
                                       str(fake)])
    assert result.exit_code == 2
    assert result.output.strip() == (f"error: {fake}:1: named .gz but not gzip-compressed, and "
                                     "not a trace npumem reads either (a file renamed, or saved "
                                     "uncompressed under a .gz name?)")


def test_view_of_a_usage_curve_says_there_is_nothing_to_view():
    curve = os.path.join(DATA, "msprof", "worker0_20250101080000000_ascend_pt",
                         "ASCEND_PROFILER_OUTPUT", "memory_record.csv")
    result = CliRunner().invoke(main, ["view", "--no-browser", curve])
    assert result.exit_code == 2 and "nothing to replay, convert, diff or view" in result.output


# --- npumem report: options that did nothing --------------------------------------------------

MSPROF = os.path.join(DATA, "msprof", "worker0_20250101080000000_ascend_pt")


def test_report_json_of_an_ascend_profiler_folder_is_refused_not_text():
    """It printed the text report, exit 0, to a script that asked for JSON (a single
    operator_memory.csv was refused already)."""
    result = CliRunner().invoke(main, ["report", "--json", MSPROF])
    assert result.exit_code == 2
    assert "Invalid value for --json: reads snapshots and traces" in result.output
    assert "npumem report of" not in result.output


@pytest.mark.parametrize("path", [GPT, MSPROF])
def test_report_snapshot_without_memory_stats_is_refused(path):
    """--snapshot goes with a memory_stats file; anywhere else it was dropped silently."""
    result = CliRunner().invoke(main, ["report", path, "--snapshot", GPT])
    assert result.exit_code == 2
    assert (f"Invalid value for --snapshot: goes with a memory_stats JSON file (for the "
            f"fragmentation its totals lack); {path} is not one: drop --snapshot") in result.output


@pytest.mark.parametrize("path", [MSPROF, os.path.join(MSPROF, "ASCEND_PROFILER_OUTPUT",
                                                       "memory_record.csv")])
def test_report_device_on_what_is_reported_whole_is_refused(path):
    result = CliRunner().invoke(main, ["report", "--device", "0", path])
    assert result.exit_code == 2
    assert "Invalid value for --device:" in result.output and "reported whole" in result.output


def test_report_device_still_picks_a_snapshots_device():
    result = CliRunner().invoke(main, ["report", "--device", "0", GPT])
    assert result.exit_code == 0 and result.output.startswith("npumem report of")


def test_a_profiles_step_annotations_are_named_by_what_marked_them(tmp_path):
    """The page labelled a profile's steps 'npumem.memory.step (start)' where the report says
    they were marked by optimizer.step."""
    from npumem.view.api import open_sources
    from tests.test_step_evidence import entry

    trace = [entry("alloc", 4096 * (k + 1), 512, 10 * k) for k in range(6)]
    notes = [{"name": "npumem.memory.step", "stage": "START", "device": 0, "time_us": 10.0 * k,
              "source": "optimizer.step"} for k in range(3)]
    notes.append({"name": "npumem.memory.step", "stage": "START", "device": 0, "time_us": 35.0})
    path = tmp_path / "profiled.pickle"
    import pickle

    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [trace],
                                   "external_annotations": notes}))
    source, = open_sources([str(path)])
    labels = [note["label"] for note in source.info()["annotations"]]
    assert labels == ["optimizer.step (start)"] * 3 + ["npumem.memory.step (start)"]


def test_a_loop_of_one_tensor_an_iteration_is_told_how_to_mark_its_steps():
    """'no sequence of allocations repeats 4 times or more' was said of one allocation
    repeated hundreds of times (a step must hold 3 at least)."""
    from npumem.profile.step_inference import find_steps
    from tests.test_step_evidence import entry

    trace = [entry("alloc", 4096 * (k + 1), 4000, k) for k in range(50)]
    reason = find_steps({"segments": [], "device_traces": [trace]}, 0).reason
    assert "no sequence of 3 allocations or more repeats 4 times or more" in reason
    assert "npumem.memory.step()" in reason
