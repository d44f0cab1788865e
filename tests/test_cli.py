import pickle
import subprocess
import sys

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
