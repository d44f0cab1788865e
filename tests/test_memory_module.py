"""npumem.memory: the torch.npu.memory-shaped API over the runtime's devices and streams."""

import pickle
import threading

import numpy as np
import pytest

import npumem
import npumem.memory as mem
from npumem import MemcpyKind as K
from npumem import errors as E

from .conftest import read_device, run_threads


@pytest.fixture
def rt(any_rt):
    """This module is a conformance suite: every test runs on each backend (conftest.BACKENDS)."""
    return any_rt



def test_alloc_delete_and_counters(rt):
    pointer = mem.caching_allocator_alloc(1000)
    assert mem.memory_allocated() == 1088 and mem.memory_reserved() >= 1088
    npumem.memcpy(pointer, 1000, b"\x05" * 1000, 1000, K.HOST_TO_DEVICE)   # real device memory
    assert read_device(pointer, 1000) == b"\x05" * 1000
    mem.caching_allocator_delete(pointer)
    assert mem.memory_allocated() == 0 and mem.max_memory_allocated() == 1088
    mem.reset_peak_memory_stats()
    assert mem.max_memory_allocated() == 0
    mem.empty_cache()
    assert mem.memory_reserved() == 0


def test_memory_stats_use_pytorch_names(rt):
    mem.caching_allocator_alloc(3 << 20)
    stats = mem.memory_stats()
    for key in ("allocated_bytes.all.current", "reserved_bytes.large_pool.peak", "active_bytes.all.allocated",
                "inactive_split_bytes.all.current", "requested_bytes.small_pool.freed", "num_alloc_retries",
                "num_ooms", "num_device_alloc", "num_device_free", "cache_hit_rate", "fragmentation"):
        assert key in stats


def test_summary_layout(rt):
    mem.caching_allocator_alloc(5000)
    text = mem.memory_summary()
    lines = text.splitlines()
    assert all(len(line) == 77 and line[0] == "|" and line[-1] == "|" for line in lines)
    assert "| Allocated memory      |" in text and "Pool hit rate" in text and "Fragmentation" in text
    assert "Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed" in text


def test_snapshot_structure_pickles(rt, tmp_path):
    a = mem.caching_allocator_alloc(100)
    mem.caching_allocator_alloc(2 << 20)
    mem.caching_allocator_delete(a)
    snapshot = mem.memory_snapshot()
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    loaded = pickle.loads(path.read_bytes())
    segment = loaded["segments"][0]
    for key in ("device", "address", "total_size", "allocated_size", "active_size", "requested_size",
                "stream", "segment_type", "blocks"):
        assert key in segment
    states = {block["state"] for s in loaded["segments"] for block in s["blocks"]}
    assert states <= {"active_allocated", "active_pending_free", "inactive"}
    assert "active_allocated" in states and "inactive" in states
    assert isinstance(loaded["device_traces"], list)


def test_streams_are_the_runtimes(rt):
    stream = npumem.create_stream()
    a = mem.caching_allocator_alloc(4096, stream=stream)
    mem.caching_allocator_delete(a)
    assert mem.caching_allocator_alloc(4096, stream=stream) == a
    assert mem.caching_allocator_alloc(4096) != a              # default stream: another arena


def test_record_stream_waits_for_the_other_stream(rt):
    producer, consumer = npumem.create_stream(), npumem.create_stream()
    gate = threading.Event()
    consumer.enqueue(gate.wait, "gate")
    pointer = mem.caching_allocator_alloc(4096, stream=producer)
    mem.record_stream(pointer, consumer)
    mem.caching_allocator_delete(pointer)
    assert mem.caching_allocator_alloc(4096, stream=producer) != pointer   # consumer still busy
    gate.set()
    npumem.synchronize_stream(consumer)
    assert mem.caching_allocator_alloc(4096, stream=producer) == pointer


def test_settings_and_fraction(rt):
    mem.set_allocator_settings("expandable_segments:False,max_split_size_mb:64")
    assert not mem.get_allocator().expandable
    pointer = mem.caching_allocator_alloc(100)
    with pytest.raises(E.InvalidParamError, match="live blocks"):
        mem.set_allocator_settings("expandable_segments:True")
    mem.caching_allocator_delete(pointer)
    mem.set_allocator_settings("expandable_segments:True")      # where the backend can map pages
    assert mem.get_allocator().expandable == npumem.get_backend().supports_virtual_memory
    mem.set_per_process_memory_fraction(0.1)
    with pytest.raises(mem.OutOfMemoryError, match="fraction"):
        mem.caching_allocator_alloc(100 << 20)
    with pytest.raises(E.InvalidParamError, match="unknown key"):
        mem.set_allocator_settings("max_split:3")


def test_alloc_conf_environment(monkeypatch):
    monkeypatch.setenv("NPUMEM_ALLOC_CONF", "expandable_segments:False,garbage_collection_threshold:0.6")
    npumem.init()
    npumem.set_device(0)
    pool = mem.get_allocator()
    assert not pool.expandable and pool.settings.garbage_collection_threshold == 0.6


def test_bad_calls(rt):
    with pytest.raises(E.MemoryFreeError, match="not allocated by the caching allocator"):
        mem.caching_allocator_delete(npumem.malloc(64))
    with pytest.raises(E.InvalidParamError):
        mem.caching_allocator_alloc("big")
    with pytest.raises(E.InvalidDeviceError):
        mem.memory_allocated(5)


def test_reset_device_reports_live_pool_blocks(rt):
    mem.caching_allocator_alloc(1000)
    with pytest.warns(E.LiveAllocationsWarning, match="caching pool of device 0: 1 block"):
        npumem.reset_device(0)
    assert npumem.RUNTIME.backend.live_allocations(0) == []


def test_host_pool_reuses_pinned_buffers(rt):
    pool = mem.host_pool()
    stream = npumem.create_stream()
    first = pool.allocate(10_000)
    device = npumem.malloc(10_000)
    npumem.memcpy_async(device, 10_000, first, 10_000, K.HOST_TO_DEVICE, stream)
    pool.free(first, stream)                  # reusable once the copy has run
    npumem.synchronize_stream(stream)
    assert pool.allocate(9_000) == first
    assert pool.allocate(100) != first and pool.stats()["hits"] == 1
    assert mem.host_pool().empty_cache() == 0     # nothing cached: both buffers are in use
    with pytest.raises(E.MemoryFreeError):
        pool.free(12345)


def test_eight_threads_statistics_exact(rt):
    def worker(seed):
        stream = npumem.create_stream()
        rng = np.random.default_rng(seed)
        mine = []
        for _ in range(300):
            if mine and rng.random() < 0.45:
                mem.caching_allocator_delete(mine.pop())
            else:
                mine.append(mem.caching_allocator_alloc(int(rng.integers(1, 200_000)), stream=stream))
        for pointer in mine:
            mem.caching_allocator_delete(pointer)

    assert run_threads(worker) == []
    stats = mem.memory_stats()
    assert stats["allocation.all.current"] == 0 and stats["allocated_bytes.all.current"] == 0
    assert stats["allocation.all.allocated"] == stats["allocation.all.freed"]
    assert stats["active_bytes.all.current"] == 0
