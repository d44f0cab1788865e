"""Predictive pre-allocation on every device backend: on the simulator (one expandable range
per stream) and on the torch backends (segments, as PyTorch's allocator has them), a plan
serves a training-style loop, no block's bytes are ever shared with another's, and the peak
reserved is no more than without prediction."""

import json
import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).with_name("predictive_on_device.py")


def _available(device: str) -> bool:
    if device == "sim":
        return True
    try:
        import torch
    except ImportError:
        return False
    return device == "torch:cpu" or torch.cuda.is_available()


def _run(device: str, *options: str) -> dict:
    done = subprocess.run([sys.executable, str(SCRIPT), device, *options], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("device", ["sim", "torch:cpu", "torch:cuda"])
def test_a_plan_serves_a_training_loop_and_keeps_every_blocks_bytes(device):
    if not _available(device):
        pytest.skip(f"{device} is not available here")
    result, without = _run(device), _run(device, "off")
    assert result["errors"] == 0 and without["errors"] == 0
    assert result["hits"] >= 4 * 41 and result["hit_rate"] == 1.0, result["note"]
    assert result["peak_reserved"] <= without["peak_reserved"]


@pytest.mark.parametrize("device", ["sim", "torch:cpu", "torch:cuda"])
def test_a_plan_serves_batches_of_varying_length_and_keeps_every_blocks_bytes(device):
    if not _available(device):
        pytest.skip(f"{device} is not available here")
    result, without = _run(device, "varying"), _run(device, "varying", "off")
    assert result["errors"] == 0 and without["errors"] == 0
    assert result["hits"] >= 6 * 41 and result["hit_rate"] >= 0.99, result["note"]
    assert result["peak_reserved"] <= without["peak_reserved"]


@pytest.mark.parametrize("device", ["sim", "torch:cpu", "torch:cuda"])
def test_a_temporary_the_step_did_not_foresee_keeps_every_blocks_bytes(device):
    """Marked steps, the ninth with a 1.9 MiB temporary kept for two requests: on the
    simulator it needs memory above the peak and the arena lends it a free run; on the torch
    backends the pool's segments hold it. Either way the plan serves on, no bytes are shared
    and the peak is no more than without prediction."""
    if not _available(device):
        pytest.skip(f"{device} is not available here")
    result, without = _run(device, "one-off"), _run(device, "one-off", "off")
    assert result["errors"] == 0 and without["errors"] == 0
    assert result["hit_rate"] >= 0.99, result["note"]
    assert result["lent"] or device != "sim"
    assert result["peak_reserved"] <= without["peak_reserved"]
