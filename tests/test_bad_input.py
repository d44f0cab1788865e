"""Every bad input named in the foundation issue: a clear error, the right ACL code, nothing lost."""

import numpy as np
import pytest

import npumem
from npumem import MallocPolicy as P, MemAttr, MemcpyKind as K
from npumem import errors as E
from npumem.device import SimBackend, SimConfig
from npumem.units import MiB

from .conftest import pattern, read_device


class Sentinels:
    """Allocations with known contents; `check()` proves a failed call changed nothing."""

    def __init__(self):
        self.device = {npumem.malloc(n): pattern(n, seed=n) for n in (100, 5000, 3 << 20)}
        self.pinned = npumem.malloc_host(256)
        npumem.memcpy(self.pinned, 256, pattern(256, 9), 256, K.HOST_TO_HOST)
        for pointer, data in self.device.items():
            npumem.memcpy(pointer, len(data), data, len(data), K.HOST_TO_DEVICE)
        self.info = npumem.get_mem_info(MemAttr.HBM_MEM)
        self.live = len(npumem.RUNTIME.backend.live_allocations(0))

    def check(self):
        for pointer, data in self.device.items():
            assert read_device(pointer, len(data)) == data
        host = bytearray(256)
        npumem.memcpy(host, 256, self.pinned, 256, K.HOST_TO_HOST)
        assert bytes(host) == pattern(256, 9)
        assert npumem.get_mem_info(MemAttr.HBM_MEM) == self.info
        assert len(npumem.RUNTIME.backend.live_allocations(0)) == self.live


@pytest.fixture
def intact(rt):
    sentinels = Sentinels()
    yield sentinels
    sentinels.check()


def _fails(error, code, call, *args, match=None):
    with pytest.raises(error, match=match) as info:
        call(*args)
    assert info.value.code == code
    return str(info.value)


@pytest.mark.parametrize("size", [0, -1, -4096])
@pytest.mark.parametrize("api", [npumem.malloc, npumem.malloc_align32, npumem.malloc_cached,
                                 npumem.malloc_host, npumem.dvpp_malloc])
def test_size_zero_or_negative(intact, api, size):
    _fails(E.InvalidParamError, E.ACL_ERROR_INVALID_PARAM, api, size, match="positive")


@pytest.mark.parametrize("size", ["10", 3.5, None])
def test_size_of_the_wrong_type(intact, size):
    _fails(E.InvalidParamError, E.ACL_ERROR_INVALID_PARAM, npumem.malloc, size, match="integer")


def test_size_above_capacity_reports_asked_free_total(intact):
    message = _fails(E.MemoryAllocationError, E.ACL_ERROR_RT_MEMORY_ALLOCATION, npumem.malloc, 300 * MiB)
    assert "314572800" in message              # asked
    assert "available" in message and "256.00 MiB" in message   # free and total


@pytest.mark.parametrize("policy", [8, -1, 99])
def test_unknown_policy(intact, policy):
    message = _fails(E.InvalidParamError, E.ACL_ERROR_INVALID_PARAM, npumem.malloc, 64, policy)
    assert "HUGE_FIRST=0" in message


@pytest.mark.parametrize("kind", [8, -1, 42])
def test_unknown_memcpy_kind(intact, kind):
    device = next(iter(intact.device))
    _fails(E.InvalidParamError, E.ACL_ERROR_INVALID_PARAM, npumem.memcpy, device, 64, b"x" * 64, 64, kind)


def test_kind_that_contradicts_the_pointers(intact):
    device = next(iter(intact.device))
    message = _fails(E.InvalidParamError, E.ACL_ERROR_INVALID_PARAM,
                     npumem.memcpy, device, 64, b"x" * 64, 64, K.DEVICE_TO_HOST)
    assert "HOST_TO_DEVICE" in message


def test_count_above_dest_max(intact):
    device = next(iter(intact.device))
    message = _fails(E.InvalidParamError, E.ACL_ERROR_INVALID_PARAM,
                     npumem.memcpy, device, 50, b"x" * 64, 64, K.HOST_TO_DEVICE)
    assert "count=64 exceeds dest_max=50" in message


def test_count_above_max_count(intact):
    device = next(iter(intact.device))
    message = _fails(E.InvalidParamError, E.ACL_ERROR_INVALID_PARAM, npumem.memset, device, 10, 0, 11)
    assert "count=11 exceeds max_count=10" in message


