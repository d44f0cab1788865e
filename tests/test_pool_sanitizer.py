"""The sanitizer inside the caching pool (NPUMEM_SANITIZE=1, on for the suite): the seven buggy
programs of issue 19 that used to pass silently. Each bug is reported with the block, and the
memory around it is left as it was. A conformance module: every backend.

The programs the cheap level (NPUMEM_SANITIZE=free) catches too run at both levels; the ones it
does not claim are in tests/test_sanitize_levels.py, shown passing silently there."""

import numpy as np
import pytest

import npumem
from npumem import MemcpyKind as K
from npumem import errors as E
from npumem.device import sanitizer
from npumem.memory import caching_allocator_alloc, caching_allocator_delete, record_stream
from npumem.ops import aclnn

from .conftest import read_device


@pytest.fixture
def rt(any_rt):
    assert sanitizer.SANITIZER.on, "the suite runs with NPUMEM_SANITIZE=1 (tests/conftest.py)"
    return any_rt


@pytest.fixture
def level(request):
    """The pool sanitizer at level `request.param` for one test, as it was after it."""
    was = sanitizer.SANITIZER.level
    sanitizer.enable(request.param)
    yield request.param
    sanitizer.enable(was) if was != "off" else sanitizer.disable()


BOTH_LEVELS = pytest.mark.parametrize("level", ["full", "free"], indirect=True)
FULL_LEVEL = pytest.mark.parametrize("level", ["full"], indirect=True)   # free: not claimed


def _refused(call, *args) -> str:
    with pytest.raises(E.MemoryAccessError) as info:
        call(*args)
    return str(info.value)


def _neighbours():
    """A block on each side of the next allocation, filled with 0x5A, and a check for them."""
    below = caching_allocator_alloc(4096)
    npumem.memset(below, 4096, 0x5A, 4096)

    def intact():
        assert read_device(below, 4096) == b"\x5a" * 4096
    return intact


@FULL_LEVEL
def test_a_one_byte_overrun_of_a_pool_block(rt, level):
    intact = _neighbours()
    pointer = caching_allocator_alloc(100)
    message = _refused(npumem.memset, pointer, 101, 0xFF, 101)
    assert "run 1 bytes past the end of pool block" in message and "of 100 bytes" in message
    npumem.memset(pointer, 100, 0xFF, 100)                       # the block itself is fine
    intact()


@FULL_LEVEL
def test_an_over_read_past_a_tensor(rt, level):
    tensor = npumem.from_numpy(np.arange(25, dtype=np.float32))
    message = _refused(npumem.memcpy, bytearray(104), 104, tensor.storage.pointer, 104, K.DEVICE_TO_HOST)
    assert "run 4 bytes past the end of pool block" in message


@BOTH_LEVELS
def test_a_read_after_caching_allocator_delete(rt, level):
    pointer = caching_allocator_alloc(256)
    caching_allocator_delete(pointer)
    message = _refused(npumem.memcpy, bytearray(16), 16, pointer, 16, K.DEVICE_TO_HOST)
    assert "use after free" in message and f"0x{pointer:x}" in message


@BOTH_LEVELS
def test_a_double_free_names_the_block(rt, level):
    intact = _neighbours()
    pointer = caching_allocator_alloc(256)
    caching_allocator_delete(pointer)
    with pytest.raises(E.MemoryFreeError) as info:
        caching_allocator_delete(pointer)
    message = str(info.value)
    assert "double free" in message and f"0x{pointer:x}" in message and "pool" in message
    intact()


@BOTH_LEVELS
def test_a_stale_view_after_storage_free(rt, level):
    tensor = npumem.from_numpy(np.zeros(64, dtype=np.float32))
    view = tensor[0:8]
    tensor.storage.free()
    other = npumem.from_numpy(np.full(64, 7, dtype=np.float32))   # takes the freed block
    assert other.storage.pointer == view.storage.pointer
    assert "stale tensor" in _refused(view.numpy)
    out = npumem.empty((8,), "float32")
    with pytest.raises(E.MemoryAccessError, match="stale tensor"):
        aclnn.run_with_pool_workspace(aclnn.add, aclnn.add_get_workspace_size(view, view, 1, out))
    assert (other.numpy() == 7).all()                              # the new owner's data


@BOTH_LEVELS
def test_hand_freeing_a_tensors_storage_is_refused(rt, level):
    tensor = npumem.from_numpy(np.arange(16, dtype=np.float32))
    with pytest.raises(E.MemoryFreeError, match="storage of a tensor"):
        caching_allocator_delete(tensor.storage.pointer)
    assert (tensor.numpy() == np.arange(16)).all()                 # nothing changed
    del tensor                                                      # its own free still works


@BOTH_LEVELS
def test_a_pool_workspace_too_small_for_its_kernel(rt, level):
    a = npumem.from_numpy(np.ones(1024, dtype=np.float32))
    out = npumem.empty((1024,), "float32")
    need, executor = aclnn.add_get_workspace_size(a, a, 2.0, out)  # alpha * other: 4096 bytes
    assert need == 4096
    intact = _neighbours()
    workspace = caching_allocator_alloc(64)                          # far too small
    message = _refused(aclnn.add, workspace, need, executor)
    assert "workspace" in message and "past the end of pool block" in message
    intact()


@FULL_LEVEL
@pytest.mark.parametrize("recorded", [False, True])
def test_a_cross_stream_free_without_record_stream(rt, level, recorded):
    """Freed on stream A (and reused there) while work queued on B still reads it: B fails, and
    record_stream(pointer, B) is the cure."""
    stream_a, stream_b = npumem.create_stream(), npumem.create_stream()
    gate = npumem.create_event()
    nbytes = 1 << 20
    pointer = caching_allocator_alloc(nbytes, stream=stream_a)
    npumem.memset(pointer, nbytes, 1, nbytes)
    npumem.synchronize_stream(stream_a)
    out = npumem.malloc_host(nbytes)
    npumem.stream_wait_event(stream_b, gate)               # B's copy waits behind the gate
    npumem.memcpy_async(out, nbytes, pointer, nbytes, K.DEVICE_TO_HOST, stream_b)
    if recorded:
        record_stream(pointer, stream_b)
    caching_allocator_delete(pointer)
    reused = caching_allocator_alloc(nbytes, stream=stream_a)
    npumem.record_event(gate, stream_a)
    if recorded:
        assert reused != pointer                           # the block waits for B's copy
        npumem.synchronize_stream(stream_b)
    else:
        assert reused == pointer
        with pytest.raises(E.AclError, match="call record_stream"):
            npumem.synchronize_stream(stream_b)
    caching_allocator_delete(reused)
    npumem.free_host(out)
    npumem.destroy_event(gate)


@BOTH_LEVELS
def test_stream_ordered_frees_on_the_blocks_own_stream_are_not_reported(rt, level):
    """A workspace freed right after its op is queued, on the same stream, is correct."""
    stream = npumem.create_stream()
    a = npumem.from_numpy(np.ones(1024, dtype=np.float32), stream)
    out = npumem.empty((1024,), "float32", stream=stream)
    aclnn.run_with_pool_workspace(aclnn.add, aclnn.add_get_workspace_size(a, a, 2.0, out), stream)
    npumem.synchronize_stream(stream)
    assert (out.numpy() == 3).all()
