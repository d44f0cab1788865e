"""Cheap launches: ops run inline on an idle stream in exact stream order, phase 1 is remembered
for repeated calls without keeping tensors alive, and a stale plan is never used."""

import gc
import threading

import numpy as np
import pytest

import npumem
from npumem import aclnn
from npumem.device import sanitizer
from npumem.ops.phase1_cache import PHASE1


@pytest.fixture
def fast(rt):
    """The pool sanitizer off (it disables plan reuse: it checks every use instead)."""
    was_on = sanitizer.SANITIZER.on
    sanitizer.SANITIZER.on = False
    yield npumem.create_stream()
    sanitizer.SANITIZER.on = was_on


def test_an_idle_stream_runs_an_op_before_launch_returns(fast):
    x = npumem.from_numpy(np.arange(8, dtype=np.float32))
    out = npumem.empty((8,))
    aclnn.run_with_pool_workspace(aclnn.add, aclnn.add_get_workspace_size(x, x, 1, out), fast)
    assert fast.query()                       # done already: no hand-off to the worker
    np.testing.assert_array_equal(out.numpy(), 2 * np.arange(8))


def test_work_queued_from_another_thread_waits_for_an_inline_task(fast):
    order, started = [], threading.Event()

    def slow():
        started.set()
        threading.Event().wait(0.2)
        order.append("inline")

    other = threading.Thread(target=lambda: (started.wait(), fast.enqueue(
        lambda: order.append("queued"), "queued")))
    other.start()
    fast.submit(slow, "inline")
    other.join()
    fast.synchronize()
    assert order == ["inline", "queued"]


def test_a_busy_stream_queues_and_keeps_order(fast):
    gate, order = threading.Event(), []
    fast.enqueue(gate.wait, "gate")
    fast.submit(lambda: order.append("second"), "second")
    assert order == []                        # behind the gate, not run inline
    gate.set()
    fast.synchronize()
    assert order == ["second"]


def test_phase_1_is_remembered_for_the_same_tensors(fast):
    x = npumem.from_numpy(np.ones(16, np.float32))
    out = npumem.empty((16,))
    hits = PHASE1.hits
    for alpha in (1, 1, 2, 2):
        aclnn.run_with_pool_workspace(aclnn.add, aclnn.add_get_workspace_size(x, x, alpha, out),
                                      fast)
        fast.synchronize()
        np.testing.assert_array_equal(out.numpy(), np.full(16, 1 + alpha, np.float32))
    assert PHASE1.hits - hits == 2            # the repeats, not the first call of each alpha


def test_a_remembered_plan_keeps_no_tensor_alive(fast):
    x = npumem.from_numpy(np.ones(1 << 16, np.float32))
    out = npumem.empty((1 << 16,))
    aclnn.run_with_pool_workspace(aclnn.add, aclnn.add_get_workspace_size(x, x, 1, out), fast)
    fast.synchronize()
    before = npumem.memory.memory_allocated()
    del x, out
    gc.collect()
    assert npumem.memory.memory_allocated() <= before - 2 * (1 << 18)


def test_a_freed_tensor_fails_phase_1_again_instead_of_reusing_its_plan(fast):
    out = npumem.empty((64,))
    pointer = npumem.malloc(256)
    view = npumem.create_tensor((64,), "float32", data_ptr=pointer)
    aclnn.add_get_workspace_size(view, view, 1, out)
    hits = PHASE1.hits
    aclnn.add_get_workspace_size(view, view, 1, out)
    assert PHASE1.hits == hits + 1
    npumem.free(pointer)
    with pytest.raises(npumem.errors.AclError):
        aclnn.add_get_workspace_size(view, view, 1, out)


def test_a_free_between_phase_1_and_launch_is_caught(fast):
    out = npumem.empty((64,))
    pointer = npumem.malloc(256)
    view = npumem.create_tensor((64,), "float32", data_ptr=pointer)
    size, executor = aclnn.add_get_workspace_size(view, view, 1, out)
    npumem.free(pointer)
    with pytest.raises(npumem.errors.MemoryAccessError, match=r"freed\): use after free"):
        aclnn.add(None, size, executor, fast)


def test_a_free_while_an_op_is_queued_is_caught_when_it_runs(fast):
    gate = threading.Event()
    fast.enqueue(gate.wait, "gate")
    out = npumem.empty((64,))
    pointer = npumem.malloc(256)
    view = npumem.create_tensor((64,), "float32", data_ptr=pointer)
    aclnn.run_with_pool_workspace(aclnn.add, aclnn.add_get_workspace_size(view, view, 1, out), fast)
    npumem.free(pointer)                      # the op is still queued behind the gate
    gate.set()
    with pytest.raises(npumem.errors.AsyncTaskError, match=r"freed\): use after free"):
        fast.synchronize()