@pytest.mark.parametrize("value", [-1, 256, 1000])
def test_memset_value_out_of_byte_range(intact, value):
    device = next(iter(intact.device))
    _fails(E.InvalidParamError, E.ACL_ERROR_INVALID_PARAM, npumem.memset, device, 10, value, 10)


def test_misaligned_memcpy_async(intact):
    device = next(iter(intact.device))
    pinned = intact.pinned
    message = _fails(E.AddressUnalignedError, E.ACL_ERROR_RT_ADDR_UNALIGNED,
                     npumem.memcpy_async, device + 32, 64, pinned, 64, K.HOST_TO_DEVICE)
    assert "64-byte aligned" in message and "32 bytes past" in message
    _fails(E.AddressUnalignedError, E.ACL_ERROR_RT_ADDR_UNALIGNED,
           npumem.memcpy_async, device, 64, pinned + 8, 64, K.HOST_TO_DEVICE)


def test_async_host_to_host_is_not_supported(intact):
    other = npumem.malloc_host(64)
    _fails(E.FeatureNotSupportedError, 207000,
           npumem.memcpy_async, other, 64, intact.pinned, 64, K.HOST_TO_HOST)
    npumem.free_host(other)


@pytest.mark.parametrize("host", ["numpy", "memoryview", "pointer"])
def test_async_copy_needs_pinned_host_memory(intact, host):
    device = next(iter(intact.device))
    array = np.zeros(4096 + 64, dtype=np.uint8)
    aligned = array[-array.ctypes.data % 64:][:64]
    source = {"numpy": aligned, "memoryview": memoryview(aligned), "pointer": aligned.ctypes.data}[host]
    message = _fails(E.InvalidMemoryTypeError, E.ACL_ERROR_RT_INVALID_MEMORY_TYPE,
                     npumem.memcpy_async, device, 64, source, 64, K.HOST_TO_DEVICE)
    assert "malloc_host" in message


def test_calls_before_init():
    for call, args in [(npumem.malloc, (64,)), (npumem.set_device, (0,)), (npumem.create_stream, ()),
                       (npumem.malloc_host, (64,)), (npumem.get_mem_info, (1,)), (npumem.free, (64,))]:
        _fails(E.UninitializedError, E.ACL_ERROR_UNINITIALIZE, call, *args, match="init")


def test_calls_after_finalize(rt):
    pointer = npumem.malloc(64)
    with pytest.warns(E.LiveAllocationsWarning):
        npumem.finalize()
    _fails(E.UninitializedError, E.ACL_ERROR_UNINITIALIZE, npumem.malloc, 64)
    _fails(E.UninitializedError, E.ACL_ERROR_UNINITIALIZE, npumem.free, pointer)


def test_repeated_init_and_finalize(rt):
    _fails(E.RepeatInitializeError, E.ACL_ERROR_REPEAT_INITIALIZE, npumem.init)
    npumem.finalize()
    _fails(E.RepeatFinalizeError, E.ACL_ERROR_REPEAT_FINALIZE, npumem.finalize)


@pytest.mark.parametrize("device", [-1, 2, 64, "0", None])
def test_invalid_device_id(intact, device):
    message = _fails(E.InvalidDeviceError, E.ACL_ERROR_RT_INVALID_DEVICEID, npumem.set_device, device)
    assert "ids 0..1" in message
    _fails(E.InvalidDeviceError, E.ACL_ERROR_RT_INVALID_DEVICEID, npumem.reset_device, device)
    _fails(E.InvalidDeviceError, E.ACL_ERROR_RT_INVALID_DEVICEID, npumem.create_context, device)


def test_destroyed_stream(intact):
    stream = npumem.create_stream()
    npumem.destroy_stream(stream)
    device = next(iter(intact.device))
    for call, args in [(npumem.synchronize_stream, (stream,)), (npumem.destroy_stream, (stream,)),
                       (npumem.memcpy_async, (device, 64, intact.pinned, 64, K.HOST_TO_DEVICE, stream)),
                       (npumem.memcpy_async, (device, 64, intact.pinned, 64, K.HOST_TO_DEVICE, stream.handle)),
                       (npumem.record_event, (npumem.create_event(), stream))]:
        _fails(E.InvalidHandleError, E.ACL_ERROR_RT_PARAM_INVALID, call, *args, match="destroyed")


