import pathlib
import pickle
import subprocess
import sys

import pytest

from click.testing import CliRunner

from npumem.cli import main


def test_demo_passes_and_cleans_up():
    result = CliRunner().invoke(main, ["demo", "--size", "64K"])
    assert result.exit_code == 0, result.output
    assert "Result verification: PASS" in result.output
    assert "live allocations left: 0" in result.output
    assert "[10/10]" in result.output
    assert "workspace 0 bytes" in result.output          # Add on contiguous tensors
    assert "non-contiguous view): phase 1 -> workspace 262144 bytes" in result.output


def test_demo_writes_a_snapshot(tmp_path):
    result = CliRunner().invoke(main, ["demo", "--size", "16K", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    with open(tmp_path / "snapshot.pickle", "rb") as f:
        snapshot = pickle.load(f)
    assert snapshot["segments"] and snapshot["segments"][0]["blocks"]
    actions = {entry["action"] for entry in snapshot["device_traces"][0]}
    assert {"alloc", "free_requested"} <= actions


def test_demo_rejects_bad_options():
    runner = CliRunner()
    assert runner.invoke(main, ["demo", "--size", "0"]).exit_code == 2
    bad_size = runner.invoke(main, ["demo", "--size", "lots"])
    assert bad_size.exit_code == 2 and "16GiB" in bad_size.output
    bad_device = runner.invoke(main, ["demo", "--device", "tpu"])
    assert bad_device.exit_code == 2 and "sim" in bad_device.output


def test_info_lists_memory(monkeypatch):
    monkeypatch.setenv("NPUMEM_SIM_MEMORY", "1GiB")
    result = CliRunner().invoke(main, ["info"])
    assert result.exit_code == 0
    assert "HBM_MEM " in result.output and "1.00 GiB free of 1.00 GiB" in result.output


def test_console_script_runs_the_demo():
    completed = subprocess.run([sys.executable, "-m", "npumem", "demo", "--size", "16K"],
                               capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert "Result verification: PASS" in completed.stdout


SNAPSHOT = "tests/data/cuda_snapshots/gpt_train.pickle.gz"


def _count_snapshot_reads(monkeypatch) -> list[str]:
    """The paths npumem reads snapshots from, in this process, from now on (load_data under
    both of its names: the package's, which load_snapshot calls, and its module's)."""
    from npumem.trace import snapshot
    from npumem.trace.snapshot import recording

    reads = []
    read = recording.load_data
    for module in (snapshot, recording):
        monkeypatch.setattr(module, "load_data", lambda path: reads.append(path) or read(path))
    return reads


@pytest.mark.parametrize("allocator", ["torch", "pool"])
def test_replay_reads_a_snapshot_once(monkeypatch, allocator):
    reads = _count_snapshot_reads(monkeypatch)
    result = CliRunner().invoke(main, ["replay", "--allocator", allocator, SNAPSHOT])
    assert result.exit_code == 0, result.output
    assert reads == [SNAPSHOT]


def test_a_pool_replay_of_a_run_that_died_says_its_oom_from_one_read(monkeypatch):
    from npumem.profile.oom import oom_lines
    from npumem.trace.snapshot import load_recording

    died = str(sorted(pathlib.Path("tests/data/cuda_oom_h200/snapshots").rglob("*.pickle*"))[0])
    expected = oom_lines(load_recording(died))
    reads = _count_snapshot_reads(monkeypatch)
    result = CliRunner().invoke(main, ["replay", "--allocator", "pool", died])
    assert result.exit_code == 0, result.output
    assert reads == [died] and f"{died}: " + "\n".join(expected) in result.output


def test_replay_of_a_run_that_died_says_its_oom_from_one_read_and_one_replay(monkeypatch):
    """The OOM lines come from the replay job (whatif.torch_replay.oom_facts): the file is read
    once, and replayed once under PyTorch's defaults; the lines are those oom_lines gives."""
    from npumem.profile.oom import oom_lines
    from npumem.trace.snapshot import load_recording
    from npumem.whatif import torch_replay

    died = sorted(pathlib.Path("tests/data/cuda_oom_h200/snapshots").rglob("*.pickle*"))[0]
    expected = oom_lines(load_recording(str(died)))
    assert expected
    reads = _count_snapshot_reads(monkeypatch)
    replays = []
    real = torch_replay.replay_recording
    monkeypatch.setattr(torch_replay, "replay_recording",
                        lambda *args, **kwargs: replays.append(1) or real(*args, **kwargs))
    result = CliRunner().invoke(main, ["replay", "--allocator", "torch", str(died)])
    assert result.exit_code == 0, result.output
    assert reads == [str(died)] and len(replays) == 1
    assert f"{died}: " + "\n".join(expected) in result.output


@pytest.mark.parametrize("target", ["copy.pickle", "events.csv", "events.json", "copy.jsonl"])
def test_convert_of_a_run_that_died_reads_it_once(monkeypatch, tmp_path, target):
    died = str(sorted(pathlib.Path("tests/data/cuda_oom_h200/snapshots").rglob("*.pickle*"))[0])
    reads = _count_snapshot_reads(monkeypatch)
    result = CliRunner().invoke(main, ["convert", died, str(tmp_path / target)])
    assert result.exit_code == 0, result.output
    assert reads == [died] and "out of memory" in result.output.lower()


def test_diff_reads_each_snapshot_once(monkeypatch):
    other = "tests/data/cuda_snapshots/mlp.pickle.gz"
    reads = _count_snapshot_reads(monkeypatch)
    result = CliRunner().invoke(main, ["diff", SNAPSHOT, other])
    assert result.exit_code == 0, result.output
    assert reads == [SNAPSHOT, other]


def test_verbs_share_helpers_through_common_only():
    """Each verb module imports `common` and `errors` (replay its own settings module too),
    never another verb: a helper two verbs need belongs in common."""
    import ast
    import pathlib

    import npumem.cli

    package = pathlib.Path(npumem.cli.__file__).parent
    own = {path.stem for path in package.glob("*.py")}
    allowed = {"common", "replay_settings", "errors"}
    for path in package.glob("*.py"):
        if path.stem in ("__init__", "common", "replay_settings", "errors"):
            continue
        taken = {node.module or alias.name for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.ImportFrom) and node.level == 1
                 for alias in node.names}
        assert taken & own <= allowed, f"{path.name} imports {sorted(taken & own - allowed)}"


def test_only_the_job_that_says_a_recorded_oom_replays_for_it(monkeypatch):
    """A sweep (or tune) of several settings on one snapshot: the recording's own OOM is worked
    out once, by the job that says it, not once per job."""
    from npumem.whatif import torch_replay
    from npumem.whatif.sweep import ReplayJob

    died = str(sorted(pathlib.Path("tests/data/cuda_oom_h200/snapshots").rglob("*.pickle*"))[0])
    replays = []
    real = torch_replay.replay_recording
    monkeypatch.setattr(torch_replay, "replay_recording",
                        lambda *args, **kwargs: replays.append(1) or real(*args, **kwargs))
    assert ReplayJob(died, "pool").run().recorded_oom is None and not replays
    assert ReplayJob(died, "pool", says_oom=True).run().recorded_oom["index"] >= 0
    assert len(replays) == 1


@pytest.mark.parametrize("allocators", ["pool,torch", "torch,pool"])
def test_a_died_run_is_replayed_once_under_the_defaults_whatever_the_allocator_order(
        monkeypatch, allocators):
    """The trace's torch job says its OOM (its replay is the one the OOM is told with): with
    the pool job first, the OOM was replayed again for the pool job."""
    from npumem.whatif import torch_replay
    path = sorted((pathlib.Path(__file__).parent / "data" / "cuda_oom_h200" / "snapshots"
                   / "gpt_train").glob("*default*.pickle.gz"))[0]
    made = []
    replay = torch_replay.replay_recording
    monkeypatch.setattr(torch_replay, "replay_recording",
                        lambda *a, **k: made.append(1) or replay(*a, **k))
    result = CliRunner().invoke(main, ["replay", "--allocator", allocators, "--scheduler",
                                       "serial", str(path)])
    assert result.exit_code == 0, result.output
    assert len(made) == 1 and "out of memory at trace entry" in result.output


def test_a_command_error_is_printed_once_by_the_group_with_its_exit_status():
    """Verbs raise CommandError; the group prints "error: ..." and exits with its status, and
    no verb prints an error and exits by itself."""
    import pathlib

    import click

    import npumem.cli
    from npumem.cli import main
    from npumem.cli.errors import CommandError

    @click.command("fails-for-test")
    def fails():
        raise CommandError("the file is empty", exit_code=3)

    main.add_command(fails)
    try:
        result = CliRunner().invoke(main, ["fails-for-test"])
    finally:
        main.commands.pop("fails-for-test")
    assert result.exit_code == 3
    assert result.output == "error: the file is empty\n"
    package = pathlib.Path(npumem.cli.__file__).parent
    for path in package.glob("*.py"):
        if path.stem != "__init__":
            assert "sys.exit(2)" not in path.read_text(), path.name
