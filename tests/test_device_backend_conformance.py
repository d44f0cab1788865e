"""The device backend contract, run against every backend (add new backends to BACKENDS).

What the runtime relies on: allocate/free with exact accounting and clean failures, resolve as a
bounds check, byte movers that really move bytes, memory info and the live list.
"""

import ctypes

import numpy as np
import pytest

from npumem.constants import MallocPolicy, MemAttr
from npumem.device import DeviceBackend, SimBackend, SimConfig
from npumem.errors import InvalidDeviceError, MemoryAccessError, MemoryAllocationError, MemoryFreeError
from npumem.units import MiB

from .conftest import cuda_available, torch_cpu_backend, torch_cuda_backend

BACKENDS = {
    "sim": lambda: SimBackend(SimConfig(devices=2, memory=64 * MiB)),
    "torch:cpu": lambda: torch_cpu_backend(64 * MiB),
}
if cuda_available():
    BACKENDS["torch:cuda"] = lambda: torch_cuda_backend(64 * MiB)


@pytest.fixture(params=sorted(BACKENDS))
def backend(request) -> DeviceBackend:
    instance = BACKENDS[request.param]()
    yield instance
    instance.close()


def _whole(backend):
    return backend.mem_info(0, MemAttr.HBM_MEM)


def test_allocate_reports_usable_and_reserved_sizes(backend):
    allocation = backend.allocate(0, 100, 160, MallocPolicy.HUGE_FIRST, "malloc")
    assert (allocation.size, allocation.reserved, allocation.device) == (100, 160, 0)
    assert allocation.start % 128 == 0 and allocation.live
    assert backend.is_device_pointer(allocation.start)
    assert backend.device_of(allocation.start + 50) == 0
    assert backend.live_allocations(0) == [allocation]


def test_free_returns_the_memory(backend):
    before = _whole(backend)
    allocation = backend.allocate(0, 5 * MiB, 5 * MiB, MallocPolicy.HUGE_FIRST, "malloc")
    assert _whole(backend)[0] < before[0]
    assert backend.free(allocation.start, "free") is allocation
    assert not allocation.live and _whole(backend) == before
    assert backend.live_allocations(0) == []


def test_failed_allocation_changes_nothing(backend):
    before = _whole(backend)
    with pytest.raises(MemoryAllocationError):
        backend.allocate(0, 1 << 40, 1 << 40, MallocPolicy.HUGE_FIRST, "malloc")
    assert _whole(backend) == before and backend.live_allocations(0) == []


def test_bad_frees_change_nothing(backend):
    allocation = backend.allocate(0, 64, 96, MallocPolicy.HUGE_FIRST, "malloc")
    for pointer in (allocation.start + 8, allocation.start - 4096, 12345):
        with pytest.raises(MemoryFreeError):
            backend.free(pointer, "free")
    backend.free(allocation.start, "free")
    with pytest.raises(MemoryFreeError, match="double free"):
        backend.free(allocation.start, "free")


def test_resolve_is_a_bounds_check(backend):
    allocation = backend.allocate(0, 1000, 1024, MallocPolicy.HUGE_FIRST, "malloc")
    span = backend.resolve(allocation.start + 100, 900, "test")
    assert (span.allocation, span.offset, span.nbytes, span.address) == (allocation, 100, 900, allocation.start + 100)
    with pytest.raises(MemoryAccessError):
        backend.resolve(allocation.start + 100, 901, "test")
    backend.free(allocation.start, "free")
    with pytest.raises(MemoryAccessError, match="use after free"):
        backend.resolve(allocation.start, 1, "test")


def _need_two(backend):
    if backend.device_count < 2:
        pytest.skip("needs 2 devices")


