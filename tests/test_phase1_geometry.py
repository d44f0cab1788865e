"""Phase 1 remembered by geometry: new tensors of the same shape, strides, offset, dtype and
format reuse the plan; any difference plans again; a hit still refuses freed memory."""

import numpy as np
import pytest

import npumem
from npumem import aclnn
from npumem.device import sanitizer
from npumem.ops.phase1_cache import PHASE1


@pytest.fixture(params=["sanitizer off", "sanitizer on"])
def rt2(rt, request):
    """With the pool sanitizer off (ranges derived from the last call) and on (resolved)."""
    was_on = sanitizer.SANITIZER.on
    sanitizer.SANITIZER.on = request.param == "sanitizer on"
    yield rt
    sanitizer.SANITIZER.on = was_on


def _counts():
    return PHASE1.hits, PHASE1.misses


def test_a_new_result_of_the_same_geometry_hits(rt2):
    a = npumem.from_numpy(np.arange(64, dtype=np.float32))
    b = npumem.from_numpy(np.full(64, 0.5, np.float32))
    c = a + b                                  # plans (or hits an earlier test's plan)
    hits = PHASE1.hits
    for _ in range(3):
        c = a + b                              # a new c each time
        np.testing.assert_array_equal(c.numpy(), np.arange(64, dtype=np.float32) + 0.5)
    assert PHASE1.hits == hits + 3
    x = npumem.from_numpy(np.ones(64, np.float32))
    y = npumem.from_numpy(np.full(64, 2, np.float32))
    out = npumem.empty((64,))
    aclnn.run_with_pool_workspace(aclnn.add, aclnn.add_get_workspace_size(x, y, 1, out))
    assert PHASE1.hits == hits + 4             # new inputs too
    np.testing.assert_array_equal(out.numpy(), np.full(64, 3, np.float32))


def _planned(self, other, out, alpha=1):
    return aclnn.add_get_workspace_size(self, other, alpha, out)


@pytest.mark.parametrize("change", ["shape", "stride", "offset", "dtype", "alpha", "aliasing"])
def test_a_different_geometry_or_value_misses(rt2, change):
    base = npumem.from_numpy(np.arange(32, dtype=np.float32).reshape(4, 8))
    other = npumem.from_numpy(np.ones((4, 8), np.float32))
    _planned(base, other, npumem.empty((4, 8)))
    hits, misses = _counts()
    _planned(npumem.from_numpy(np.zeros((4, 8), np.float32)), other, npumem.empty((4, 8)))
    assert _counts() == (hits + 1, misses)     # the same geometry: a hit
    wide = npumem.from_numpy(np.arange(64, dtype=np.float32).reshape(4, 16))
    self, out, alpha, expected = base, npumem.empty((4, 8)), 1, None
    if change == "shape":
        self, other, out = base[:2], other[:2], npumem.empty((2, 8))
        expected = np.arange(16, dtype=np.float32).reshape(2, 8) + 1
    elif change == "stride":
        self = wide[:, :8]                     # strides (16, 1), offset 0
        expected = wide.numpy()[:, :8] + 1
    elif change == "offset":
        self = npumem.from_numpy(np.arange(40, dtype=np.float32))[8:].reshape(4, 8)
        expected = np.arange(8, 40, dtype=np.float32).reshape(4, 8) + 1
    elif change == "dtype":
        self = npumem.from_numpy(np.arange(32, dtype=np.float16).reshape(4, 8))
        expected = np.arange(32, dtype=np.float32).reshape(4, 8) + 1
    elif change == "alpha":
        alpha, expected = 2, np.arange(32, dtype=np.float32).reshape(4, 8) + 2
    else:
        other, expected = base, 2 * np.arange(32, dtype=np.float32).reshape(4, 8)
    hits, misses = _counts()
    aclnn.run_with_pool_workspace(aclnn.add, _planned(self, other, out, alpha))
    assert _counts() == (hits, misses + 1)
    np.testing.assert_array_equal(out.numpy(), expected)


def test_aliased_arguments_are_a_different_plan_from_distinct_ones(rt2):
    x = npumem.from_numpy(np.full(8, 3, np.float32))
    out = npumem.empty((8,))
    aclnn.run_with_pool_workspace(aclnn.add, aclnn.add_get_workspace_size(x, x, 1, out))
    a, b = npumem.from_numpy(np.ones(8, np.float32)), npumem.from_numpy(np.full(8, 5, np.float32))
    aclnn.run_with_pool_workspace(aclnn.add, aclnn.add_get_workspace_size(a, b, 1, out))
    np.testing.assert_array_equal(out.numpy(), np.full(8, 6, np.float32))   # b, not a twice


def test_alpha_minus_zero_is_not_plus_zero(rt2):
    x = npumem.from_numpy(np.full(4, -0.0, np.float32))
    one = npumem.from_numpy(np.ones(4, np.float32))
    out = npumem.empty((4,))
    for alpha in (0.0, -0.0):
        aclnn.run_with_pool_workspace(aclnn.add, aclnn.add_get_workspace_size(x, one, alpha, out))
        assert np.signbit(out.numpy()).all() == (np.signbit(alpha))


def test_a_freed_input_is_refused_on_a_hit(rt2):
    out = npumem.empty((64,))
    live = npumem.malloc(256)
    view = npumem.create_tensor((64,), "float32", data_ptr=live)
    aclnn.add_get_workspace_size(view, view, 1, out)
    pointer = npumem.malloc(256)
    stale = npumem.create_tensor((64,), "float32", data_ptr=pointer)
    hits = PHASE1.hits
    aclnn.add_get_workspace_size(stale, stale, 1, out)    # same geometry, live: a hit
    assert PHASE1.hits == hits + 1
    npumem.free(pointer)
    with pytest.raises(npumem.errors.MemoryAccessError, match="use after free"):
        aclnn.add_get_workspace_size(stale, stale, 1, out)
    with pytest.raises(npumem.errors.MemoryAccessError, match="use after free"):
        aclnn.add_get_workspace_size(view, stale, 1, out)
    npumem.free(live)


def test_a_stale_pool_storage_is_refused_on_a_hit(rt, monkeypatch):
    """With the pool sanitizer on (it alone knows a pool block was given back under a view),
    a remembered plan does not pass a stale storage."""
    monkeypatch.setattr(sanitizer.SANITIZER, "on", True)
    a = npumem.from_numpy(np.ones(16, np.float32))
    out = npumem.empty((16,))
    aclnn.add_get_workspace_size(a, a, 1, out)
    b = npumem.from_numpy(np.ones(16, np.float32))
    b.storage.free()                          # given back while b still views it
    with pytest.raises(npumem.errors.MemoryAccessError, match="stale|freed"):
        aclnn.add_get_workspace_size(b, b, 1, out)
