"""The pool sanitizer's levels (issue 41): NPUMEM_SANITIZE=free catches use after free and double
free in the pools from what the pools keep anyway (no work per allocation), NPUMEM_SANITIZE=1
(full) checks every access against each block's requested bytes. Each bug the free level claims
is caught with the block named, and leaves the pool sound and live data intact; the bugs it does
not claim are shown passing silently, so that the docs' list of them stays true."""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import npumem
from npumem import MemcpyKind as K
from npumem import errors as E
from npumem.device import SimBackend, sanitizer
from npumem.environment_check import problems
from npumem.memory import caching_allocator_alloc, caching_allocator_delete, get_allocator
from npumem.observe import OBSERVERS
from npumem.ops import aclnn

from .conftest import SMALL_SIM, read_device


@pytest.fixture(params=["expandable", "segments"])
def free_level(request, monkeypatch):
    """The free level on the simulator, its pool in either mode; the suite's level after."""
    if request.param == "segments":
        monkeypatch.setenv("NPUMEM_ALLOC_CONF", "expandable_segments:False")
    was = sanitizer.SANITIZER.level
    sanitizer.enable("free")
    npumem.init(backend=SimBackend(SMALL_SIM))
    npumem.set_device(0)
    pool = get_allocator()
    assert pool.expandable == (request.param == "expandable")
    yield pool
    sanitizer.enable(was) if was != "off" else sanitizer.disable()


def _filled(nbytes: int, value: int) -> int:
    pointer = caching_allocator_alloc(nbytes)
    npumem.memset(pointer, nbytes, value, nbytes)
    return pointer


def assert_sound(pool, live: dict[int, int]) -> None:
    """The pool's invariants hold and each live block in `live` (pointer -> fill byte, 256
    bytes) still holds its bytes."""
    blocks = sorted(pool._allocated.values(), key=lambda b: b.start)
    assert all(a.end <= b.start for a, b in zip(blocks, blocks[1:]))
    stats = pool.memory_stats()
    assert stats["allocation.all.current"] == len(blocks)
    assert stats["allocated_bytes.all.current"] == sum(b.size for b in blocks)
    for _stream, _small, listed, _mapped in pool._strategy.views():
        for a, b in zip(listed, listed[1:]):
            assert a.end == b.start and a.next is b and b.prev is a
            assert a.allocated or b.allocated             # free neighbours merged
    for pointer, value in live.items():
        assert pool.owns(pointer) and read_device(pointer, 256) == bytes([value]) * 256


def _refused(error, call, *args) -> str:
    with pytest.raises(error) as info:
        call(*args)
    return str(info.value)


# --- choosing the level ------------------------------------------------------------------

@pytest.mark.parametrize("text, level", [("", "off"), ("0", "off"), ("1", "full"),
                                         ("full", "full"), ("free", "free"), (" FREE ", "free")])
def test_the_environment_names_the_level(monkeypatch, text, level):
    monkeypatch.setenv("NPUMEM_SANITIZE", text)
    assert sanitizer.environment_level() == level
    assert problems({"NPUMEM_SANITIZE": text}) == []


@pytest.mark.parametrize("value", ["2", "yes", "on", "cheap"])
def test_other_values_are_one_line_errors_naming_the_levels(value):
    found = problems({"NPUMEM_SANITIZE": value})
    assert len(found) == 1 and "\n" not in found[0]
    assert f"NPUMEM_SANITIZE={value!r}: takes 0, 1, free, full" in found[0]


@pytest.mark.parametrize("value", ["2", "yes"])
def test_the_cli_refuses_them_without_a_traceback(value):
    done = subprocess.run([sys.executable, "-m", "npumem", "demo", "--size", "64K"],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, NPUMEM_SANITIZE=value))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"NPUMEM_SANITIZE={value!r}: takes 0, 1, free, full" in lines[0]


def test_the_demo_runs_at_the_free_level_and_says_what_it_left_out():
    done = subprocess.run([sys.executable, "-m", "npumem", "demo", "--size", "64K"],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, NPUMEM_SANITIZE="free"))
    assert done.returncode == 0, done.stderr
    assert "(NPUMEM_SANITIZE=free); NPUMEM_SANITIZE=1 also checks overruns" in done.stdout


def test_enable_takes_a_level_and_the_free_level_observes_no_allocation(rt):
    was = sanitizer.SANITIZER.level
    try:
        sanitizer.enable("free")
        assert sanitizer.SANITIZER.level == "free"
        assert sanitizer.SANITIZER not in OBSERVERS.active     # nothing runs per allocation
        with pytest.raises(E.InvalidParamError, match="'free' or 'full'"):
            sanitizer.enable("2")
        sanitizer.disable()
        assert sanitizer.SANITIZER.level == "off"
    finally:
        sanitizer.enable(was) if was != "off" else sanitizer.disable()


