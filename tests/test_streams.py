"""Streams really run asynchronously, in order; events order and time them; errors surface at sync."""

import threading
import time

import numpy as np
import pytest

import npumem
from npumem import MemcpyKind as K
from npumem import errors as E

from .conftest import pattern, read_device, run_threads


@pytest.fixture
def rt(any_rt):
    """This module is a conformance suite: every test runs on each backend (conftest.BACKENDS)."""
    return any_rt



def _gate(stream):
    """Block `stream`'s worker until the returned threading.Event is set."""
    gate = threading.Event()
    stream.enqueue(gate.wait, "test gate")
    return gate


def _pinned_with(data):
    pointer = npumem.malloc_host(len(data))
    npumem.memcpy(pointer, len(data), data, len(data), K.HOST_TO_HOST)
    return pointer


def test_memcpy_async_returns_before_the_copy_runs(rt):
    stream = npumem.create_stream()
    device = npumem.malloc(4096)
    npumem.memset(device, 4096, 0, 4096)
    source = _pinned_with(pattern(4096, 1))
    gate = _gate(stream)
    npumem.memcpy_async(device, 4096, source, 4096, K.HOST_TO_DEVICE, stream)
    assert not npumem.query_stream(stream)
    assert read_device(device, 4096) == bytes(4096)      # not copied yet
    gate.set()
    npumem.synchronize_stream(stream)
    assert npumem.query_stream(stream)
    assert read_device(device, 4096) == pattern(4096, 1)


def test_work_runs_in_fifo_order_on_a_worker_thread(rt):
    stream = npumem.create_stream()
    seen = []
    for i in range(100):
        stream.enqueue(lambda i=i: seen.append((i, threading.current_thread().name)), "append")
    npumem.synchronize_stream(stream)
    assert [i for i, _ in seen] == list(range(100))
    assert all(name.startswith("npumem-stream") for _, name in seen)
    assert seen[0][1] != threading.current_thread().name


def test_default_stream_is_used_for_none_and_zero(rt):
    device = npumem.malloc(64)
    pinned = _pinned_with(b"z" * 64)
    npumem.memcpy_async(device, 64, pinned, 64, K.HOST_TO_DEVICE, None)
    npumem.memset_async(device, 64, ord("y"), 32, 0)
    npumem.synchronize_stream(0)
    assert read_device(device, 64) == b"y" * 32 + b"z" * 32


def test_async_chain_h2d_d2d_d2h(rt):
    stream = npumem.create_stream()
    data = pattern(1 << 20, 4)
    source, target = _pinned_with(data), npumem.malloc_host(1 << 20)
    a, b = npumem.malloc(1 << 20), npumem.malloc(1 << 20)
    npumem.memcpy_async(a, 1 << 20, source, 1 << 20, K.HOST_TO_DEVICE, stream)
    npumem.memcpy_async(b, 1 << 20, a, 1 << 20, K.DEVICE_TO_DEVICE, stream)
    npumem.memcpy_async(target, 1 << 20, b, 1 << 20, K.DEVICE_TO_HOST, stream)
    npumem.synchronize_stream(stream)
    out = bytearray(1 << 20)
    npumem.memcpy(out, 1 << 20, target, 1 << 20, K.HOST_TO_HOST)
    assert bytes(out) == data


def test_streams_run_concurrently(rt):
    first, second = npumem.create_stream(), npumem.create_stream()
    gate = _gate(first)
    done = threading.Event()
    second.enqueue(done.set, "mark")
    assert done.wait(5)                   # the second stream is not held up by the first
    assert not npumem.query_stream(first)
    gate.set()
    npumem.synchronize_stream(first)


def test_stream_wait_event_orders_two_streams(rt):
    producer, consumer = npumem.create_stream(), npumem.create_stream()
    device = npumem.malloc(64)
    result = npumem.malloc_host(64)
    npumem.memset(device, 64, 0, 64)
    ready = npumem.create_event()
    gate = _gate(producer)
    npumem.memset_async(device, 64, 7, 64, producer)
    npumem.record_event(ready, producer)
    npumem.stream_wait_event(consumer, ready)
    npumem.memcpy_async(result, 64, device, 64, K.DEVICE_TO_HOST, consumer)
    assert not npumem.query_event(ready)
    time.sleep(0.05)
    assert not npumem.query_stream(consumer)      # blocked on the event
    gate.set()
    npumem.synchronize_stream(consumer)
    assert npumem.query_event(ready)
    out = bytearray(64)
    npumem.memcpy(out, 64, result, 64, K.HOST_TO_HOST)
    assert bytes(out) == b"\x07" * 64


