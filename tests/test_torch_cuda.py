"""torch:cuda on a real GPU: what the conformance suites (which add torch:cuda where a GPU exists)
do not cover. Skipped, once, where there is no GPU."""

import numpy as np
import pytest
from click.testing import CliRunner

import npumem
from npumem import aclnn, ops
from npumem.cli import main

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]


@pytest.fixture
def cuda_rt():
    npumem.init(backend="torch:cuda")
    npumem.set_device(0)
    yield npumem


def test_memory_is_cuda_memory_and_streams_are_torch_streams(cuda_rt):
    pointer = npumem.malloc(1 << 20)
    allocation = npumem.get_backend().resolve(pointer, 1, "test").allocation
    assert allocation.buffer.is_cuda and npumem.native_pointer(pointer) == allocation.buffer.data_ptr()
    stream = npumem.create_stream()
    seen = {}
    stream.enqueue(lambda: seen.setdefault("stream", torch.cuda.current_stream()), "look")
    stream.synchronize()
    assert seen["stream"] != torch.cuda.default_stream()
    npumem.free(pointer)


def test_ops_and_dlpack_on_the_gpu(cuda_rt):
    x = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    a = ops.from_numpy(x)
    out = ops.empty((32, 32))
    aclnn.run_with_pool_workspace(aclnn.matmul, aclnn.matmul_get_workspace_size(a.t(), a, out))
    np.testing.assert_allclose(out.numpy(), x.T @ x, rtol=1e-4, atol=1e-3)
    view = torch.from_dlpack(out)
    assert view.is_cuda and view.shape == (32, 32)
    adopted = npumem.from_dlpack(torch.ones(8, device="cuda"))
    assert adopted.numpy().tolist() == [1.0] * 8


def test_custom_matmul_on_the_gpu(cuda_rt):
    from npumem.bridges.autograd import custom_matmul

    a = torch.randn(16, 8, device="cuda", dtype=torch.float64, requires_grad=True)
    b = torch.randn(8, 4, device="cuda", dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(custom_matmul, (a, b))


def test_demo_on_the_gpu():
    result = CliRunner().invoke(main, ["demo", "--device", "torch:cuda", "--size", "64K"])
    assert result.exit_code == 0, result.output


def test_malloc_host_is_page_locked_and_the_gpu_writes_it_in_place(cuda_rt):
    from npumem.runtime.hostmem import PINNED

    pinned = npumem.malloc_host(1 << 16)
    assert torch.from_numpy(PINNED.find(pinned).buffer).is_pinned()    # DMA, not a staged copy
    device = npumem.host_register(pinned + 4096, 4096)
    npumem.memset(device, 4096, 7, 4096)                 # a CUDA kernel writes the host bytes
    assert (PINNED.find(pinned).buffer[4096:8192] == 7).all()
    npumem.host_unregister(device)
    npumem.free_host(pinned)


def test_pinned_memory_is_shared_with_the_gpu_and_pageable_memory_refused(cuda_rt):
    with pytest.raises(npumem.errors.FeatureNotSupportedError, match="pageable"):
        npumem.from_dlpack(np.arange(4096, dtype=np.float32))
    source = torch.arange(4096, dtype=torch.float32).pin_memory()
    shared = npumem.from_dlpack(source)
    out = ops.empty((4096,))
    aclnn.run_with_pool_workspace(aclnn.mul, aclnn.mul_get_workspace_size(shared, shared, out))
    np.testing.assert_array_equal(out.numpy(), (source * source).numpy())   # read in place
    scratch = np.zeros(4096, dtype=np.float32)           # a pageable neighbour copies as before
    npumem.memcpy(scratch, scratch.nbytes, out.address, out.nbytes,
                  npumem.MemcpyKind.DEVICE_TO_HOST)
    assert scratch[3] == 9.0


CUDA_SCRIPT = """\
import torch

def step(x, w):
    return torch.relu(x @ w)

w = torch.randn(1024, 1024, device="cuda")
outs = [step(torch.randn(256, 1024, device="cuda"), w) for _ in range(5)]
del outs
torch.cuda.empty_cache()
kept = torch.empty(1 << 20, device="cuda")
"""


def test_profile_of_a_plain_cuda_script_records_the_caching_allocator(tmp_path):
    import pickle
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(CUDA_SCRIPT)
    run = subprocess.run([sys.executable, "-m", "npumem", "profile", "--out", str(tmp_path / "out"),
                          "--", str(script)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "PyTorch cuda:0 peak allocated" in run.stderr and "peak reserved" in run.stderr
    snapshot_path = tmp_path / "out" / "torch_snapshot.pickle"
    with open(snapshot_path, "rb") as handle:
        snapshot = pickle.load(handle)
    actions = {e["action"] for e in snapshot["device_traces"][0]}
    assert {"alloc", "segment_alloc", "segment_free"} <= actions      # empty_cache was seen
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "train.py:4 in step" in summary
    check = CliRunner().invoke(main, ["replay", "--check", str(snapshot_path)])
    assert check.exit_code == 0 and "MATCH" in check.output, check.output


def test_track_records_cuda_memory_by_default():
    from npumem import profile

    with profile.track() as tracker:
        kept = torch.empty(1 << 20, device="cuda")
    snapshot = tracker.torch_snapshot()
    assert any(e["action"] == "alloc" and e["size"] == 4 << 20
               for e in snapshot["device_traces"][0])
    del kept


def test_cupy_allocates_from_npumem_pool(cuda_rt):
    cupy = pytest.importorskip("cupy")
    import npumem.memory as mem
    from npumem.bridges.cupy import use_npumem_pool

    before = mem.memory_allocated()
    use_npumem_pool()
    try:
        x = cupy.arange(1 << 20, dtype=cupy.float32)
        assert mem.memory_allocated() >= before + (4 << 20)       # a block of npumem's pool
        assert float((x[:1000] * 2).sum()) == 999_000.0
        del x
        assert mem.memory_allocated() == before                    # back once CuPy let go
    finally:
        cupy.cuda.set_allocator(None)


def test_track_records_only_its_own_window():
    from npumem import profile

    with profile.track() as first:
        before = torch.empty(1 << 18, device="cuda")
    with profile.track() as second:
        pass                                             # nothing allocated in this window
    assert first.torch_snapshot() is not None and second.torch_snapshot() is None
    del before