def test_destroyed_event(intact):
    event = npumem.create_event()
    npumem.destroy_event(event)
    for call, args in [(npumem.record_event, (event,)), (npumem.query_event, (event,)),
                       (npumem.synchronize_event, (event,)), (npumem.stream_wait_event, (None, event)),
                       (npumem.destroy_event, (event,))]:
        _fails(E.InvalidHandleError, E.ACL_ERROR_RT_PARAM_INVALID, call, *args, match="destroyed")


def test_unknown_handles(intact):
    _fails(E.InvalidHandleError, E.ACL_ERROR_RT_PARAM_INVALID, npumem.synchronize_stream, 12345)
    _fails(E.InvalidHandleError, E.ACL_ERROR_RT_PARAM_INVALID, npumem.query_event, "event")


def test_free_of_a_host_pointer(intact):
    message = _fails(E.MemoryFreeError, E.ACL_ERROR_RT_MEMORY_FREE, npumem.free, intact.pinned)
    assert "free_host" in message
    array = np.zeros(10)
    _fails(E.MemoryFreeError, E.ACL_ERROR_RT_MEMORY_FREE, npumem.free, array.ctypes.data)


def test_free_host_of_a_device_pointer(intact):
    device = next(iter(intact.device))
    message = _fails(E.MemoryFreeError, E.ACL_ERROR_RT_MEMORY_FREE, npumem.free_host, device)
    assert "release it with free" in message


def test_double_free_and_unknown_pointers(intact):
    pointer = npumem.malloc(64)
    npumem.free(pointer)
    assert "double free" in _fails(E.MemoryFreeError, E.ACL_ERROR_RT_MEMORY_FREE, npumem.free, pointer)
    inner = next(iter(intact.device)) + 64
    assert "start address" in _fails(E.MemoryFreeError, E.ACL_ERROR_RT_MEMORY_FREE, npumem.free, inner)
    pinned = npumem.malloc_host(64)
    npumem.free_host(pinned)
    assert "double free" in _fails(E.MemoryFreeError, E.ACL_ERROR_RT_MEMORY_FREE, npumem.free_host, pinned)


def test_huge_only_when_huge_pages_are_exhausted():
    npumem.init(backend=SimBackend(SimConfig(memory=64 * MiB, huge_memory=8 * MiB)))
    npumem.set_device(0)
    sentinels = Sentinels()                    # takes 4 MiB of huge pages
    message = _fails(E.MemoryAllocationError, E.ACL_ERROR_RT_MEMORY_ALLOCATION,
                     npumem.malloc, 6 * MiB, P.HUGE_ONLY)
    assert "huge pages: 4.00 MiB available of 8.00 MiB" in message and "HUGE_FIRST" in message
    sentinels.check()
    npumem.free(npumem.malloc(6 * MiB, P.HUGE_FIRST))   # falls back to normal pages
    sentinels.check()


def test_device_memory_needs_a_current_device():
    npumem.init(backend=SimBackend(SimConfig(memory=64 * MiB)))
    _fails(E.ContextNullError, E.ACL_ERROR_RT_CONTEXT_NULL, npumem.malloc, 64, match="set_device")


def test_read_only_destination(intact):
    device = next(iter(intact.device))
    _fails(E.InvalidParamError, E.ACL_ERROR_INVALID_PARAM,
           npumem.memcpy, b"\x00" * 64, 64, device, 64, K.DEVICE_TO_HOST, match="read-only")


def test_host_buffer_smaller_than_count(intact):
    device = next(iter(intact.device))
    _fails(E.InvalidParamError, E.ACL_ERROR_INVALID_PARAM,
           npumem.memcpy, device, 100, b"x" * 10, 100, K.HOST_TO_DEVICE, match="holds 10 bytes")


def test_non_contiguous_host_array(intact):
    device = next(iter(intact.device))
    strided = np.zeros(200, dtype=np.uint8)[::2]
    _fails(E.InvalidParamError, E.ACL_ERROR_INVALID_PARAM,
           npumem.memcpy, device, 100, strided, 100, K.HOST_TO_DEVICE, match="contiguous")


NOWHERE = (1 << 48) + 5 * (1 << 46)          # device 5's address range; the runtime has 2 devices