def test_event_query_synchronize_and_elapsed_time(rt):
    stream = npumem.create_stream()
    start, end = npumem.create_event(), npumem.create_event()
    assert npumem.query_event(start)          # never recorded counts as complete
    npumem.record_event(start, stream)
    stream.enqueue(lambda: time.sleep(0.02), "sleep")
    npumem.record_event(end, stream)
    npumem.synchronize_event(end)
    assert npumem.query_event(end)
    elapsed = npumem.event_elapsed_time(start, end)
    assert 15 <= elapsed < 5000
    npumem.reset_event(end, stream)
    with pytest.raises(E.StreamNotCompleteError, match="never recorded"):
        npumem.event_elapsed_time(start, end)


def test_elapsed_time_of_an_unreached_event(rt):
    stream = npumem.create_stream()
    start, end = npumem.create_event(), npumem.create_event()
    npumem.record_event(start, stream)
    gate = _gate(stream)
    npumem.record_event(end, stream)
    with pytest.raises(E.StreamNotCompleteError, match="not been reached"):
        npumem.event_elapsed_time(start, end)
    with pytest.raises(E.StreamNotCompleteError):
        npumem.synchronize_event(end, timeout=0.01)
    gate.set()
    npumem.synchronize_event(end)


def test_synchronize_timeout_names_the_stream_and_pending_work(rt):
    stream = npumem.create_stream()
    gate = _gate(stream)
    stream.enqueue(lambda: None, "later work")
    with pytest.raises(E.StreamNotCompleteError) as info:
        npumem.synchronize_stream(stream, timeout=0.05)
    assert f"0x{stream.handle:x}" in str(info.value) and "2 task(s) pending" in str(info.value)
    assert "test gate" in str(info.value)
    gate.set()
    npumem.synchronize_stream(stream)


def test_use_after_free_in_queued_work_is_raised_at_synchronize(rt):
    stream = npumem.create_stream()
    device = npumem.malloc(4096)
    pinned = npumem.malloc_host(4096)
    gate = _gate(stream)
    npumem.memcpy_async(pinned, 4096, device, 4096, K.DEVICE_TO_HOST, stream)
    npumem.free(device)                   # freed while the copy waits in the queue
    gate.set()
    with pytest.raises(E.AsyncTaskError, match="use after free") as info:
        npumem.synchronize_stream(stream)
    assert info.value.code == E.ACL_ERROR_RT_PARAM_INVALID
    npumem.synchronize_stream(stream)     # the error was reported once; the stream still works


def test_synchronize_device_waits_for_every_stream(rt):
    streams = [npumem.create_stream() for _ in range(3)]
    flags = []
    for stream in streams:
        stream.enqueue(lambda: (time.sleep(0.01), flags.append(1)), "work")
    npumem.synchronize_device()
    assert len(flags) == 3


def test_destroy_stream_finishes_its_work_and_stops_the_worker(rt):
    stream = npumem.create_stream()
    flags = []
    stream.enqueue(lambda: (time.sleep(0.02), flags.append(1)), "work")
    npumem.destroy_stream(stream)
    assert flags == [1]
    stream._worker.join(2)
    assert not stream._worker.is_alive()


def test_default_stream_cannot_be_destroyed(rt):
    with pytest.raises(E.InvalidParamError, match="default stream"):
        npumem.destroy_stream(None)


def test_concurrent_allocation_from_many_threads(rt):
    pointers = []
    lock = threading.Lock()

    def worker(seed):
        npumem.set_device(0)
        stream = npumem.create_stream()
        rng = np.random.default_rng(seed)
        mine = []
        for _ in range(200):
            size = int(rng.integers(1, 100_000))
            pointer = npumem.malloc(size)
            npumem.memset_async(pointer, size, seed, size, stream)
            mine.append((pointer, size))
        npumem.synchronize_stream(stream)
        for pointer, size in mine:
            assert read_device(pointer, size) == bytes([seed]) * size
        with lock:
            pointers.extend(mine)

    assert run_threads(worker) == []
    spans = sorted(pointers)
    assert all(a + n <= b for (a, n), (b, _) in zip(spans, spans[1:]))
    assert len(npumem.RUNTIME.backend.live_allocations(0)) == 1600
