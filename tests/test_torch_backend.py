"""The torch backend on cpu: choosing it, its limits and errors, and the bridges to PyTorch
(DLPack both ways, CustomMatMul, PyTorch's allocator state, the CuPy hook). The shared contract
is in the conformance suites; this file covers what only the torch backend does."""

import json
import pickle
import sys
import types

import numpy as np
import pytest
from click.testing import CliRunner

import npumem
import npumem.memory as mem
from npumem import aclnn, ops
from npumem.cli import main
from npumem.errors import (
    FeatureNotSupportedError, InvalidParamError, MemoryAllocationError, OpParamError,
)
from npumem.units import MiB

torch = pytest.importorskip("torch")

from npumem.device.torch_backend import TorchBackend  # noqa: E402 - after the torch check


@pytest.fixture
def trt():
    npumem.init(backend=TorchBackend("cpu", devices=2, memory=64 * MiB))
    npumem.set_device(0)
    yield npumem


# --- choosing the backend -------------------------------------------------------------------


def test_backend_by_name_environment_and_set_backend(monkeypatch):
    monkeypatch.setenv("NPUMEM_DEVICE", "torch:cpu")
    npumem.init()
    assert npumem.get_backend().name == "torch:cpu"
    with pytest.raises(InvalidParamError, match="finalize"):
        npumem.set_backend("sim")
    npumem.finalize()
    npumem.set_backend("sim")                       # beats the environment
    npumem.init()
    assert npumem.get_backend().name == "sim"
    npumem.finalize()
    with pytest.raises(InvalidParamError, match="torch:cuda, torch:npu"):
        npumem.set_backend("tpu")
    monkeypatch.setenv("NPUMEM_DEVICE", "gpu")
    npumem.RUNTIME.next_backend = None
    with pytest.raises(InvalidParamError, match="'gpu'"):
        npumem.init()
    assert not npumem.is_initialized()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_says_so():
    with pytest.raises(FeatureNotSupportedError, match="no cuda device"):
        npumem.init(backend="torch:cuda")
    assert not npumem.is_initialized()


def test_demo_on_torch_cpu():
    result = CliRunner().invoke(main, ["demo", "--device", "torch:cpu", "--size", "16K"])
    assert result.exit_code == 0, result.output
    assert "torch:cpu backend" in result.output and "Result verification: PASS" in result.output
    assert "live allocations left: 0" in result.output


def test_bad_limits_are_refused(monkeypatch):
    monkeypatch.setenv("NPUMEM_TORCH_MEMORY", "lots")
    with pytest.raises(InvalidParamError, match="NPUMEM_TORCH_MEMORY"):
        TorchBackend("cpu")
    monkeypatch.delenv("NPUMEM_TORCH_MEMORY")
    monkeypatch.setenv("NPUMEM_TORCH_DEVICES", "two")
    with pytest.raises(InvalidParamError, match="NPUMEM_TORCH_DEVICES"):
        TorchBackend("cpu")
    monkeypatch.delenv("NPUMEM_TORCH_DEVICES")
    with pytest.raises(InvalidParamError, match="positive"):
        TorchBackend("cpu", memory=-1)
    with pytest.raises(InvalidParamError, match="cpu, cuda, npu"):
        TorchBackend("tpu")


# --- memory ---------------------------------------------------------------------------------


def test_out_of_memory_names_the_numbers_and_loses_nothing(trt):
    kept = npumem.malloc(40 * MiB)
    npumem.memset(kept, 64, 7, 64)
    with pytest.raises(MemoryAllocationError) as info:
        npumem.malloc(30 * MiB)
    message = str(info.value)
    assert "torch:cpu device 0" in message and "64.00 MiB limit" in message
    assert "NPUMEM_TORCH_MEMORY" in message
    out = bytearray(64)
    npumem.memcpy(out, 64, kept, 64, npumem.MemcpyKind.DEVICE_TO_HOST)
    assert out == bytes([7]) * 64
    npumem.free(kept)
    npumem.free(npumem.malloc(60 * MiB))            # the failure took nothing


