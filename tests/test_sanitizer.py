"""Sanitizer-grade checks: out-of-bounds and use-after-free name the address, the nearest
allocation and how far off the access is; nothing is touched when a check fails."""

import re

import pytest

import npumem
from npumem import MemcpyKind as K
from npumem import errors as E

from .conftest import read_device


@pytest.fixture
def rt(any_rt):
    """This module is a conformance suite: every test runs on each backend (conftest.BACKENDS)."""
    return any_rt



def _error(call, *args):
    with pytest.raises(E.MemoryAccessError) as info:
        call(*args)
    assert info.value.code == E.ACL_ERROR_RT_PARAM_INVALID
    return str(info.value)


def test_copy_past_the_end_of_an_allocation(rt):
    pointer = npumem.malloc(100)
    npumem.memset(pointer, 100, 1, 100)
    message = _error(npumem.memcpy, pointer + 60, 64, b"x" * 64, 64, K.HOST_TO_DEVICE)
    assert f"0x{pointer + 60:x}" in message
    assert f"allocation 0x{pointer:x} of 100 bytes" in message
    assert "run 24 bytes past the end" in message and "offset 60" in message
    assert read_device(pointer, 100) == b"\x01" * 100


def test_read_past_the_end_and_memset_past_the_end(rt):
    pointer = npumem.malloc(64)
    assert "run 1 bytes past the end" in _error(npumem.memcpy, bytearray(65), 65, pointer, 65, K.DEVICE_TO_HOST)
    assert "run 36 bytes past the end" in _error(npumem.memset, pointer + 32, 68, 0, 68)


def test_the_padding_is_not_usable(rt):
    # malloc(100) reserves ALIGN_UP(100, 32) + 32 = 160 bytes, but only 100 belong to the caller.
    pointer = npumem.malloc(100)
    _error(npumem.memset, pointer + 100, 1, 0, 1)


def test_address_between_allocations_names_the_nearest(rt):
    first = npumem.malloc(4096)
    second = npumem.malloc(4096)
    message = _error(npumem.memset, first + 4096 + 10, 8, 0, 8)
    assert "not inside any live allocation" in message
    assert f"11 bytes past the last byte of malloc allocation 0x{first:x}" in message
    message = _error(npumem.memset, second - 16, 8, 0, 8)
    assert f"16 bytes before malloc allocation 0x{second:x}" in message


def test_use_after_free(rt):
    pointer = npumem.malloc(256)
    npumem.free(pointer)
    message = _error(npumem.memcpy, bytearray(16), 16, pointer + 32, 16, K.DEVICE_TO_HOST)
    assert f"inside malloc allocation 0x{pointer:x} of 256 bytes" in message
    assert "freed" in message and "use after free" in message


def test_use_after_free_on_another_device_and_after_newer_allocations(rt):
    stale = npumem.malloc(64)
    npumem.free(stale)
    for _ in range(10):
        npumem.malloc(64)                        # addresses are never reused
    assert "use after free" in _error(npumem.memset, stale, 64, 0, 64)


def test_pinned_host_memory_is_bounds_checked_too(rt):
    pinned = npumem.malloc_host(128)
    device = npumem.malloc(256)
    message = _error(npumem.memcpy, device, 256, pinned, 256, K.HOST_TO_DEVICE)
    assert "malloc_host allocation" in message and "run 128 bytes past the end" in message


def test_device_to_device_checks_both_ends(rt):
    small, large = npumem.malloc(64), npumem.malloc(4096)
    assert "source" in _error(npumem.memcpy, large, 4096, small, 128, K.DEVICE_TO_DEVICE)
    assert "destination" in _error(npumem.memcpy, small, 4096, large, 128, K.DEVICE_TO_DEVICE)


def test_async_copy_is_checked_when_queued(rt):
    pointer = npumem.malloc(64)
    pinned = npumem.malloc_host(128)
    stream = npumem.create_stream()
    _error(npumem.memcpy_async, pointer, 128, pinned, 128, K.HOST_TO_DEVICE, stream)
    npumem.synchronize_stream(stream)


def test_messages_are_one_readable_sentence(rt):
    pointer = npumem.malloc(10)
    message = _error(npumem.memset, pointer + 8, 4, 0, 4)
    assert re.match(r"^memset: 4 bytes at 0x[0-9a-f]+ run 2 bytes past the end of malloc allocation", message)
    assert message.endswith("[ACL_ERROR_RT_PARAM_INVALID 107000]")
