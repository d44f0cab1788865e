"""aclnn.sparse_matmul: the strategy follows the operand's sparsity, the workspace holds the
compressed form, and every strategy equals dense MatMul within float32 rounding."""

import numpy as np
import pytest

import npumem
from npumem import aclnn
from npumem.errors import OpParamError
from npumem.ops import sparse


@pytest.fixture
def stream(rt):
    return npumem.create_stream()


def _operand(rows, cols, density, pattern, seed=0, tile=32):
    rng = np.random.default_rng(seed)
    if pattern == "tiles":
        mask = np.repeat(np.repeat(rng.random((-(-rows // tile), -(-cols // tile))) < density,
                                   tile, 0), tile, 1)[:rows, :cols]
    else:
        mask = rng.random((rows, cols)) < density
    return np.where(mask, rng.standard_normal((rows, cols)), 0).astype(np.float32)


def _run(stream, a, b):
    left, right = npumem.from_numpy(a), npumem.from_numpy(b)
    out = npumem.empty((a.shape[0], b.shape[1]))
    size, executor = aclnn.sparse_matmul_get_workspace_size(left, right, out)
    chosen = executor.call.attrs["sparsity"]
    aclnn.run_with_pool_workspace(aclnn.sparse_matmul, (size, executor), stream)
    stream.synchronize()
    return out.numpy(), chosen, size


@pytest.mark.parametrize("shape, density, pattern, strategy", [
    ((256, 192, 96), 0.05, "tiles", "block"),
    ((250, 201, 77), 0.2, "tiles", "block"),          # edge tiles that do not divide
    ((300, 256, 64), 0.0004, "scattered", "direct"),
    ((100, 130, 50), 0.05, "scattered", "dense"),
    ((64, 64, 64), 0.9, "scattered", "dense"),
])
def test_each_strategy_equals_dense_matmul(stream, shape, density, pattern, strategy):
    m, k, n = shape
    a = _operand(m, k, density, pattern)
    b = np.random.default_rng(1).standard_normal((k, n)).astype(np.float32)
    result, chosen, size = _run(stream, a, b)
    assert chosen.strategy == strategy, chosen.describe()
    np.testing.assert_allclose(result, a @ b, rtol=1e-5, atol=1e-4)
    assert chosen.nonzeros == np.count_nonzero(a)
    regions = sparse.workspace_regions(chosen)
    assert size >= sum(regions.values())
    if strategy == "block":
        assert regions["tile values"] == chosen.tiles * 32 * 32 * 4
    if strategy == "direct":
        assert regions["values"] == regions["columns"] == chosen.nonzeros * 4
    if strategy == "dense":
        assert size == 0


def test_negative_zero_and_empty_rows_count_as_empty(stream):
    a = np.zeros((64, 64), np.float32)
    a[:32, :32] = -0.0
    a[40, 5] = 2.0
    b = np.arange(64 * 8, dtype=np.float32).reshape(64, 8)
    result, chosen, _ = _run(stream, a, b)
    assert chosen.tiles == 1 and chosen.nonzeros == 1
    np.testing.assert_array_equal(result, a @ b)


def test_the_analysis_sees_writes_queued_before_it(stream):
    a = npumem.zeros((64, 64))
    ones = npumem.from_numpy(np.ones((64, 64), np.float32))
    aclnn.run_with_pool_workspace(aclnn.add, aclnn.add_get_workspace_size(a, ones, 1, a), stream)
    _, executor = aclnn.sparse_matmul_get_workspace_size(a, ones, npumem.empty((64, 64)))
    assert executor.call.attrs["sparsity"].strategy == "dense"


def test_bad_operands_get_clear_errors(rt):
    a, b = npumem.from_numpy(np.ones((4, 3), np.float32)), npumem.from_numpy(np.ones((5, 2), np.float32))
    with pytest.raises(OpParamError, match=r"inner dims 3 and 5"):
        aclnn.sparse_matmul_get_workspace_size(a, b, npumem.empty((4, 2)))
    half = npumem.from_numpy(np.ones((3, 2), np.float16))
    with pytest.raises(OpParamError, match="mat2 is float16; the sparse kernels take float32"):
        aclnn.sparse_matmul_get_workspace_size(a, half, npumem.empty((4, 2)))
    right = npumem.from_numpy(np.ones((3, 2), np.float32))
    with pytest.raises(OpParamError, match=r"out has shape \(4, 4\)"):
        aclnn.sparse_matmul_get_workspace_size(a, right, npumem.empty((4, 4)))
    with pytest.raises(OpParamError, match="block_size must be a positive whole number"):
        aclnn.sparse_matmul_get_workspace_size(a, right, npumem.empty((4, 2)), block_size=0)