def test_device_memory_is_torch_memory(trt):
    pointer = npumem.malloc(4096)
    allocation = npumem.get_backend().resolve(pointer, 1, "test").allocation
    assert isinstance(allocation.buffer, torch.Tensor) and allocation.buffer.dtype == torch.uint8
    native = npumem.native_pointer(pointer + 100)
    assert native == allocation.buffer.data_ptr() + 100
    npumem.memset(pointer, 4096, 9, 4096)
    assert allocation.buffer[:4096].eq(9).all()
    npumem.free(pointer)
    assert allocation.buffer is None                # torch has the bytes back


def test_logical_cpu_devices_are_separate(trt):
    first = npumem.malloc(1 * MiB)
    npumem.set_device(1)
    second = npumem.malloc(1 * MiB)
    backend = npumem.get_backend()
    assert (backend.device_of(first), backend.device_of(second)) == (0, 1)
    assert backend.mem_info(0, npumem.MemAttr.HBM_MEM)[0] < 64 * MiB
    assert backend.mem_info(0, npumem.MemAttr.DDR_MEM) == (0, 0)


# --- DLPack ---------------------------------------------------------------------------------


def test_tensors_cross_to_torch_and_back_without_copies(trt):
    stream = npumem.create_stream()
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    tensor = ops.from_numpy(x, stream)
    view = torch.from_dlpack(tensor.t())              # waits for the queued copy first
    npumem.copy_stats(reset=True)
    assert view.shape == (4, 3) and view[1, 2].item() == x[2, 1]
    view[0, 0] = 100
    assert tensor.numpy()[0, 0] == 100               # the same bytes
    source = torch.arange(8, dtype=torch.int32)
    imported = npumem.from_dlpack(source)
    out = ops.empty((8,), "int32")
    aclnn.run_with_pool_workspace(aclnn.add, aclnn.add_get_workspace_size(imported, imported, 1, out))
    npumem.synchronize_stream()
    source[0] = 7
    assert imported.numpy()[0] == 7 and out.numpy().tolist() == [2 * i for i in range(8)]
    assert npumem.copy_stats()["bytes"]["HOST_TO_DEVICE"] == 0


def test_a_torch_view_keeps_its_block_from_reuse(trt):
    tensor = ops.from_numpy(np.full(1024, 3, np.float32))
    view = torch.from_dlpack(tensor)
    address = tensor.address
    del tensor
    again = ops.from_numpy(np.zeros(1024, np.float32))
    assert again.address != address and view.eq(3).all()
    del view
    assert ops.empty((1024,)).address == address     # released with the last torch view


# --- CustomMatMul ---------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["sim", "torch:cpu"])
def test_custom_matmul_matches_torch_forward_and_backward(backend):
    from npumem.bridges.autograd import CustomMatMul, custom_matmul

    npumem.init(backend=backend)
    npumem.set_device(0)
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(6, 5, dtype=torch.float64, generator=generator, requires_grad=True)
    b = torch.randn(5, 4, dtype=torch.float64, generator=generator, requires_grad=True)
    c = CustomMatMul()(a, b)
    torch.testing.assert_close(c, a @ b)
    weights = torch.randn(6, 4, dtype=torch.float64, generator=generator)
    (c * weights).sum().backward()
    torch.testing.assert_close(a.grad, weights @ b.detach().t())
    torch.testing.assert_close(b.grad, a.detach().t() @ weights)
    assert torch.autograd.gradcheck(custom_matmul, (a.detach().requires_grad_(), b.detach().requires_grad_()))
    assert mem.memory_allocated() == 0               # workspaces went back to the pool


def test_custom_matmul_float32_and_bad_shapes(trt):
    from npumem.bridges.autograd import custom_matmul

    a, b = torch.randn(64, 32), torch.randn(32, 16)
    torch.testing.assert_close(custom_matmul(a, b), a @ b, rtol=1e-4, atol=1e-4)
    with pytest.raises(OpParamError, match="inner dims"):
        custom_matmul(a, a)
    with pytest.raises(OpParamError, match="2-D"):
        custom_matmul(a[0], b)


# --- PyTorch's allocator state --------------------------------------------------------------

TORCH_STATS = {          # the shape of torch.cuda.memory_stats() after a short training run
    "allocated_bytes.all.current": 3 << 20, "allocated_bytes.all.peak": 9 << 20,
    "allocated_bytes.all.allocated": 40 << 20, "allocated_bytes.all.freed": 37 << 20,
    "reserved_bytes.all.current": 20 << 20, "reserved_bytes.all.peak": 20 << 20,
    "allocation.all.allocated": 400, "segment.all.allocated": 10, "num_ooms": 1,
    "num_alloc_retries": 2,
}


