"""`npumem estimate` under a CUDA build of PyTorch (pip's default wheel) gives the answer it gives
under a CPU-only build, and its fake run never asks for the NVIDIA driver (native.py says how).

Opt-in: set NPUMEM_CUDA_TORCH_PYTHON to a Python whose torch is a CUDA build (its own venv; this
checkout's src is put on its PYTHONPATH), and run under a CPU-only torch:

    NPUMEM_CUDA_TORCH_PYTHON=/path/to/venv-cu/bin/python \
        python -m pytest tests/test_estimate_cuda_wheel.py

bench/estimate_cuda_wheel.py makes the same comparison over bench/estimate_workloads.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
CUDA_PYTHON = os.environ.get("NPUMEM_CUDA_TORCH_PYTHON", "")


def _cuda_build() -> str | None:
    """Why the comparison cannot run here, or None."""
    if not CUDA_PYTHON:
        return "set NPUMEM_CUDA_TORCH_PYTHON to a Python whose torch is a CUDA build to compare"
    if torch.version.cuda is not None:
        return "the comparison runs under a CPU-only torch; this one is a CUDA build"
    if shutil.which("g++") is None:
        return "estimate builds its stand-in device with g++, which is not on PATH"
    done = subprocess.run([CUDA_PYTHON, "-c", "import torch; print(torch.version.cuda)"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return f"NPUMEM_CUDA_TORCH_PYTHON={CUDA_PYTHON} cannot import torch"
    if done.stdout.strip() == "None":
        return f"NPUMEM_CUDA_TORCH_PYTHON={CUDA_PYTHON}'s torch is not a CUDA build"
    return None


pytestmark = pytest.mark.skipif(_cuda_build() is not None, reason=_cuda_build() or "")

SCRIPTS = {
    # AdamW on an MLP, a tensor made from data, a value read back, torch.cuda's figures
    "mlp": """
        import torch
        model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(),
                                    torch.nn.Linear(1024, 256)).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        labels = torch.tensor([0, 1, 2, 3], device="cuda")
        for _ in range(3):
            loss = model(torch.randn(64, 256, device="cuda")).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        print(loss.item(), torch.cuda.max_memory_allocated(), torch.cuda.memory_reserved())
    """,
    # fp16 autocast with GradScaler, attention (the fused kernel and, switched off, the math
    # path), a convolution and batch norm
    "amp_attention_conv": """
        import torch
        import torch.nn.functional as F
        conv = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1),
                                   torch.nn.BatchNorm2d(16)).cuda()
        proj = torch.nn.Linear(64, 64).cuda()
        opt = torch.optim.SGD([*conv.parameters(), *proj.parameters()], lr=0.1)
        scaler = torch.amp.GradScaler("cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            image = conv(torch.randn(4, 3, 32, 32, device="cuda")).mean()
            q = proj(torch.randn(2, 4, 128, 64, device="cuda"))
            fused = F.scaled_dot_product_attention(q, q, q, is_causal=True)
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
                math = F.scaled_dot_product_attention(q, q, q)
            loss = image + fused.float().mean() + math.float().mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    """,
}


def _estimate(python: str, script: str, tmp_path) -> dict:
    path = os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path, NPUMEM_ESTIMATE_DRIVER_CALLS=str(tmp_path / "driver_calls"))
    env.setdefault("NPUMEM_TORCH_VERSION", torch.__version__)   # the build compared, not the version
    done = subprocess.run([python, "-c", "from npumem.cli import main; main()", "estimate", "--json",
                           "--gpu", "h200", "--", script], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_cuda_build_estimates_as_a_cpu_build_does(tmp_path, name):
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(SCRIPTS[name]))
    cpu = _estimate(sys.executable, str(script), tmp_path)
    cuda = _estimate(CUDA_PYTHON, str(script), tmp_path)
    for key in ("peak_allocated_bytes", "peak_reserved_bytes", "recommended_peak_reserved_bytes"):
        assert cuda[key] == cpu[key], key
    assert cpu["peak_reserved_bytes"] > 0
    assert cuda["fake_run"]["attention"] == cpu["fake_run"]["attention"]
    assert (tmp_path / "driver_calls").read_text() == "0"      # written by the CUDA build's run
