"""The fake run's operator cache (estimate/fake_cache.py) against FakeTensorMode itself: every
result the cache makes must be what FakeTensorMode makes (shape, strides, offset, dtype, device,
which input it is or which storage it views), and whatever it cannot make goes to FakeTensorMode."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import (DynamicOutputShapeException, FakeTensor,  # noqa: E402
                                           FakeTensorMode)
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from npumem.estimate.fake_cache import FakeCache  # noqa: E402


class _Cached(TorchDispatchMode):
    """The cache on top of FakeTensorMode, as the fake run's recorder puts it (cache=None: each
    operator straight to FakeTensorMode); `seen` describes every operator's result as the
    dispatcher hands it out, before PyTorch's autograd layer returns `self` for in-place ones."""

    @classmethod
    def _should_skip_dynamo(cls):
        return False

    def __init__(self, cache):
        super().__init__()
        self.cache, self.seen = cache, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = self.cache(func, args, kwargs) if self.cache else func(*args, **kwargs)
        inputs = [*args, *kwargs.values()]
        inputs += [t for value in inputs if isinstance(value, (list, tuple)) for t in value]
        self.seen.append((str(func), _describe(out, inputs)))
        return out


def _describe(value, inputs):
    """What a result is, in terms FakeTensorMode's and the cache's answers must share."""
    if isinstance(value, (list, tuple)):
        return [_describe(v, inputs) for v in value]
    if not isinstance(value, torch.Tensor):
        return value
    for index, tensor in enumerate(inputs):
        if value is tensor:             # and what it is now (unsqueeze_ changes it)
            return ("input", index, tuple(value.shape), value.stride(), value.storage_offset())
    shared = [i for i, t in enumerate(inputs) if isinstance(t, torch.Tensor)
              and t.untyped_storage()._cdata == value.untyped_storage()._cdata]
    return (type(value).__name__, tuple(value.shape), value.stride(), value.storage_offset(),
            value.dtype, str(value.device), value.untyped_storage().nbytes(), tuple(shared))


def _program(x, y, step, number):
    """Operators of every kind the cache tells apart, as (name, inputs, result) triples."""
    out = []

    def note(name, inputs, result):
        out.append((name, inputs, result))

    note("add", (x, y), x + y)
    note("add int scalar", (x,), x + 1)
    note("add float scalar", (x,), x + 0.5)
    note("add_ in place", (x,), torch.ops.aten.add_.Tensor(x, y))     # what the kernel returns
    z = torch.empty_like(x)
    note("add out=", (z,), torch.ops.aten.add.out(x, y, out=z))
    w = x.clone()
    note("unsqueeze_ (changes its input)", (w,), torch.ops.aten.unsqueeze_(w, 0))
    note("mm", (x, y), x @ y.t())
    note("sum", (x,), x.sum(0))
    note("view", (x,), x.view(-1))
    note("transpose", (x,), x.t())
    note("split", (x,), x.split(3))
    note("reshape of a transposed tensor", (x,), x.t().reshape(-1))     # a copy
    note("cat", (x, y), torch.cat([x, y]))
    note("layer norm", (x,), torch.nn.functional.layer_norm(x, (8,)))
    note("layer norm backward", (x,), torch.ops.aten.native_layer_norm_backward(
        x, x, (8,), x.sum(1, keepdim=True), x.sum(1, keepdim=True), None, None, [True, False, False]))
    note("softmax", (x,), x.softmax(-1))
    note("bool mask", (x,), x > 0)
    note("to bfloat16", (x,), x.to(torch.bfloat16))
    note("factory", (), torch.zeros(3, 5, dtype=torch.float16))
    note("foreach with floats", (x, y), torch._foreach_mul([x, y], [0.1 * number, 0.2]))
    note("host scalar tensor", (x, step), x * step)
    note("matmul 3d (unsafe view)", (x,), torch.matmul(x.view(-1, 6, 8), x.t()))
    return out


def _run(cached: bool, rows=(12, 12, 12, 24, 24)):
    """The program on growing inputs: the cache's answers, then new shapes (meta kernels)."""
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    described = []
    with fake:
        with _Cached(FakeCache(torch, fake) if cached else None) as mode:
            for step, count in enumerate(rows):
                x, y = torch.empty(count, 8), torch.empty(count, 8)
                step_tensor = torch.tensor(float(step + 1))
                for name, inputs, result in _program(x, y, step_tensor if step else 1.0, step):
                    described.append((step, name, _describe(result, inputs)))
    return described, mode


def test_the_cache_makes_what_fake_tensor_mode_makes():
    plain, plain_mode = _run(cached=False)
    cached, mode = _run(cached=True)
    assert cached == plain
    assert mode.seen == plain_mode.seen            # each operator, as the dispatcher returns it
    cache = mode.cache
    assert cache.hits > 20 and cache.views > 10      # later steps are answered by the cache
    assert cache.misses < cache.hits
    assert cache._trusted[torch.ops.aten.mm.default]               # new shapes: meta kernels
    assert not cache._trusted[torch.ops.aten.native_layer_norm.default]   # FakeTensorMode's own


def test_results_are_fake_tensors_of_the_mode_with_their_own_storage():
    fake = FakeTensorMode()
    cache = FakeCache(torch, fake)
    with fake:
        x = torch.empty(4, 4)
        with _Cached(cache):
            first, second = x * 2, x * 2               # the second from the cache
    assert cache.hits == 1
    for result in (first, second):
        assert type(result) is FakeTensor and result.fake_mode is fake
    assert first.untyped_storage()._cdata != second.untyped_storage()._cdata
    assert second.untyped_storage().nbytes() == 64


def test_an_operator_that_reshapes_its_input_is_never_cached():
    fake = FakeTensorMode()
    cache = FakeCache(torch, fake)
    with fake:
        with _Cached(cache):
            for size in (3, 3, 7):
                x = torch.empty(2)
                x.resize_(size)
                assert tuple(x.shape) == (size,) and x.untyped_storage().nbytes() == 4 * size
    assert cache.hits == 2                           # torch.empty(2) twice; resize_ never


def test_sizes_that_depend_on_data_still_reach_fake_tensor_mode():
    fake = FakeTensorMode()
    cache = FakeCache(torch, fake)
    with fake:
        x = torch.empty(10)
        with _Cached(cache):
            for _ in range(2):                       # raised every time, never remembered
                with pytest.raises(DynamicOutputShapeException):
                    torch.nonzero(x)


@pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")
def test_a_deep_copied_module_shares_the_mode():
    from npumem.estimate.fake_run import _one_fake_mode
    _one_fake_mode(torch)
    try:
        fake = FakeTensorMode()
        with fake:
            layer = torch.nn.Linear(4, 4)
            clone = copy.deepcopy(layer)
        assert clone.weight.fake_mode is fake and clone.weight is not layer.weight
    finally:
        del FakeTensorMode.__deepcopy__