def test_torch_stats_get_hit_rate_and_fragmentation(tmp_path):
    path = tmp_path / "stats.json"
    path.write_text(json.dumps(TORCH_STATS))
    states = ["active_allocated", "inactive", "active_allocated", "inactive"]
    snapshot = {"segments": [{"device": 0, "address": 0, "total_size": 4 << 20, "blocks": [
        {"address": i << 20, "size": 1 << 20, "state": state} for i, state in enumerate(states)]}],
        "device_traces": []}
    stats = mem.torch_memory_stats(str(path), snapshot)
    assert stats["cache_hit_rate"] == pytest.approx(1 - 10 / 400)
    assert stats["fragmentation"] == pytest.approx(0.5)      # two equal free pieces
    summary = mem.torch_memory_summary(TORCH_STATS)
    assert "PyTorch caching allocator" in summary and "97.5%" in summary and "n/a" in summary
    assert "GPU OOMs: 1" in summary and "GPU reserved memory" in summary
    snapshot_path = tmp_path / "snap.pickle"
    snapshot_path.write_bytes(pickle.dumps(snapshot))
    result = CliRunner().invoke(main, ["report", str(path), "--snapshot", str(snapshot_path)])
    assert result.exit_code == 0 and "Fragmentation: 50.0%" in result.output
    path.write_text(json.dumps({**TORCH_STATS, "max_split_size": -1}))    # PyTorch's "not set"
    unset = CliRunner().invoke(main, ["report", str(path)])
    assert unset.exit_code == 0, unset.output
    path.write_text(json.dumps({**TORCH_STATS, "num_ooms": -1}))
    negative = CliRunner().invoke(main, ["report", str(path)])
    assert negative.exit_code == 2 and "'num_ooms' is -1" in negative.output


def test_torch_stats_errors(tmp_path):
    with pytest.raises(InvalidParamError, match="not PyTorch memory_stats"):
        mem.torch_memory_stats({"x": 1})
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    result = CliRunner().invoke(main, ["report", str(bad)])
    assert result.exit_code == 2 and "cannot read it as JSON" in result.output
    if not torch.cuda.is_available():
        with pytest.raises(FeatureNotSupportedError, match="no accelerator|no caching allocator"):
            mem.torch_memory_stats()


# --- CuPy -----------------------------------------------------------------------------------


def _fake_cupy(monkeypatch):
    """Enough of CuPy's allocator interface to drive the hook, recording what it is given."""
    cupy = types.ModuleType("cupy")
    cuda = types.SimpleNamespace(allocator=None, synced=0)

    class UnownedMemory:
        def __init__(self, ptr, size, owner, device_id=-1):
            self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id

    class MemoryPointer:
        def __init__(self, memory, offset):
            self.mem, self.ptr = memory, memory.ptr + offset

    class Stream:
        def synchronize(self):
            cuda.synced += 1

    cuda.UnownedMemory, cuda.MemoryPointer = UnownedMemory, MemoryPointer
    cuda.get_current_stream = Stream
    cuda.set_allocator = lambda function: setattr(cuda, "allocator", function)
    cupy.cuda = cuda
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    return cupy


def test_cupy_hook_serves_pool_blocks(trt, monkeypatch):
    from npumem.bridges import cupy as hook

    fake = _fake_cupy(monkeypatch)
    with pytest.raises(FeatureNotSupportedError, match="torch:cuda"):
        hook.use_npumem_pool()                       # cpu memory is no use to CuPy
    backend = npumem.get_backend()
    monkeypatch.setattr(backend, "dlpack_device", lambda device: (2, 0))   # pretend it is cuda
    hook.use_npumem_pool()
    pointer = fake.cuda.allocator(1000)
    assert mem.memory_allocated() >= 1000
    block = backend.resolve(pointer.mem.owner.pointer, 1000, "test")
    assert pointer.ptr == block.allocation.buffer.data_ptr() + block.offset
    del pointer
    assert mem.memory_allocated() == 0 and fake.cuda.synced == 1


def test_cupy_hook_without_cupy(trt, monkeypatch):
    from npumem.bridges import cupy as hook

    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(FeatureNotSupportedError, match="needs CuPy"):
        hook.use_npumem_pool()
