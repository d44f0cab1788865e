"""The page registrations behind zero-copy host memory on torch:cuda, against a stand-in for
PyTorch's CUDA runtime bindings (the real ones run in tests/test_torch_cuda.py on a GPU): no
page is registered twice, a page stays registered while any view uses it, and every
registration is undone."""

import gc
import types

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from npumem.device import cuda_host
from npumem.errors import FeatureNotSupportedError

PAGE = cuda_host.PAGE


class FakeCudaRuntime:
    """cudaHostRegister / cudaHostUnregister that keep the registered ranges and refuse overlaps
    as CUDA does."""

    def __init__(self, fail_with: int = 0):
        self.ranges: dict[int, int] = {}          # start -> end
        self.fail_with = fail_with

    def cudaHostRegister(self, start, nbytes, flags):
        assert start % PAGE == 0 and nbytes % PAGE == 0 and flags == 3
        if self.fail_with:
            return self.fail_with
        if any(s < start + nbytes and start < e for s, e in self.ranges.items()):
            return cuda_host.ALREADY_REGISTERED
        self.ranges[start] = start + nbytes
        return 0

    def cudaHostUnregister(self, start):
        del self.ranges[start]                    # KeyError: never registered this way
        return 0


def fake_torch(runtime: FakeCudaRuntime, pinned: bool = False):
    class HostTensor:
        def is_pinned(self):
            return pinned

    class DeviceContext:
        def __init__(self, device):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def as_tensor(obj, device):                    # a CUDA tensor keeps its source object
        return types.SimpleNamespace(source=obj, device=device)

    cuda = types.SimpleNamespace(device=DeviceContext, cudart=lambda: runtime)
    return types.SimpleNamespace(cuda=cuda, as_tensor=as_tensor, from_numpy=lambda a: HostTensor())


@pytest.fixture(autouse=True)
def no_registrations_left():
    yield
    gc.collect()
    assert cuda_host._units == {}


def test_views_share_pages_and_the_last_one_unregisters():
    runtime = FakeCudaRuntime()
    torch = fake_torch(runtime)
    buffer = np.zeros(3 * PAGE, dtype=np.uint8)
    base = buffer.ctypes.data
    first = cuda_host.device_view(torch, base, 100, "cuda:0", buffer)
    second = cuda_host.device_view(torch, base + 50, 2 * PAGE, "cuda:0", buffer)
    covered = sorted(runtime.ranges.items())
    assert covered[0][0] <= base and covered[-1][1] >= base + 50 + 2 * PAGE
    assert all(a[1] <= b[0] for a, b in zip(covered, covered[1:]))       # no page twice
    assert first.source.__cuda_array_interface__["data"] == (base, False)
    del first
    gc.collect()
    assert runtime.ranges, "the second view still needs its pages"
    del second
    gc.collect()
    assert runtime.ranges == {}


def test_memory_its_owner_pinned_is_used_as_it_is():
    runtime = FakeCudaRuntime()
    view = cuda_host.device_view(fake_torch(runtime, pinned=True), 4 * PAGE, 64, "cuda:0", None)
    assert runtime.ranges == {} and view.source.__cuda_array_interface__["shape"] == (64,)


def test_a_refused_registration_is_an_error_that_leaves_nothing_registered():
    runtime = FakeCudaRuntime(fail_with=1)
    with pytest.raises(FeatureNotSupportedError, match="CUDA error 1; copy the data"):
        cuda_host.device_view(fake_torch(runtime), 8 * PAGE, 64, "cuda:0", None)
    assert runtime.ranges == {}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 16 * PAGE), st.integers(1, 6 * PAGE), st.booleans()),
                min_size=1, max_size=12))
def test_any_order_of_views_registers_each_page_once_and_releases_all(spans):
    runtime = FakeCudaRuntime()
    torch = fake_torch(runtime)
    base = 1 << 30
    views = []
    for offset, nbytes, drop_one in spans:
        views.append((base + offset, nbytes, cuda_host.device_view(torch, base + offset, nbytes,
                                                                   "cuda:0", None)))
        if drop_one and len(views) > 1:
            views.pop(0)                               # freed at once: nothing holds a cycle
        for address, size in [view[:2] for view in views]:   # every live view's pages are mapped
            for page in range(address - address % PAGE, address + size, PAGE):
                assert any(s <= page < e for s, e in runtime.ranges.items())
    views.clear()
    assert runtime.ranges == {}
