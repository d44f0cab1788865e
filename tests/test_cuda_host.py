"""Zero-copy host memory on torch:cuda (`device/cuda_host`), against a stand-in for PyTorch:
page-locked memory becomes a CUDA view that keeps its owner alive, pageable memory is refused
with a sentence, at either end of the range. The real GPU runs tests/test_torch_cuda.py."""

import types

import pytest

from npumem.device import cuda_host
from npumem.errors import FeatureNotSupportedError


def fake_torch(pinned_ranges):
    """Just enough of torch: from_numpy(...).is_pinned() answers from `pinned_ranges`."""
    class HostTensor:
        def __init__(self, array):
            self.address = array.ctypes.data

        def is_pinned(self):
            return any(start <= self.address < end for start, end in pinned_ranges)

    class DeviceContext:
        def __init__(self, device):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def as_tensor(obj, device):                    # a CUDA tensor keeps its source object
        return types.SimpleNamespace(source=obj, device=device)

    return types.SimpleNamespace(cuda=types.SimpleNamespace(device=DeviceContext),
                                 as_tensor=as_tensor, from_numpy=HostTensor)


def test_page_locked_memory_becomes_a_view_that_keeps_its_owner():
    import numpy as np

    owner = np.zeros(8192, dtype=np.uint8)
    base = owner.ctypes.data
    torch = fake_torch([(base, base + 8192)])
    view = cuda_host.device_view(torch, base + 64, 4096, "cuda:0", owner)
    assert view.source.__cuda_array_interface__ == {
        "shape": (4096,), "typestr": "|u1", "data": (base + 64, False), "version": 3}
    assert view.source.owner is owner and view.device == "cuda:0"


@pytest.mark.parametrize("pinned_part", ["none", "start only", "end only"])
def test_pageable_memory_is_refused_with_what_to_do(pinned_part):
    import numpy as np

    owner = np.zeros(8192, dtype=np.uint8)
    base = owner.ctypes.data
    ranges = {"none": [], "start only": [(base, base + 100)],
              "end only": [(base + 4000, base + 8192)]}[pinned_part]
    with pytest.raises(FeatureNotSupportedError, match="pageable.*malloc_host.*pin_memory"):
        cuda_host.device_view(fake_torch(ranges), base, 8192, "cuda:0", owner)
