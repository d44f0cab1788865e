"""The built-in ops as tiled AI core kernels (NPUMEM_SIM_KERNELS=tiled) against the whole-array
numpy kernels, on random shapes whose tails do not divide into tiles or blocks."""

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import npumem
from npumem import aclnn
from npumem.errors import OpParamError
from npumem.kernel import RECENT
from npumem.ops.tiled_kernels import Fallback

SETTINGS = settings(max_examples=20, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def _both(monkeypatch, stream, plan_and_run):
    """The op's result with the whole-array kernels, then with the tiled ones, and the tiling."""
    results = {}
    for mode in ("numpy", "tiled"):
        monkeypatch.setenv("NPUMEM_SIM_KERNELS", mode)
        out, (size, executor), run = plan_and_run()
        tiling = executor.call.attrs.get("tiling")
        aclnn.run_with_pool_workspace(run, (size, executor), stream)
        stream.synchronize()
        results[mode] = (out.numpy(), size, tiling)
    (ours, our_size, _), (tiled, tiled_size, tiling) = results["numpy"], results["tiled"]
    assert our_size == tiled_size                 # the two-phase API does not change
    return ours, tiled, tiling


@pytest.fixture
def stream(rt):
    return npumem.create_stream()


@SETTINGS
@given(n=st.integers(1, 40_000), dtype=st.sampled_from([np.float32, np.float16, np.int32]),
       op=st.sampled_from(["add", "mul", "add_alpha"]), seed=st.integers(0, 99))
def test_elementwise_ops_are_bit_identical(rt, stream, monkeypatch, n, dtype, op, seed):
    rng = np.random.default_rng(seed)
    a, b = ((rng.standard_normal(n) * 50).astype(dtype) for _ in range(2))

    def plan_and_run():
        x, y, out = npumem.from_numpy(a), npumem.from_numpy(b), npumem.empty((n,), dtype=dtype)
        if op == "mul":
            return out, aclnn.mul_get_workspace_size(x, y, out), aclnn.mul
        alpha = 1 if op == "add" else (3 if dtype == np.int32 else 0.37)
        return out, aclnn.add_get_workspace_size(x, y, alpha, out), aclnn.add
    ours, tiled, tiling = _both(monkeypatch, stream, plan_and_run)
    np.testing.assert_array_equal(tiled, ours)
    assert not isinstance(tiling, Fallback)
    blocks = {s.block for s in RECENT[-1].timeline.slices}
    assert len(blocks) == tiling.block_dim and tiling.block_dim * tiling.per_block >= n


@SETTINGS
@given(rows=st.integers(1, 70), length=st.integers(1, 700), seed=st.integers(0, 99))
def test_softmax_is_bit_identical(rt, stream, monkeypatch, rows, length, seed):
    x = np.random.default_rng(seed).standard_normal((rows, length)).astype(np.float32) * 4

    def plan_and_run():
        t, out = npumem.from_numpy(x), npumem.empty(x.shape)
        return out, aclnn.softmax_get_workspace_size(t, -1, out), aclnn.softmax
    ours, tiled, tiling = _both(monkeypatch, stream, plan_and_run)
    np.testing.assert_array_equal(tiled, ours)
    assert not isinstance(tiling, Fallback)


@SETTINGS
@given(m=st.integers(1, 300), k=st.integers(1, 300), n=st.integers(1, 300),
       dtype=st.sampled_from([np.float32, np.float16]), seed=st.integers(0, 99))
def test_matmul_matches_through_l1_l0_and_the_cube(rt, stream, monkeypatch, m, k, n, dtype, seed):
    rng = np.random.default_rng(seed)
    # Integer values make every sum exact whatever the order, so any misplaced element shows.
    a, b = rng.integers(-3, 4, (m, k)).astype(dtype), rng.integers(-3, 4, (k, n)).astype(dtype)
    if dtype == np.float16:                # keep the sums inside float16's exact integers
        a, b = np.clip(a, -1, 1), np.clip(b, -1, 1)

    def plan_and_run():
        out = npumem.empty((m, n), dtype=dtype)
        planned = aclnn.matmul_get_workspace_size(npumem.from_numpy(a), npumem.from_numpy(b), out)
        return out, planned, aclnn.matmul
    ours, tiled, tiling = _both(monkeypatch, stream, plan_and_run)
    np.testing.assert_array_equal(tiled, ours)
    assert not isinstance(tiling, Fallback)
    assert RECENT[-1].timeline.lane_cycles()["Cube"] > 0


def test_matmul_float_sums_agree_to_rounding(rt, stream, monkeypatch):
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((200, 333)).astype(np.float32), \
        rng.standard_normal((333, 150)).astype(np.float32)

    def plan_and_run():
        out = npumem.empty((200, 150))
        planned = aclnn.matmul_get_workspace_size(npumem.from_numpy(a), npumem.from_numpy(b), out)
        return out, planned, aclnn.matmul
    ours, tiled, _ = _both(monkeypatch, stream, plan_and_run)
    np.testing.assert_allclose(tiled, ours, rtol=1e-5, atol=1e-4)


def test_calls_the_tiles_do_not_cover_keep_the_whole_array_kernel(rt, stream, monkeypatch):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)

    def broadcast():
        out = npumem.empty((3, 4))
        row = npumem.from_numpy(x[0].copy())
        return out, aclnn.add_get_workspace_size(npumem.from_numpy(x), row, 1, out), aclnn.add
    ours, tiled, tiling = _both(monkeypatch, stream, broadcast)
    np.testing.assert_array_equal(tiled, ours)
    assert tiling == Fallback("broadcasting")

    def softmax_rows():
        out = npumem.empty((3, 4))
        return out, aclnn.softmax_get_workspace_size(npumem.from_numpy(x), 0, out), aclnn.softmax
    ours, tiled, tiling = _both(monkeypatch, stream, softmax_rows)
    np.testing.assert_array_equal(tiled, ours)
    assert "other than the last" in tiling.reason


def test_an_unknown_kernel_choice_is_a_clear_error(rt, monkeypatch):
    monkeypatch.setenv("NPUMEM_SIM_KERNELS", "fast")
    x = npumem.from_numpy(np.ones(4, np.float32))
    with pytest.raises(OpParamError, match="NPUMEM_SIM_KERNELS='fast': choose numpy"):
        aclnn.add_get_workspace_size(x, x, 1, npumem.empty((4,)))
