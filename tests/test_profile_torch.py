"""PyTorch's own memory in `npumem profile` and `track()`: the CPU recording by the tensor
recorder (CI), and the hand-over to report, replay and tune. The cuda
recording runs in tests/test_torch_cuda.py on a GPU."""

import json
import pickle
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

from npumem import profile
from npumem.cli import main

SCRIPT = textwrap.dedent("""\
    import torch

    def build():
        return [torch.ones(128, 128) for _ in range(4)]

    def step(weights):
        x = torch.ones(32, 128)
        for w in weights:
            x = torch.relu(x @ w)
        return x.sum()

    weights = build()
    kept = []
    for _ in range(3):
        step(weights)
        kept.append(torch.empty(4096))          # grows every step: a planted leak
""")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# Where a GPU is, PyTorch's CUDA allocator is recorded instead (tests/test_torch_cuda.py).
cpu_recording = pytest.mark.skipif(_cuda_available(), reason="a GPU is recorded instead of the CPU")


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """`npumem profile` of a plain PyTorch script, in a fresh interpreter: torch is imported by
    the script, so recording starts through the import hook, as for a user."""
    pytest.importorskip("torch")
    folder = tmp_path_factory.mktemp("profile")
    script = folder / "train.py"
    script.write_text(SCRIPT)
    run = subprocess.run([sys.executable, "-m", "npumem", "profile", "--out", str(folder / "out"),
                          "--", str(script)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return folder / "out", run.stderr


@cpu_recording
def test_profile_of_a_plain_torch_script_records_torch_memory(profiled):
    out, stderr = profiled
    assert "PyTorch cpu:0 peak allocated" in stderr
    for name in ("torch_snapshot.pickle", "summary.txt", "report.html"):      # PyTorch's
        assert (out / name).stat().st_size > 0, name
    assert not (out / "snapshot.pickle").exists()       # the script never used npumem's runtime
    summary = (out / "summary.txt").read_text()
    assert summary.startswith("npumem profile of") and "PyTorch's cpu memory" in summary
    assert "train.py:9 in step" in summary                # sites: the user's lines
    assert "train.py:4 in build" in summary
    with open(out / "torch_snapshot.pickle", "rb") as handle:
        snapshot = pickle.load(handle)
    entries = snapshot["device_traces"][0]
    allocs = [e for e in entries if e["action"] == "alloc"]
    assert sum(1 for e in allocs if e["size"] == 128 * 128 * 4) >= 4       # the weights
    live = {}
    for e in entries:
        if e["action"] == "alloc":
            live[e["addr"]] = e
        elif e["action"] == "free_completed":
            live.pop(e["addr"], None)
    assert sum(1 for e in live.values() if e["size"] == 4096 * 4) == 3      # the planted leak


@cpu_recording
def test_report_replay_and_tune_take_the_torch_recording(profiled):
    out, _ = profiled
    runner = CliRunner()
    report = runner.invoke(main, ["report", str(out)])
    assert report.exit_code == 0 and "torch_snapshot.pickle" in report.output
    replay = runner.invoke(main, ["replay", str(out / "torch_snapshot.pickle"), "--allocator",
                                  "torch", "--json"])
    assert replay.exit_code == 0, replay.output
    assert json.loads(replay.output)[0]["device_allocs"] >= 1
    check = runner.invoke(main, ["replay", "--check", str(out / "torch_snapshot.pickle")])
    assert check.exit_code == 2 and "no caching-allocator segments" in check.output
    assert "Traceback" not in check.output
    tune = runner.invoke(main, ["tune", str(out / "torch_snapshot.pickle")])
    assert tune.exit_code == 0 and "no caching-allocator segments to compare" in tune.output


def test_no_torch_flag_and_scripts_without_torch_write_no_torch_files(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text("x = [0] * 1000\n")
    for flags in ([], ["--no-torch"]):
        out = tmp_path / f"out{len(flags)}"
        result = CliRunner().invoke(main, ["profile", "--out", str(out), *flags, "--", str(script)])
        assert result.exit_code == 0, result.output
        assert not (out / "torch_snapshot.pickle").exists()


@cpu_recording
def test_track_records_torch_cpu_memory_when_asked():
    torch = pytest.importorskip("torch")
    with profile.track(torch_memory=True) as tracker:
        kept = torch.ones(1000)
    snapshot = tracker.torch_snapshot()
    allocs = [e for e in snapshot["device_traces"][0] if e["action"] == "alloc"]
    assert any(e["size"] == 4000 and e["frames"] and
               e["frames"][0]["filename"].endswith("test_profile_torch.py") for e in allocs)
    assert kept.sum().item() == 1000
    with profile.track() as quiet:                      # by default no CPU profiler
        torch.ones(10)
    assert quiet.torch_snapshot() is None


@cpu_recording
def test_a_tracker_records_again_after_a_restart():
    torch = pytest.importorskip("torch")
    tracker = profile.track(torch_memory=True)
    for size in (1000, 3000):
        with tracker:
            kept = torch.ones(size)
        allocs = [e["size"] for e in tracker.torch_snapshot()["device_traces"][0]
                  if e["action"] == "alloc"]
        assert size * 4 in allocs and kept.numel() == size