def test_blocks_allocated_at_the_free_level_are_known_to_the_full_level_after(rt):
    """Leaving the full level drops its index; coming back seeds it from the live blocks."""
    was = sanitizer.SANITIZER.level
    try:
        sanitizer.enable("full")
        early = _filled(256, 1)
        sanitizer.enable("free")
        caching_allocator_delete(early)
        later = _filled(256, 2)
        sanitizer.enable("full")
        assert read_device(later, 256) == b"\x02" * 256
        with pytest.raises(E.MemoryAccessError, match="past the end"):
            npumem.memset(later, 257, 0, 257)
        caching_allocator_delete(later)
    finally:
        sanitizer.enable(was) if was != "off" else sanitizer.disable()


# --- what the free level catches ---------------------------------------------------------

@pytest.mark.parametrize("offset", [0, 64])
def test_a_read_or_write_through_a_freed_pointer(free_level, offset):
    keep = {_filled(256, 0x5A): 0x5A}
    pointer = _filled(256, 1)
    keep[_filled(256, 0x6B)] = 0x6B
    caching_allocator_delete(pointer)
    message = _refused(E.MemoryAccessError, npumem.memcpy, bytearray(16), 16, pointer + offset,
                       16, K.DEVICE_TO_HOST)
    assert "use after free" in message and f"0x{pointer + offset:x}" in message
    assert "free run in the pool's cache" in message
    _refused(E.MemoryAccessError, npumem.memset, pointer + offset, 16, 0xFF, 16)
    assert_sound(free_level, keep)


def test_a_double_free_names_the_block(free_level):
    keep = {_filled(256, 0x5A): 0x5A}
    pointer = _filled(256, 1)
    caching_allocator_delete(pointer)
    message = _refused(E.MemoryFreeError, caching_allocator_delete, pointer)
    assert f"double free: it is inside free pool memory at 0x{pointer:x}" in message
    assert "free run in the pool's cache" in message
    assert_sound(free_level, keep)


def test_freeing_an_interior_pointer_names_the_block(free_level):
    pointer = _filled(256, 3)
    message = _refused(E.MemoryFreeError, caching_allocator_delete, pointer + 64)
    assert f"points 64 bytes into pool block 0x{pointer:x}" in message
    assert_sound(free_level, {pointer: 3})


def test_an_access_running_out_of_its_blocks_rounded_size(free_level):
    keep = {_filled(256, 0x5A): 0x5A}
    pointer = _filled(256, 1)
    size = free_level._allocated[pointer].size
    message = _refused(E.MemoryAccessError, npumem.memset, pointer, size + 1, 0xFF, size + 1)
    assert f"past the end of pool block 0x{pointer:x}" in message
    assert_sound(free_level, {**keep, pointer: 1})


def test_ops_and_numpy_on_a_tensor_whose_storage_was_freed(free_level):
    tensor = npumem.from_numpy(np.zeros(64, dtype=np.float32))
    view = tensor[8:16]
    tensor.storage.free()
    other = npumem.from_numpy(np.full(64, 7, dtype=np.float32))   # takes the freed block
    assert other.storage.pointer == view.storage.pointer
    assert "stale tensor" in _refused(E.MemoryAccessError, view.numpy)
    out = npumem.empty((8,), "float32")
    with pytest.raises(E.MemoryAccessError, match="stale tensor"):
        aclnn.run_with_pool_workspace(aclnn.add, aclnn.add_get_workspace_size(view, view, 1, out))
    assert (other.numpy() == 7).all()
    del other, out
    assert_sound(free_level, {})


def test_a_tensor_storage_freed_by_hand_is_refused_and_freed_once(free_level):
    before = free_level.memory_stats()["allocation.all.current"]
    tensor = npumem.from_numpy(np.arange(16, dtype=np.float32))
    with pytest.raises(E.MemoryFreeError, match="storage of a tensor"):
        caching_allocator_delete(tensor.storage.pointer)
    assert (tensor.numpy() == np.arange(16)).all()
    del tensor
    assert free_level.memory_stats()["allocation.all.current"] == before
    assert_sound(free_level, {})


def test_an_op_on_a_freed_workspace(free_level):
    a = npumem.from_numpy(np.ones(1024, dtype=np.float32))
    out = npumem.empty((1024,), "float32")
    need, executor = aclnn.add_get_workspace_size(a, a, 2.0, out)
    workspace = caching_allocator_alloc(need)
    caching_allocator_delete(workspace)
    with pytest.raises(E.MemoryAccessError, match="use after free"):
        aclnn.add(workspace, need, executor)
    assert_sound(free_level, {})


