"""`npumem profile` under real-world conditions: its folder as the input of diff, replay and
tune; NPUMEM_PROFILE=1 for a program that never imports npumem; -m; two runs given one folder;
a full disk; Ctrl-C."""

import errno
import importlib.metadata
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from npumem.cli import main
from npumem.errors import InvalidParamError
from npumem.output_files import LOCK_NAME, FolderInUseError, FolderLock
from npumem.profile import run as run_module
from npumem.profile import session as session_module
from npumem.profile.folder import OUTPUTS, profile_snapshot
from npumem.profile.session import ProfileSession

from .interrupting import interrupt

PLAIN = "data = [bytearray(1000) for _ in range(10)]\n"      # no torch, no npumem


def npumem_cli(*args, cwd=None, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "npumem", *args], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=timeout)


# --- the profile folder as an input ----------------------------------------------------------

@pytest.fixture(scope="module")
def torch_profiles(tmp_path_factory):
    """Two profiles of a torch script, the second one keeping more tensors."""
    pytest.importorskip("torch")
    folder = tmp_path_factory.mktemp("folders")
    made = []
    for name, steps in (("before", 2), ("after", 5)):
        script = folder / f"{name}.py"
        script.write_text(textwrap.dedent(f"""\
            import torch
            kept = []
            for _ in range({steps}):
                kept.append(torch.ones(4096))
        """))
        run = npumem_cli("profile", "--out", str(folder / name), "--", str(script))
        assert run.returncode == 0, run.stderr
        made.append(folder / name)
    return made


def test_diff_replay_and_tune_read_a_profile_folders_torch_snapshot(torch_profiles):
    before, after = torch_profiles
    runner = CliRunner()
    diff = runner.invoke(main, ["diff", str(before), str(after)])
    assert diff.exit_code == 0, diff.output
    assert "grew at 1 site(s)" in diff.output and "+48.00 KiB" in diff.output
    replay = runner.invoke(main, ["replay", str(after), "--json"])
    assert replay.exit_code == 0, replay.output
    assert str(after / "torch_snapshot.pickle") in replay.output
    check = runner.invoke(main, ["replay", "--check", str(after)])
    assert "torch_snapshot.pickle" in check.output and "Traceback" not in check.output
    assert "is a directory" not in check.output
    tune = runner.invoke(main, ["tune", str(after)])
    assert tune.exit_code == 0, tune.output
    assert "answer:" in tune.output


def test_a_folder_without_a_snapshot_is_one_line(tmp_path):
    runner = CliRunner()
    for args in (["diff", str(tmp_path), str(tmp_path)], ["replay", str(tmp_path)],
                 ["replay", "--check", str(tmp_path)], ["tune", str(tmp_path)]):
        result = runner.invoke(main, args)
        assert result.exit_code == 2, (args, result.output)
        assert result.output.strip().count("\n") == 0, result.output
        assert "torch_snapshot.pickle or snapshot.pickle" in result.output


def test_the_resolver_prefers_pytorchs_snapshot(tmp_path):
    (tmp_path / "snapshot.pickle").write_bytes(b"")
    assert profile_snapshot(tmp_path) == str(tmp_path / "snapshot.pickle")
    (tmp_path / "torch_snapshot.pickle").write_bytes(b"")
    assert profile_snapshot(tmp_path) == str(tmp_path / "torch_snapshot.pickle")
    assert profile_snapshot(tmp_path / "x.pickle") == str(tmp_path / "x.pickle")
    (tmp_path / "other").mkdir()
    with pytest.raises(InvalidParamError, match="without torch_snapshot.pickle"):
        profile_snapshot(tmp_path / "other")


# --- NPUMEM_PROFILE=1 --------------------------------------------------------------------------

def test_npumem_profile_variable_profiles_a_program_that_never_imports_npumem(tmp_path):
    assert any(str(f).endswith("npumem-profile.pth")
               for f in importlib.metadata.files("npumem") or ()), \
        "npumem-profile.pth is not installed: pip install -e . puts it in site-packages"
    script = tmp_path / "plain.py"
    script.write_text("import sys\n" + PLAIN + "print('npumem' in sys.modules)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NPUMEM_PROFILE")}
    quiet = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           env=env, timeout=60)
    assert quiet.stdout.strip() == "False" and not quiet.stderr     # unset: npumem not loaded
    out = tmp_path / "prof"
    env.update(NPUMEM_PROFILE="1", NPUMEM_PROFILE_OUT=str(out))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "True"                              # profiled from the start
    assert "Traceback" not in run.stderr
    assert f"wrote {out / 'report.html'}" in run.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUTS)
    pickle.loads((out / "snapshot.pickle").read_bytes())


