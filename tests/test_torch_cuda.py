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