def test_work_queued_before_an_early_free_still_reads_the_storage(free_level):
    """Storage.free() while an op on another stream still waits to read it: the op was queued
    before the free, so it runs (and the pool keeps the block for it); a launch after the free
    is refused."""
    alloc_stream, compute_stream = npumem.create_stream(), npumem.create_stream()
    gate = threading.Event()
    compute_stream.enqueue(gate.wait, "held until the test says so")
    x = np.arange(64, dtype=np.float32)
    source = npumem.from_numpy(x, alloc_stream)
    alloc_stream.synchronize()
    out = npumem.empty((64,), "float32", stream=compute_stream)
    size, executor = aclnn.mul_get_workspace_size(source, source, out)
    aclnn.mul(None, size, executor, compute_stream)          # queued behind the gate
    try:
        source.storage.free()
        with pytest.raises(E.MemoryAccessError, match="stale tensor|use after free"):
            aclnn.mul_get_workspace_size(source, source, out)     # planned after the free
    finally:
        gate.set()
    np.testing.assert_allclose(out.numpy(), x * x)


def test_a_check_never_waits_long_for_a_busy_pool(free_level, monkeypatch):
    """A stream worker must never wait for a pool whose holder waits for the stream: after
    LOCK_WAIT the check lets the access go rather than hang."""
    monkeypatch.setattr(sanitizer.PoolSanitizer, "LOCK_WAIT", 0.01)
    pointer = _filled(256, 1)
    caching_allocator_delete(pointer)
    held, release = threading.Event(), threading.Event()

    def hold():
        with free_level.lock:
            held.set()
            release.wait(5)
    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(5)
    try:
        npumem.memcpy(bytearray(16), 16, pointer, 16, K.DEVICE_TO_HOST)   # let go, not hung
    finally:
        release.set()
        holder.join()
    with pytest.raises(E.MemoryAccessError, match="use after free"):
        npumem.memcpy(bytearray(16), 16, pointer, 16, K.DEVICE_TO_HOST)


# --- what the free level does not claim (NPUMEM_SANITIZE=1 catches the overruns and the
# cross-stream free; no level catches a raw pointer's use or free after its block was reused) --

def test_not_caught_an_overrun_inside_the_blocks_rounding(free_level):
    pointer = caching_allocator_alloc(100)                  # a 192-byte block
    npumem.memset(pointer, 101, 0xFF, 101)                  # 1 byte past the request: silent


def test_not_caught_an_over_read_past_a_tensor_inside_its_block(free_level):
    tensor = npumem.from_numpy(np.arange(25, dtype=np.float32))
    npumem.memcpy(bytearray(104), 104, tensor.storage.pointer, 104, K.DEVICE_TO_HOST)


def test_not_caught_a_raw_pointer_freed_and_handed_out_again(free_level):
    """The freed pointer's bytes belong to the new block: reading them reads its data (the full
    level cannot tell either: the integer is the new block's start)."""
    pointer = _filled(256, 1)
    caching_allocator_delete(pointer)
    reused = _filled(256, 2)
    assert reused == pointer
    assert read_device(pointer, 16) == b"\x02" * 16


def test_not_caught_a_cross_stream_free_without_record_stream(free_level):
    """Freed on stream A and handed out again there while B's queued copy still reads it: the
    copy reads the new block's bytes (the full level fails it: "call record_stream")."""
    stream_a, stream_b = npumem.create_stream(), npumem.create_stream()
    gate = npumem.create_event()
    pointer = caching_allocator_alloc(4096, stream=stream_a)
    out = npumem.malloc_host(4096)
    npumem.stream_wait_event(stream_b, gate)
    npumem.memcpy_async(out, 4096, pointer, 4096, K.DEVICE_TO_HOST, stream_b)
    caching_allocator_delete(pointer)
    reused = caching_allocator_alloc(4096, stream=stream_a)
    assert reused == pointer
    npumem.record_event(gate, stream_a)
    npumem.synchronize_stream(stream_b)                     # no error
    caching_allocator_delete(reused)
    npumem.free_host(out)
    npumem.destroy_event(gate)


def test_not_caught_at_either_level_a_second_free_after_the_block_was_handed_out_again(rt):
    """An integer pointer carries no identity: the stale owner's second free frees the new
    owner's block. (Tensors are safe: their storage keeps a record, see above.)"""
    pointer = caching_allocator_alloc(256)
    caching_allocator_delete(pointer)
    reused = caching_allocator_alloc(256)
    assert reused == pointer
    caching_allocator_delete(pointer)                       # meant for the first block
    assert not get_allocator().owns(reused)