def test_a_bad_npumem_profile_setting_is_one_line_and_the_program_runs(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text(PLAIN + "print('ran')\n")
    env = dict(os.environ, NPUMEM_PROFILE="1", NPUMEM_PROFILE_INTERVAL_MS="fast",
               NPUMEM_PROFILE_OUT=str(tmp_path / "prof"))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                         timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "ran"
    assert "npumem profile: not profiling:" in run.stderr and "Traceback" not in run.stderr


# --- -m ---------------------------------------------------------------------------------------

def test_dash_m_of_a_missing_module_is_one_line(tmp_path):
    for name, says in (("missing_module_xyz", "no module named 'missing_module_xyz'"),
                       ("missing_pkg_xyz.train", "no module named 'missing_pkg_xyz'")):
        run = npumem_cli("profile", "--out", str(tmp_path / "out" / name), "--", "-m", name,
                         cwd=tmp_path)
        assert run.returncode == 2, run.stderr
        assert says in run.stderr and "Traceback" not in run.stderr


def test_dash_m_runs_a_module_found_from_the_working_folder(tmp_path):
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text(PLAIN + "import sys\nprint('args', sys.argv[1:])\n"
                                      "sys.exit(3)\n")
    run = npumem_cli("profile", "--out", "prof", "--", "-m", "mypkg.train", "--epochs", "1",
                     cwd=tmp_path)
    assert run.returncode == 3, run.stderr
    assert "args ['--epochs', '1']" in run.stdout
    assert (tmp_path / "prof" / "report.html").exists()
    bare = npumem_cli("profile", "--out", "p2", "--", "-m", "mypkg", cwd=tmp_path)
    assert bare.returncode == 2 and "package without a __main__" in bare.stderr
    assert "Traceback" not in bare.stderr


# --- one run per folder; whole files -------------------------------------------------------------

def test_a_folder_another_run_writes_is_refused_naming_that_run(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text(PLAIN)
    out = tmp_path / "prof"
    out.mkdir()
    with FolderLock(out):
        for force in ([], ["--force"]):
            result = CliRunner().invoke(main, ["profile", "--out", str(out), *force, "--",
                                               str(script)])
            assert result.exit_code == 2, result.output
            assert f"being written by another run (pid {os.getpid()})" in result.output
        assert [p.name for p in out.iterdir()] == [LOCK_NAME]
    assert not out.exists() or not any(out.iterdir())               # released: the lock is gone
    done = CliRunner().invoke(main, ["profile", "--out", str(out), "--", str(script)])
    assert done.exit_code == 0 and sorted(p.name for p in out.iterdir()) == sorted(OUTPUTS)


def test_the_lock_of_a_dead_run_does_not_block(tmp_path):
    out = tmp_path / "prof"
    out.mkdir()
    (out / LOCK_NAME).write_text("999999\n")          # left by a killed run: nobody holds it
    lock = FolderLock(out).acquire()
    with pytest.raises(FolderInUseError) as refused:
        FolderLock(out).acquire()
    assert refused.value.pid == os.getpid()
    lock.release()
    assert not (out / LOCK_NAME).exists()


def test_runs_started_together_on_one_folder_leave_whole_files(tmp_path):
    script = tmp_path / "slow.py"
    script.write_text(PLAIN + "import time\ntime.sleep(2)\n")
    out = tmp_path / "prof"
    runs = [subprocess.Popen([sys.executable, "-m", "npumem", "profile", "--out", str(out), "--",
                              str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for _ in range(3)]
    results = [(run.wait(timeout=120), run.stderr.read()) for run in runs]
    for run in runs:
        run.stdout.close()
        run.stderr.close()
    assert sorted(code for code, _ in results) == [0, 2, 2], results
    for code, stderr in results:
        if code == 2:
            assert "being written by another run (pid" in stderr or "not empty" in stderr
            assert "Traceback" not in stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUTS)
    import csv
    import json
    json.loads((out / "trace.json").read_text())
    rows = list(csv.reader((out / "memory_record.csv").open()))
    assert rows and all(len(row) == len(rows[0]) for row in rows)


def _full_disk(monkeypatch, names_written):
    """Writers of trace.json and memory_record.csv that write part of their file, then find the
    disk full."""
    def writer(path, *args, **kwargs):
        names_written.append(Path(path).name)
        with open(path, "w") as out:
            out.write("half of a file")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(session_module, "write_chrome_trace", writer)
    monkeypatch.setattr(session_module, "write_memory_record", writer)


def test_a_full_disk_exits_non_zero_naming_the_incomplete_files(tmp_path, monkeypatch):
    script = tmp_path / "plain.py"
    script.write_text(PLAIN)
    out = tmp_path / "prof"
    assert CliRunner().invoke(main, ["profile", "--out", str(out), "--", str(script)]).exit_code == 0
    written = []
    _full_disk(monkeypatch, written)
    result = CliRunner().invoke(main, ["profile", "--force", "--out", str(out), "--",
                                       str(script)])
    assert result.exit_code == 1, result.output
    assert "incomplete: trace.json, memory_record.csv not written" in result.output
    assert "No space left on device" in result.output and "Traceback" not in result.output
    assert all(name.startswith(".npumem-partial-") for name in written), written  # never in place
    # neither a half file nor the older run's under their names; the others whole
    assert sorted(p.name for p in out.iterdir()) == sorted(
        set(OUTPUTS) - {"trace.json", "memory_record.csv"})
    pickle.loads((out / "snapshot.pickle").read_bytes())
    assert (out / "report.html").read_text().rstrip().endswith("</html>")


# --- Ctrl-C -------------------------------------------------------------------------------------

def test_ctrl_c_ends_the_run_within_5_s_keeping_the_snapshot(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        import torch
        model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
        for i in range(10 ** 9):
            model(torch.randn(16, 64)).sum().backward()
            if i == 20:
                print("running", flush=True)
    """))
    out = tmp_path / "prof"
    run = subprocess.Popen([sys.executable, "-m", "npumem", "profile", "--out", str(out), "--",
                            str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True,      # Ctrl-C as in a terminal, even if ignored here
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    code, stderr, took = interrupt(run, "running", signal.SIGINT, settle=2)  # some recording
    assert code == 130, stderr
    assert took < 5, f"{took:.1f} s from Ctrl-C to exit"
    assert "interrupted: kept torch_snapshot.pickle" in stderr and "Traceback" not in stderr
    snapshot = pickle.loads((out / "torch_snapshot.pickle").read_bytes())
    assert any(snapshot["device_traces"])
    assert sorted(p.name for p in out.iterdir()) == ["torch_snapshot.pickle"]   # reports skipped


def test_an_interrupted_run_saves_only_what_it_can_in_its_time(tmp_path, monkeypatch):
    def slow(snapshot, path):
        with open(path, "wb") as out:
            out.write(b"part")
            time.sleep(30)               # far longer than an interrupted run waits
            out.write(b"rest")

    import npumem

    monkeypatch.setattr(session_module, "save_snapshot", slow)
    npumem.init()
    npumem.set_device(0)
    session = ProfileSession(torch_memory=False).start()
    kept = npumem.zeros(1024)                 # npumem's runtime recorded something to save
    try:
        problems = session.write_interrupted(tmp_path, "interrupted", seconds=0.5)
    finally:
        del kept
        npumem.reset_device(0)
        npumem.finalize()
    assert session.incomplete == ["snapshot.pickle"] and session.written == []
    assert "an interrupted run waits" in problems[0]
    assert list(tmp_path.iterdir()) == []            # no part of a file is left


def test_ctrl_c_inside_npumems_own_code_is_raised_in_the_scripts():
    own = os.path.join(run_module._OWN_CODE, "recorder_frame.py")
    scope: dict = {}
    exec(compile("import sys\nframe = sys._getframe()", own, "exec"), scope)
    # Python's own handler, as a terminal gives it (a background job starts with SIGINT ignored,
    # which the profiler rightly keeps)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with run_module._interrupts_outside_npumem():
            handler = signal.getsignal(signal.SIGINT)
            handler(signal.SIGINT, scope["frame"])        # inside npumem: not raised there ...
            with pytest.raises(KeyboardInterrupt):          # ... but a moment later, here
                for _ in range(1000):
                    time.sleep(0.01)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_run_interrupted_before_it_recorded_anything_saves_nothing(tmp_path):
    session = ProfileSession(torch_memory=False).start()
    problems = session.write_interrupted(tmp_path, "interrupted at once")
    assert problems == [] and session.written == [] and list(tmp_path.iterdir()) == []


def test_a_target_that_is_not_there_leaves_no_folder(tmp_path):
    kept = tmp_path / "kept"
    kept.mkdir()                                 # a folder the user made stays
    for out, target in ((tmp_path / "new", ["missing.py"]), (tmp_path / "new2", ["-m", "nosuch"]),
                        (kept, ["missing.py"])):
        done = CliRunner().invoke(main, ["profile", "--out", str(out), "--", *target])
        assert done.exit_code == 2 and "Traceback" not in done.output
    assert not (tmp_path / "new").exists() and not (tmp_path / "new2").exists()
    assert kept.is_dir()