def test_bytes_move(backend):
    _need_two(backend)
    a = backend.allocate(0, 4096, 4096, MallocPolicy.HUGE_FIRST, "malloc")
    b = backend.allocate(1, 4096, 4096, MallocPolicy.HUGE_FIRST, "malloc")
    source = np.arange(4096, dtype=np.uint8)
    backend.write(backend.resolve(a.start, 4096, "t"), source.ctypes.data)
    backend.copy(backend.resolve(b.start + 96, 1000, "t"), backend.resolve(a.start, 1000, "t"))
    backend.fill(backend.resolve(b.start, 96, "t"), 0xFF)
    out = np.zeros(1096, dtype=np.uint8)
    backend.read(out.ctypes.data, backend.resolve(b.start, 1096, "t"))
    assert out[:96].tolist() == [255] * 96
    assert np.array_equal(out[96:], source[:1000])


def test_overlapping_device_copy(backend):
    a = backend.allocate(0, 256, 256, MallocPolicy.HUGE_FIRST, "malloc")
    data = np.arange(256, dtype=np.uint8)
    backend.write(backend.resolve(a.start, 256, "t"), data.ctypes.data)
    backend.copy(backend.resolve(a.start + 1, 200, "t"), backend.resolve(a.start, 200, "t"))
    out = np.zeros(256, dtype=np.uint8)
    backend.read(out.ctypes.data, backend.resolve(a.start, 256, "t"))
    assert np.array_equal(out[1:201], data[:200])


def test_byte_movers_refuse_freed_ranges(backend):
    a = backend.allocate(0, 64, 64, MallocPolicy.HUGE_FIRST, "malloc")
    span = backend.resolve(a.start, 64, "t")
    backend.free(a.start, "free")
    buffer = ctypes.create_string_buffer(64)
    with pytest.raises(MemoryAccessError, match="use after free"):
        backend.read(ctypes.addressof(buffer), span)


def test_release_device_frees_everything_and_reports_it(backend):
    _need_two(backend)
    made = [backend.allocate(1, n, n, MallocPolicy.HUGE_FIRST, "malloc") for n in (64, 4096, 3 * MiB)]
    kept = backend.allocate(0, 64, 64, MallocPolicy.HUGE_FIRST, "malloc")
    assert backend.release_device(1) == made
    assert backend.live_allocations(1) == [] and backend.live_allocations(0) == [kept]
    assert backend.mem_info(1, MemAttr.HBM_MEM)[0] == backend.mem_info(1, MemAttr.HBM_MEM)[1]


def test_invalid_device(backend):
    with pytest.raises(InvalidDeviceError):
        backend.allocate(backend.device_count, 64, 64, MallocPolicy.HUGE_FIRST, "malloc")
    with pytest.raises(InvalidDeviceError):
        backend.mem_info(-1, MemAttr.HBM_MEM)


def _finish_device_work(backend) -> None:
    """Backend calls made outside a stream run on the GPU's current stream: wait for them."""
    if backend.name == "torch:cuda":
        backend.torch.cuda.synchronize()


def test_registered_host_memory_is_shared_not_copied(backend):
    from npumem.device.address_index import Allocation
    from npumem.device.backing import address_of

    buffer = backend.allocate_host(4096)        # what malloc_host gives (page-locked on cuda)
    buffer[:] = 0
    host = Allocation(start=address_of(buffer), size=4096, reserved=4096, api="malloc_host",
                      device=-1, buffer=buffer, host_address=address_of(buffer))
    free_before = _whole(backend)[0]
    mapped = backend.register_host(0, host, 1024, 2048)
    assert _whole(backend)[0] == free_before            # costs the device nothing
    rng = backend.resolve(mapped.start + 16, 32, "test")
    backend.fill(rng, 7)
    _finish_device_work(backend)
    assert (buffer[1024 + 16:1024 + 48] == 7).all() and buffer[1024:1024 + 16].sum() == 0
    buffer[1024] = 5
    seen = np.zeros(1, dtype=np.uint8)
    backend.read(seen.ctypes.data, backend.resolve(mapped.start, 1, "test"))
    assert seen[0] == 5                                  # the device reads the host byte itself
    with pytest.raises(MemoryAccessError, match="past the end"):
        backend.resolve(mapped.start, 2049, "test")
    with pytest.raises(MemoryFreeError, match="host_unregister"):
        backend.free(mapped.start, "free")
    backend.free(mapped.start, "host_unregister")
    assert host.extra["registered"] == [] and backend.live_allocations(0) == []
