"""Prefetcher: right data in order, copies really overlap compute, buffers reused, clean shutdown."""

import threading

import numpy as np
import pytest

import npumem
from npumem import memory as mem
from npumem.ops import aclnn
from npumem.pipeline import Prefetcher


@pytest.fixture
def rt(any_rt):
    """This module is a conformance suite: every test runs on each backend (conftest.BACKENDS)."""
    return any_rt



def batches(count, elements=4096):
    return [np.full(elements, i, np.float32) for i in range(count)]


def square(x, stream):
    out = npumem.empty(x.shape, stream=stream)
    aclnn.run_with_pool_workspace(aclnn.mul, aclnn.mul_get_workspace_size(x, x, out), stream)
    return out


def test_batches_arrive_in_order_with_their_data(rt):
    stream = npumem.create_stream()
    results = []
    with Prefetcher(batches(12), compute_stream=stream) as prefetcher:
        for x in prefetcher:
            assert isinstance(x, npumem.Tensor) and x.shape == (4096,)
            results.append(square(x, stream))
    assert [float(r.numpy()[17]) for r in results] == [float(i * i) for i in range(12)]
    stats = prefetcher.stats()
    assert stats.batches == 12 and stats.bytes == 12 * 4096 * 4
    assert stats.copy_ms > 0 and stats.compute_ms > 0 and 0.0 <= stats.hidden_fraction <= 1.0
    assert "12 batches" in str(stats) and prefetcher.closed


def test_structured_batches_keep_their_shape_and_pass_other_leaves_through(rt):
    data = [{"x": np.arange(6, dtype=np.int32).reshape(2, 3) + i, "label": i,
             "pair": (np.ones(2, np.float16) * i, "id-%d" % i)} for i in range(3)]
    seen = []
    for batch in Prefetcher(data):
        seen.append((batch["label"], batch["x"].numpy().tolist(), batch["pair"][0].numpy().tolist(),
                     batch["pair"][1]))
    assert seen[2] == (2, [[2, 3, 4], [5, 6, 7]], [2.0, 2.0], "id-2")
    assert [s[0] for s in seen] == [0, 1, 2]


def test_the_next_copy_runs_while_the_compute_stream_is_busy(rt):
    stream = npumem.create_stream()
    gate = threading.Event()
    prefetcher = Prefetcher(batches(3), depth=2, compute_stream=stream)
    first = next(prefetcher)
    stream.enqueue(gate.wait, "long compute")          # the compute stream is busy ...
    copied = threading.Event()
    prefetcher.copy_stream.enqueue(copied.set, "probe")
    assert copied.wait(5)                           # ... and the copy stream is not held up by it
    assert len(prefetcher._ahead) == 1              # the second batch was already queued
    gate.set()
    assert float(first.numpy()[0]) == 0.0
    assert [float(x.numpy()[0]) for x in prefetcher] == [1.0, 2.0]


def test_pinned_and_device_buffers_are_reused(rt):
    stream = npumem.create_stream()
    pinned = mem.host_pool()
    misses = pinned.misses
    with Prefetcher(batches(40, elements=1 << 18), compute_stream=stream) as prefetcher:
        for x in prefetcher:
            square(x, stream)
    npumem.synchronize_stream(stream)
    assert pinned.misses - misses <= 4               # depth + the batch being copied + slack
    assert pinned.hits >= 36
    assert mem.max_memory_allocated() < 12 * (1 << 20)   # ~10 x 1 MiB live at most, not 40


def test_copies_hide_behind_compute(rt):
    """Compute 100x longer than a copy: in steady state the copies run while it does. (A wide
    margin, not a performance assertion: the benchmark measures the real fraction.)"""
    stream = npumem.create_stream()
    with Prefetcher(batches(8, elements=1 << 16), compute_stream=stream) as prefetcher:
        for _ in prefetcher:
            stream.enqueue(lambda: threading.Event().wait(0.02), "20 ms of compute")
    stats = prefetcher.stats()
    assert stats.steady_hidden_fraction > 0.5


def test_closing_early_drops_prefetched_batches_and_stops_the_copy_stream(rt):
    prefetcher = Prefetcher(batches(10), depth=3)
    next(prefetcher)
    copy_stream = prefetcher.copy_stream
    prefetcher.close()
    assert copy_stream.destroyed and list(prefetcher) == []
    assert prefetcher.stats().batches == 1


def test_an_exception_from_the_source_propagates_and_close_cleans_up(rt):
    def source():
        yield np.zeros(8, np.float32)
        raise RuntimeError("loader broke")

    with pytest.raises(RuntimeError, match="loader broke"):
        with Prefetcher(source()) as prefetcher:
            for _ in prefetcher:
                pass
    assert prefetcher.closed and prefetcher.copy_stream.destroyed


@pytest.mark.parametrize("depth", [0, -1, 1.5, True])
def test_bad_depth_is_refused(rt, depth):
    with pytest.raises(ValueError, match="depth must be a positive integer"):
        Prefetcher([], depth=depth)