@pytest.mark.parametrize("call", [
    lambda: npumem.memcpy(np.zeros(64, np.uint8), 64, NOWHERE, 64, K.HOST_TO_HOST),
    lambda: npumem.memcpy(np.zeros(64, np.uint8), 64, NOWHERE, 64, K.DEFAULT),
    lambda: npumem.memcpy(NOWHERE, 64, np.zeros(64, np.uint8), 64, K.DEFAULT),
    lambda: npumem.memset(NOWHERE, 64, 0, 64),
    lambda: npumem.memcpy_async(NOWHERE, 64, NOWHERE + 64, 64, K.DEVICE_TO_DEVICE, None),
], ids=["host-to-host", "default-from", "default-to", "memset", "async"])
def test_an_address_of_a_device_that_does_not_exist_is_never_touched(intact, call):
    message = _fails(E.MemoryAccessError, 107000, call)
    assert "device 5, which does not exist" in message


@pytest.mark.parametrize("size", [4096, 4 << 20])
def test_a_freed_malloc_host_pointer_is_use_after_free_not_a_corrupted_heap(intact, size):
    stale = npumem.malloc_host(size)
    npumem.free_host(stale)
    host = np.ones(size, np.uint8)
    for call in (lambda: npumem.memcpy(stale, size, host, size, K.HOST_TO_HOST),
                 lambda: npumem.memcpy(host, size, stale, size, K.HOST_TO_HOST),
                 lambda: npumem.memset(stale, size, 0, size)):
        assert "released with free_host: use after free" in _fails(E.MemoryAccessError, 107000, call)
    assert host.sum() == size


@pytest.mark.parametrize("pointer", [0x1234, 0x7F0000000000 - 4096])
def test_an_unmapped_host_pointer_is_refused_before_it_is_touched(intact, pointer):
    host = np.zeros(64, np.uint8)
    message = _fails(E.MemoryAccessError, 107000, npumem.memcpy, host, 64, pointer, 64, K.HOST_TO_HOST)
    assert "not readable memory of this process" in message
    assert "not writable" in _fails(E.MemoryAccessError, 107000, npumem.memcpy, pointer, 64, host,
                                    64, K.HOST_TO_HOST)


def test_the_quarantine_is_bounded_and_released_at_finalize(rt):
    from npumem.runtime.hostmem import PinnedHostMemory

    pinned = PinnedHostMemory(quarantine_bytes=3 * 4096)
    freed = [pinned.free(pinned.allocate(4096).start) for _ in range(5)]
    assert [a.buffer is None for a in freed] == [True, True, False, False, False]   # oldest go
    assert pinned.find_freed(freed[-1].start + 100) is freed[-1]
    assert pinned.find_freed(freed[0].start) is not freed[0]     # its address may be reused now
    pinned.release_all()
    assert all(a.buffer is None for a in freed) and pinned.find_freed(freed[-1].start) is None


@pytest.mark.parametrize("pointer", [None, "x", 1.5, True])
def test_pool_calls_refuse_a_pointer_that_is_not_an_integer_with_the_code(intact, pointer):
    import npumem.memory as mem

    for call in (mem.caching_allocator_delete, lambda p: mem.record_stream(p, None)):
        assert "must be an integer" in _fails(E.InvalidParamError, 100000, call, pointer)


def test_numpy_integers_are_integers(rt):
    import npumem.memory as mem

    npumem.set_device(np.int64(1))
    assert npumem.get_device() == 1 and type(npumem.get_device()) is int
    pointer = mem.caching_allocator_alloc(np.int32(64))
    mem.caching_allocator_delete(np.int64(pointer))
    npumem.free(npumem.malloc(np.uint16(100)))
    npumem.reset_device(np.int64(1))


@pytest.mark.parametrize("timeout", [-1, "x", float("nan"), float("inf"), True])
def test_a_bad_timeout_is_refused(intact, timeout):
    stream = npumem.create_stream()
    event = npumem.create_event()
    _fails(E.InvalidParamError, 100000, npumem.synchronize_stream, stream, timeout)
    _fails(E.InvalidParamError, 100000, npumem.synchronize_event, event, timeout)
    npumem.destroy_stream(stream)


def test_malloc_host_beyond_the_machines_ram_is_refused(intact):
    message = _fails(E.MemoryAllocationError, 207001, npumem.malloc_host, 1 << 50)
    assert "more than this machine's" in message
