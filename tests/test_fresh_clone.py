"""A new user on a fresh clone (issue 21, part 4): wrong settings, wrong sizes, missing files and
Ctrl-C end in one line, never a traceback; the benches run without ../shared."""

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "tests" / "data" / "cuda_snapshots"


def _npumem(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "npumem", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def _one_line_error(done, *words):
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    assert all(word in done.stderr for word in words), done.stderr


def test_bad_settings_and_sizes_are_one_line_errors():
    _one_line_error(_npumem("info", env={"NPUMEM_DEVICE": "foo"}), "unknown device backend 'foo'")
    _one_line_error(_npumem("info", env={"NPUMEM_SIM_MEMORY": "abc"}), "NPUMEM_SIM_MEMORY='abc'")
    _one_line_error(_npumem("demo", env={"NPUMEM_SIM_MEMORY": "16MiB"}),
                    "need about", "device 0 has 16.00 MiB free", "smaller --size")
    _one_line_error(_npumem("demo", "--size", "16GiB"), "of host memory", "smaller --size")
    _one_line_error(_npumem("demo", "--size", "xyz"), "--size")


def test_demo_sizes_are_elements_or_bytes():
    done = _npumem("demo", "--size", "64KiB")               # 16K float32 elements
    assert done.returncode == 0 and "16384 elements" in done.stdout, done.stdout + done.stderr


def test_a_missing_file_is_worded_one_way(tmp_path):
    missing = str(tmp_path / "nosuch")
    for args in (["report", missing + ".pickle"], ["report", missing + ".json"],
                 ["replay", missing + ".jsonl"], ["plan", missing + ".csv"],
                 ["convert", missing + ".jsonl", str(tmp_path / "x.json")],
                 ["diff", missing + ".pickle", missing + ".pickle"], ["tune", missing + ".pickle"]):
        done = _npumem(*args)
        _one_line_error(done)
        assert done.stderr.strip().endswith(": no such file"), (args, done.stderr)


def test_replay_out_of_memory_is_one_sentence_for_a_replay():
    """A what-if that runs out is a result (its row, and a line saying where and why), as the
    model of PyTorch's allocator says it; other rows of the command are kept."""
    done = _npumem("replay", str(BUNDLED / "mlp.pickle.gz"), "--allocator", "pool",
                   "--memory", "1MiB")
    assert done.returncode == 0 and not done.stderr, done.stderr
    said = [line for line in done.stdout.splitlines() if "out of memory" in line]
    assert len(said) == 1 and "of the 1.00 MiB device" in said[0], done.stdout
    assert "--memory sets the device" not in done.stdout        # (given: no hint about it)
    assert done.stdout.count("207001") == 0 and "batch size" not in done.stdout


def test_plot_refuses_a_name_it_would_not_honour(tmp_path):
    done = _npumem("replay", str(BUNDLED / "mlp.pickle.gz"), "--plot", str(tmp_path / "x.png"))
    assert done.returncode == 2 and "name the file .svg" in done.stderr
    assert not (tmp_path / "x.png").exists()


def _ctrl_c_delivered() -> None:
    """In the child: take SIGINT as a terminal does (a shell running us in the background
    ignores it, and an ignored SIGINT stays ignored across exec)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_stops_a_replay_sweep_at_once():
    traces = [str(BUNDLED / "gpt_generate.pickle.gz")] * 12          # minutes of replays
    child = subprocess.Popen([sys.executable, "-m", "npumem", "replay", *traces, "--allocator",
                              "pool,torch", "--sweep", "roundup_power2_divisions=1,2,4,8",
                              "--sweep", "garbage_collection_threshold=0.5,0.8"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=_ctrl_c_delivered)
    time.sleep(3)                         # the workers have started
    child.send_signal(signal.SIGINT)
    stopped = time.perf_counter()
    out, err = child.communicate(timeout=60)
    assert child.returncode == 130 and "interrupted" in err, (child.returncode, err)
    assert time.perf_counter() - stopped < 10        # not after the running replays (generous)


def test_progress_off_a_terminal_is_a_line_every_ten_seconds(monkeypatch):
    import io

    from npumem.progress import ProgressBar

    stream = io.StringIO()
    bar = ProgressBar(10, "replay", "replays", stream=stream)
    bar.update(1)
    assert stream.getvalue() == ""                   # too early
    bar._drawn -= ProgressBar.LOG_EVERY
    bar.update(5)
    assert stream.getvalue() == "replay [############............] 5/10 replays " + \
        stream.getvalue().split("replays ")[1]
    assert stream.getvalue().endswith("s\n") and "\r" not in stream.getvalue()


@pytest.mark.parametrize("bench, args", [("fragmentation.py", []),
                                         ("planner.py", ["--time-limit", "1", "--algorithms", "size"])])
def test_benches_run_without_shared(bench, args):
    code = ("import pathlib, runpy, sys\n"
            "sys.path.insert(0, 'bench')\n"
            "import defaults\n"
            "defaults.SHARED = pathlib.Path('/nonexistent')\n"
            f"sys.argv = [{bench!r}, *{args!r}]\n"
            f"runpy.run_path('bench/{bench}', run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "tests/data/cuda_snapshots" in done.stderr and "mlp.pickle.gz" in done.stdout
