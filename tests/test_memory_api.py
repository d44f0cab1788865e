"""malloc family, pinned host memory, memset and memcpy in all four directions."""

import ctypes

import numpy as np
import pytest

import npumem
from npumem import MemAttr, MemcpyKind as K
from npumem.units import align_up

from .conftest import need_devices, pattern, read_device, write_device


@pytest.fixture
def rt(any_rt):
    """This module is a conformance suite: every test runs on each backend (conftest.BACKENDS)."""
    return any_rt



def _allocation(pointer):
    return npumem.RUNTIME.backend.resolve(pointer, 0, "test").allocation


@pytest.mark.parametrize("size", [1, 31, 32, 33, 100, 4096, 1 << 20, (1 << 20) + 1, 5_000_000])
def test_malloc_size_and_alignment_rules(rt, size):
    for api, padding in ((npumem.malloc, 32), (npumem.malloc_align32, 0), (npumem.malloc_cached, 32)):
        pointer = api(size)
        allocation = _allocation(pointer)
        assert pointer % 64 == 0
        assert allocation.reserved == align_up(size, 32) + padding
        assert allocation.size == size
        npumem.free(pointer)


def test_dvpp_memory_is_128_aligned_and_needs_dvpp_free(rt):
    pointers = [npumem.dvpp_malloc(n) for n in (1, 100, 3000, 2 << 20)]
    assert all(p % 128 == 0 for p in pointers)
    with pytest.raises(npumem.errors.MemoryFreeError, match="dvpp_free"):
        npumem.free(pointers[0])
    for pointer in pointers:
        npumem.dvpp_free(pointer)


def test_malloc_host_is_pinned_aligned_and_writable(rt):
    pointer = npumem.malloc_host(1000)
    assert pointer % 64 == 0
    ctypes.memset(pointer, 7, 1000)
    assert ctypes.string_at(pointer, 1000) == b"\x07" * 1000
    npumem.free_host(pointer)


@pytest.mark.parametrize("host_kind", ["numpy", "bytes", "bytearray", "memoryview", "pointer", "pinned"])
def test_memcpy_round_trip_with_every_host_argument_kind(rt, host_kind):
    data = pattern(5000, seed=1)
    keep = np.frombuffer(data, dtype=np.uint8).copy()
    sources = {
        "numpy": keep, "bytes": data, "bytearray": bytearray(data), "memoryview": memoryview(data),
        "pointer": keep.ctypes.data,
    }
    if host_kind == "pinned":
        pinned = npumem.malloc_host(5000)
        npumem.memcpy(pinned, 5000, data, 5000, K.HOST_TO_HOST)
        sources["pinned"] = pinned
    device = npumem.malloc(5000)
    npumem.memcpy(device, 5000, sources[host_kind], 5000, K.HOST_TO_DEVICE)
    out = np.zeros(5000, dtype=np.uint8)
    npumem.memcpy(out, 5000, device, 5000, K.DEVICE_TO_HOST)
    assert out.tobytes() == data


def test_all_four_directions_and_default_inference(rt):
    data = pattern(4096, seed=2)
    a, b = npumem.malloc(4096), npumem.malloc(4096)
    host = bytearray(4096)
    npumem.memcpy(host, 4096, data, 4096, K.HOST_TO_HOST)
    npumem.memcpy(a, 4096, host, 4096, K.HOST_TO_DEVICE)
    npumem.memcpy(b, 4096, a, 4096, K.DEVICE_TO_DEVICE)
    back = bytearray(4096)
    npumem.memcpy(back, 4096, b, 4096, K.DEVICE_TO_HOST)
    assert bytes(back) == data
    again = bytearray(4096)
    npumem.memcpy(b, 4096, data[::-1], 4096, K.DEFAULT)
    npumem.memcpy(again, 4096, b, 4096, K.DEFAULT)
    assert bytes(again) == data[::-1]


def test_device_to_device_across_devices(rt):
    need_devices(2)
    a = npumem.malloc(256)
    write_device(a, pattern(256, 3))
    npumem.set_device(1)
    b = npumem.malloc(256)
    npumem.memcpy(b, 256, a, 256, K.DEVICE_TO_DEVICE)
    assert read_device(b, 256) == pattern(256, 3)


def test_memset_device_and_host(rt):
    device = npumem.malloc(1000)
    npumem.memset(device, 1000, 0xAB, 1000)
    npumem.memset(device + 10, 990, 0, 20)
    assert read_device(device, 40) == b"\xab" * 10 + b"\x00" * 20 + b"\xab" * 10
    host = npumem.malloc_host(64)
    npumem.memset(host, 64, 1, 64)             # the seed article memsets host memory too
    assert ctypes.string_at(host, 64) == b"\x01" * 64
    array = np.zeros(16, dtype=np.uint8)
    npumem.memset(array, 16, 9, 8)
    assert array.tolist() == [9] * 8 + [0] * 8


def test_count_zero_is_a_no_op(rt):
    device = npumem.malloc(64)
    npumem.memcpy(device, 64, b"", 0, K.HOST_TO_DEVICE)
    npumem.memset(device, 64, 1, 0)


def test_mem_info_reflects_use(rt):
    free0, total = npumem.get_mem_info(MemAttr.HBM_MEM)
    pointers = [npumem.malloc(3 << 20) for _ in range(3)]
    free1, _ = npumem.get_mem_info(MemAttr.HBM_MEM)
    backend = npumem.get_backend()
    assert free0 - free1 >= 3 * ((3 << 20) + 32)
    if backend.name == "sim":
        assert free0 - free1 == 3 * (4 << 20)           # 3 MiB + 32 B -> two huge pages each
    for pointer in pointers:
        npumem.free(pointer)
    assert npumem.get_mem_info(MemAttr.HBM_MEM) == (free0, total)


def test_run_mode_is_host(rt):
    assert npumem.get_run_mode() == npumem.RunMode.HOST


def test_mem_flush_and_invalidate_check_the_range(rt):
    pointer = npumem.malloc_cached(4096)
    npumem.mem_flush(pointer, 4096)
    npumem.mem_invalidate(pointer + 64, 1024)
    with pytest.raises(npumem.errors.MemoryAccessError):
        npumem.mem_flush(pointer, 8192)


def test_numpy_integer_pointers_are_accepted(rt):
    pointer = npumem.malloc(64)
    write_device(int(np.uint64(pointer)), b"x" * 64)
    npumem.free(np.int64(pointer))
