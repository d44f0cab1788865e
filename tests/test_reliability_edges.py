"""Bad input at the edges gets one clear line and loses nothing: sizes past what a planner can
count, paths that are not regular files, sizes that mean two things, switches set to values
npumem would not read as meant."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from npumem.cli import main
from npumem.environment_check import check_environment, problems
from npumem.errors import InvalidParamError
from npumem.units import parse_size

SNAPSHOT = os.path.join(os.path.dirname(__file__), "data", "cuda_snapshots", "mlp.pickle.gz")


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "npumem", *args], capture_output=True,
                          text=True, timeout=120, env=env)


@pytest.mark.parametrize("size", [2**64 - 1, 2**63 - 1, 2**48 + 1])
def test_plan_refuses_sizes_it_cannot_count(tmp_path, size):
    trace = tmp_path / "big.jsonl"
    trace.write_text(json.dumps({"action": "alloc", "addr": 4096, "size": size, "stream": 0,
                                 "t_us": 0}) + "\n")
    done = CliRunner().invoke(main, ["plan", str(trace)])
    assert done.exit_code == 2 and "at most 2**48" in done.output, done.output
    assert "Traceback" not in done.output


def test_paths_that_are_not_regular_files_say_what_they_are(tmp_path):
    folder = tmp_path / "x.json"
    folder.mkdir()
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    loop_a, loop_b = tmp_path / "a.json", tmp_path / "b.json"
    loop_a.symlink_to(loop_b)
    loop_b.symlink_to(loop_a)
    dangling = tmp_path / "gone.json"
    dangling.symlink_to(tmp_path / "nothing")
    cases = [(["report", str(fifo)], "is a pipe"), (["report", "/dev/zero"], "is a device"),
             (["report", str(loop_a)], "loops"), (["report", str(dangling)], "does not exist"),
             (["replay", str(fifo)], "is a pipe"), (["plan", str(fifo)], "is a pipe"),
             (["report", str(folder)], str(folder))]
    for args, words in cases:
        done = run(*args)                   # a real process: a FIFO must not block it
        assert done.returncode == 2 and words in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr


def test_ambiguous_sizes_are_refused_with_both_readings():
    with pytest.raises(ValueError, match="16GiB is 17,179,869,184 bytes.*16,000,000,000"):
        parse_size("16GB")
    assert parse_size("16GiB") == 16 << 30 and parse_size("4k") == 4096
    done = CliRunner().invoke(main, ["replay", SNAPSHOT, "--memory", "16GB"])
    assert done.exit_code == 2 and "ambiguous" in done.output


@pytest.mark.parametrize("args, words", [
    (["replay", SNAPSHOT, "--memory", "0"], "a device holds some memory"),
    (["tune", SNAPSHOT, "--memory", "0"], "a device holds some memory"),
    (["report", SNAPSHOT, "--top", "-1"], "-1 is not in the range"),
    (["tune", SNAPSHOT, "--allocator", "pool", "--scheduler", "foo"], "unknown scheduler"),
    (["tune", SNAPSHOT, "--scheduler", "foo"], "unknown scheduler"),     # PyTorch's settings
    (["replay", SNAPSHOT, "--scheduler", "foo"], "unknown scheduler"),
])
def test_options_out_of_range_are_one_line_errors(args, words):
    done = CliRunner().invoke(main, args)
    assert done.exit_code == 2 and words in done.output, done.output


@pytest.mark.parametrize("name, value, valid", [
    ("NPUMEM_SIM_PROFILE", "ascend310", "ascend910b"), ("NPUMEM_SIM_CORES", "0", "1 to 1024"),
    ("NPUMEM_STRICT", "yes", "0, 1"), ("NPUMEM_SANITIZE", "2", "0, 1"),
    ("NPUMEM_ACL_RET_FIRST", "maybe", "true"), ("NPUMEM_PROFILE_INTERVAL_MS", "abc", "a number"),
    ("NPUMEM_SIM_KERNELS", "fast", "numpy, tiled"), ("NPUMEM_MAX_SNAPSHOT_BYTES", "4GB", "4GiB"),
])
def test_switches_set_to_values_npumem_would_not_read_are_errors(name, value, valid):
    found = problems({name: value})
    assert len(found) == 1 and name in found[0] and valid in found[0]
    with pytest.raises(InvalidParamError, match=name):
        check_environment({name: value})
    done = run("demo", "--size", "16K", "--out", os.devnull + "-never",
               env=dict(os.environ, **{name: value}))
    assert done.returncode == 2 and f"error: {name}={value!r}" in done.stderr
    assert "Traceback" not in done.stderr


def test_good_switches_pass_and_init_checks_them(monkeypatch):
    assert problems({"NPUMEM_SIM_PROFILE": "ascend910", "NPUMEM_STRICT": "1",
                     "NPUMEM_PROFILE": "on", "NPUMEM_MAX_SNAPSHOT_BYTES": "8GiB"}) == []
    import npumem

    monkeypatch.setenv("NPUMEM_SANITIZE", "2")
    with pytest.raises(InvalidParamError, match="NPUMEM_SANITIZE='2': takes 0, 1"):
        npumem.init()
    monkeypatch.delenv("NPUMEM_SANITIZE")
    npumem.init()                          # nothing was left half-started
    npumem.finalize()


def test_a_small_file_of_shared_huge_stacks_costs_what_it_holds(tmp_path):
    import pickle

    frames = [{"filename": f"f{i}.py", "line": i, "name": "fn"} for i in range(20_000)]
    entries = []
    for i in range(2_000):
        entries += [{"action": action, "addr": 4096 * (i + 1), "size": 512, "stream": 0,
                     "time_us": i, "frames": frames}
                    for action in ("alloc", "free_requested", "free_completed")]
    source = tmp_path / "shared.pickle"
    source.write_bytes(pickle.dumps({"segments": [], "device_traces": [entries]}))
    report = CliRunner().invoke(main, ["report", str(source)])
    assert report.exit_code == 0 and "1 stack(s) had more than 256 frames" in report.output
    target = tmp_path / "shared.jsonl"
    converted = CliRunner().invoke(main, ["convert", str(source), str(target)])
    assert converted.exit_code == 0, converted.output
    assert target.stat().st_size < source.stat().st_size        # the stack is written once
    from npumem.trace.snapshot import load_data

    back = load_data(str(target))["device_traces"][0]
    assert len(back) == 6_000 and len(back[0]["frames"]) == 256
    assert back[0]["frames"] is back[-1]["frames"]              # still one list, shared
    assert back[0]["frames"][0] == frames[0]


def test_a_stack_reference_without_its_stack_is_refused(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"npumem_snapshot":1,"segments":[]}\n'
                    '{"device":0,"action":"alloc","addr":1,"size":2,"frames":{"npumem_stack":7}}\n')
    done = CliRunner().invoke(main, ["report", str(path)])
    assert done.exit_code == 2 and "stack 7, which no line before defines" in done.output


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".pickle", ".csv"])
def test_convert_never_exits_0_on_a_file_it_cannot_read_back(tmp_path, suffix):
    source = tmp_path / "header.csv"
    source.write_text("Thread,Time,Action,Pointer,Size,Stream\n")       # an RMM header only
    target = tmp_path / f"out{suffix}"
    done = CliRunner().invoke(main, ["convert", str(source), str(target)])
    if done.exit_code == 0:
        assert CliRunner().invoke(main, ["report", str(target)]).exit_code == 0
    else:
        assert done.exit_code == 2 and "nothing was written" in done.output
        assert not target.exists() and not list(tmp_path.glob("*.partial*"))


def test_the_demo_says_how_to_check_accesses_inside_the_pool_when_it_did_not():
    off = run("demo", "--size", "16K", env={k: v for k, v in os.environ.items()
                                             if k != "NPUMEM_SANITIZE"})
    assert off.returncode == 0 and "NPUMEM_SANITIZE=1 catches" in off.stdout
    on = run("demo", "--size", "16K", env=dict(os.environ, NPUMEM_SANITIZE="1"))
    assert on.returncode == 0 and "NPUMEM_SANITIZE" not in on.stdout


def test_report_of_one_device_of_a_snapshot(tmp_path):
    import gzip
    import pickle

    with gzip.open(SNAPSHOT) as handle:
        data = pickle.load(handle)
    two = {**data, "device_traces": [data["device_traces"][0], data["device_traces"][0]],
           "segments": data["segments"] + [{**s, "device": 1} for s in data["segments"]]}
    path = tmp_path / "two.pickle"
    path.write_bytes(pickle.dumps(two))
    both = CliRunner().invoke(main, ["report", str(path)])
    one = CliRunner().invoke(main, ["report", str(path), "--device", "1"])
    assert "device 0:" in both.output and "device 1:" in both.output
    assert "device 0:" not in one.output and "device 1:" in one.output
    missing = CliRunner().invoke(main, ["report", str(path), "--device", "3"])
    assert missing.exit_code == 2 and "its devices: 0, 1" in missing.output
