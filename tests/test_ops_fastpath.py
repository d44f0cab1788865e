"""The lean route of `a + b` (ops/fastpath.py) against the full route it stands for: the same
results bit for bit, the same result tensors, the same errors, the same stream order and
profiler events; and every case it must hand to the full route does go there."""

import contextlib
import gc
import re
import threading

import numpy as np
import pytest

import npumem
from npumem.device import sanitizer
from npumem.device.address_index import RELEASES
from npumem.errors import AsyncTaskError, MemoryAccessError, OpParamError
from npumem.observe import OBSERVERS
from npumem.ops import REGISTRY
from npumem.ops.fastpath import FAST
from npumem.ops.phase1_cache import PHASE1
from npumem.runtime.state import RUNTIME

OPS = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
       "div": lambda a, b: a / b}


@contextlib.contextmanager
def _sanitizer_off():
    """The pool sanitizer off (the suite runs with it: it checks every use, and at the full
    level it listens to the pools as a profiler does; either way, no lean route)."""
    level = sanitizer.SANITIZER.level
    sanitizer.disable()
    FAST.clear()
    try:
        yield
    finally:
        if level != "off":
            sanitizer.enable(level)


@pytest.fixture
def lean(rt):
    with _sanitizer_off():
        yield rt


@pytest.fixture
def lean_any(any_rt):
    """As `lean`, on each backend (the simulator, torch:cpu where torch is installed)."""
    with _sanitizer_off():
        yield any_rt


@contextlib.contextmanager
def full_route():
    """Operators take the full route only (the lean route hands every call over)."""
    original = FAST.run
    FAST.run = lambda op, left, right: (None, None)
    try:
        yield
    finally:
        del FAST.run
        assert FAST.run.__func__ is original.__func__


def _values(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        values = rng.standard_normal(shape).astype(dtype) * 100
        flat = values.reshape(-1)
        specials = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-30], dtype=np.float64)
        flat[:min(flat.size, specials.size)] = specials[:flat.size].astype(dtype)
        return values
    return rng.integers(-1000, 1000, shape).astype(dtype)


def _attributes(tensor) -> dict:
    """What a result tensor is, less where its bytes are."""
    return {k: v for k, v in vars(tensor).items() if k not in ("storage", "_span", "_kernel_view")}


def _both(op, a, b):
    """(the full route's result, the lean route's result, whether the lean route served), and
    each result's streams as the op left them (numpy() waits for them and forgets them)."""
    with full_route():
        full = OPS[op](a, b)                 # plans (and remembers the plan)
    full_streams = set(full.storage.streams)
    runs = FAST.runs
    fast = OPS[op](a, b)
    fast_streams = set(fast.storage.streams)
    return full, fast, FAST.runs > runs, (full_streams, fast_streams)


# --- the same results ------------------------------------------------------------------------


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "int32", "int8"])
@pytest.mark.parametrize("shape", [(64,), (3, 5), (), (1,), (2, 1, 4)])
def test_the_lean_route_gives_the_full_routes_result_bit_for_bit(lean_any, op, dtype, shape):
    a = npumem.from_numpy(_values(dtype, shape, 1))
    b = npumem.from_numpy(_values(dtype, shape, 2))
    if op == "div" and np.dtype(dtype).kind == "i":     # a float result for an integer one
        with full_route():
            expected = _error(lambda: a / b)
        assert expected[0] is OpParamError
        assert _error(lambda: a / b) == expected
        return
    with np.errstate(all="ignore"):
        full, fast, served, (full_streams, fast_streams) = _both(op, a, b)
        OPS[op](b, b)                       # one tensor twice: its own plan, then its lean run
        again_served, again = _served(lambda: OPS[op](b, b))
        with full_route():
            again_full = OPS[op](b, b)
    assert served and again_served
    assert fast.numpy().tobytes() == full.numpy().tobytes()
    assert again.numpy().tobytes() == again_full.numpy().tobytes()
    assert _attributes(fast) == _attributes(full)
    assert list(_attributes(fast)) == list(_attributes(full))        # in the same order
    assert fast._span == (fast.storage.pointer, fast.storage.nbytes)
    def storage(tensor):                 # what a result's storage is, less where and when
        return {k: v for k, v in vars(tensor.storage).items()
                if k not in ("pointer", "streams", "_finalizer")}
    assert storage(fast) == storage(full)
    assert list(vars(fast.storage)) == list(vars(full.storage))
    assert fast.storage._finalizer() is fast.storage
    stream = RUNTIME.current_stream()
    assert fast_streams == full_streams == {stream}
    pool = npumem.memory.get_allocator()
    assert pool._other_streams.get(fast.storage.pointer) is None      # nothing to record
    assert pool._other_streams.get(full.storage.pointer) is None


def test_the_lean_route_counts_as_a_remembered_phase_1(lean):
    a = npumem.from_numpy(np.arange(64, dtype=np.float32))
    b = npumem.from_numpy(np.ones(64, np.float32))
    c = a + b
    hits, runs = PHASE1.hits, FAST.runs
    for _ in range(3):
        c = a + b
    assert (PHASE1.hits - hits, FAST.runs - runs) == (3, 3)
    np.testing.assert_array_equal(c.numpy(), np.arange(64, dtype=np.float32) + 1)


def test_results_go_back_to_the_pool_once(lean):
    a = npumem.from_numpy(np.arange(64, dtype=np.float32))
    a * a
    gc.collect()
    before = npumem.memory.memory_allocated()
    results = [a * a for _ in range(5)]
    assert FAST.runs and npumem.memory.memory_allocated() > before
    one = (npumem.memory.memory_allocated() - before) // 5
    results[0].storage.free()               # by hand, then dropped: given back once
    results[0].storage.free()
    assert npumem.memory.memory_allocated() == before + 4 * one
    del results
    gc.collect()
    assert npumem.memory.memory_allocated() == before


# --- what the lean route hands over -----------------------------------------------------------


def _served(expression) -> tuple[bool, object]:
    runs = FAST.runs
    value = expression()
    return FAST.runs > runs, value


@pytest.mark.parametrize("case", ["broadcast", "dtypes", "transposed", "offset view", "scalar",
                                  "reflected scalar", "empty", "subclass"])
def test_cases_outside_the_common_one_take_the_full_route(lean, case):
    x = np.arange(32, dtype=np.float32).reshape(4, 8) - 7
    a = npumem.from_numpy(x)
    y = np.linspace(-3, 5, 32, dtype=np.float32).reshape(4, 8)
    b = npumem.from_numpy(y)
    a + b                                   # a remembered plan for the common case
    if case == "broadcast":
        other = npumem.from_numpy(y[0].copy())
        expression, expected = (lambda: a + other), x + y[0]
    elif case == "dtypes":
        other = npumem.from_numpy(y.astype(np.float16))
        expression, expected = (lambda: a + other), x + y.astype(np.float16).astype(np.float32)
    elif case == "transposed":
        expression, expected = (lambda: a.t() * b.t()), (x.T * y.T)
    elif case == "offset view":
        wide = npumem.from_numpy(np.concatenate([x, y], axis=1))        # (4, 16)
        expression, expected = (lambda: wide[:, 8:] - b), y - y
    elif case == "scalar":
        expression, expected = (lambda: a + 2.0), x + np.float32(2.0)
    elif case == "reflected scalar":
        expression, expected = (lambda: 3 * a), np.float32(3) * x
    elif case == "empty":
        nothing = npumem.from_numpy(np.zeros((0, 8), np.float32))
        nothing + nothing
        expression, expected = (lambda: nothing + nothing), np.zeros((0, 8), np.float32)
    else:
        class Sub(npumem.Tensor):
            pass
        sub = Sub(a.storage, a.shape)
        sub + b
        expression, expected = (lambda: sub + b), x + y
    expression()                            # a second call: no plan for it either
    served, value = _served(expression)
    assert not served
    np.testing.assert_array_equal(value.numpy(), expected)


@pytest.mark.parametrize("level", ["free", "full"])
def test_the_pool_sanitizer_takes_the_full_route(lean, level):
    a = npumem.from_numpy(np.ones(16, np.float32))
    a + a
    assert _served(lambda: a + a)[0]
    sanitizer.enable(level)
    try:
        served, value = _served(lambda: a + a)
        assert not served
        np.testing.assert_array_equal(value.numpy(), np.full(16, 2, np.float32))
    finally:
        sanitizer.disable()
    if level == "free":
        b = npumem.from_numpy(np.ones(16, np.float32))
        b + b
        sanitizer.enable(level)
        b2 = npumem.from_numpy(np.ones(16, np.float32))
        sanitizer.disable()
        assert b2.storage.record is not None
        assert not _served(lambda: b2 + b2)[0]          # its record is checked: full route


class _Recorder:
    def __init__(self):
        self.ops, self.memory = [], []

    def on_memory(self, owner, action, device, address, size, requested, stream):
        self.memory.append(action)

    def on_op(self, name, device, stream, start_ns, end_ns):
        self.ops.append(name)


def test_a_listening_profiler_sees_the_full_routes_events(lean):
    a = npumem.from_numpy(np.ones(16, np.float32))
    a + a
    recorder = _Recorder()
    OBSERVERS.add(recorder)
    try:
        served, value = _served(lambda: a + a)
        del value
        gc.collect()
    finally:
        OBSERVERS.remove(recorder)
    assert not served
    assert recorder.ops == ["Add"]
    assert recorder.memory == ["alloc", "free"]


def test_a_busy_stream_queues_the_op_in_order(lean):
    a = npumem.from_numpy(np.ones(16, np.float32))
    a + a
    stream = RUNTIME.current_stream()
    gate, order = threading.Event(), []
    stream.enqueue(gate.wait, "gate")
    served, c = _served(lambda: a + a)
    stream.enqueue(lambda: order.append("after"), "after")
    assert not served
    assert not stream.query()                # queued behind the gate, not run inline
    gate.set()
    stream.synchronize()
    np.testing.assert_array_equal(c.numpy(), np.full(16, 2, np.float32))
    assert order == ["after"]
    assert _served(lambda: a + a)[0]        # idle again: the lean route


def test_an_error_waiting_for_synchronize_takes_the_full_route(lean):
    a = npumem.from_numpy(np.ones(16, np.float32))
    a + a
    stream = RUNTIME.current_stream()

    def fail():
        raise ValueError("earlier task")
    stream.submit(fail, "failing task")
    served, c = _served(lambda: a + a)
    assert not served
    with pytest.raises(AsyncTaskError, match="failing task queued on .* failed: ValueError"):
        stream.synchronize()
    np.testing.assert_array_equal(c.numpy(), np.full(16, 2, np.float32))


def test_the_stream_npumem_stream_sets_is_used(lean):
    a = npumem.from_numpy(np.arange(8, dtype=np.float32))
    a + a
    side = npumem.Stream()
    with npumem.stream(side):
        served, c = _served(lambda: a + a)
    assert served
    assert c.storage.streams == {side}
    assert side in a.storage.streams
    side.synchronize()
    np.testing.assert_array_equal(c.numpy(), 2 * np.arange(8, dtype=np.float32))


def test_another_current_device_takes_the_full_route(lean):
    from .conftest import need_devices
    need_devices(2)
    a = npumem.from_numpy(np.arange(8, dtype=np.float32))
    a + a
    npumem.set_device(1)
    served, c = _served(lambda: a + a)
    assert not served
    assert c.device == 1
    np.testing.assert_array_equal(c.numpy(), 2 * np.arange(8, dtype=np.float32))
    npumem.set_device(0)


def test_a_kernel_choice_or_registry_change_plans_again(lean, monkeypatch):
    a = npumem.from_numpy(np.arange(16, dtype=np.float32))
    a + a
    monkeypatch.setenv("NPUMEM_SIM_KERNELS", "tiled")
    served, c = _served(lambda: a + a)
    assert not served                       # the tiled kernels: never the lean route
    np.testing.assert_array_equal(c.numpy(), 2 * np.arange(16, dtype=np.float32))
    monkeypatch.delenv("NPUMEM_SIM_KERNELS")
    assert _served(lambda: a + a)[0]

    def sevens(args):
        args.outputs["out"][...] = 7
    REGISTRY.register("Add", sevens, device_types=("sim",), dtypes=["float"], priority=5,
                      name="sevens")
    try:
        served, c = _served(lambda: a + a)
        assert not served
        np.testing.assert_array_equal(c.numpy(), np.full(16, 7, np.float32))
        served, c = _served(lambda: a + a)    # the new plan, with the kernel registered
        assert served
        np.testing.assert_array_equal(c.numpy(), np.full(16, 7, np.float32))
    finally:
        REGISTRY.unregister("Add", "sevens")
    served, c = _served(lambda: a + a)
    assert not served
    np.testing.assert_array_equal(c.numpy(), 2 * np.arange(16, dtype=np.float32))


def test_a_failing_kernel_fails_the_same_way_on_both_routes(lean):
    a = npumem.from_numpy(np.arange(16, dtype=np.float32))
    stream = RUNTIME.current_stream()

    def boom(args):
        raise ValueError("boom")
    REGISTRY.register("Mul", boom, device_types=("sim",), dtypes=["float"], priority=5,
                      name="boom")
    messages = []
    try:
        for expect_served in (False, True):
            served, c = _served(lambda: a * a)
            assert served == expect_served
            with pytest.raises(AsyncTaskError) as error:
                stream.synchronize()
            messages.append(str(error.value))
            assert isinstance(error.value.__cause__, ValueError)
    finally:
        REGISTRY.unregister("Mul", "boom")
    pattern = r"Mul \(executor 0x[0-9a-f]+\) queued on <npumem default stream 0x[0-9a-f]+ " \
              r"on device 0> failed: ValueError: boom"
    for message in messages:
        assert re.search(pattern, message), message
    assert messages[0] != messages[1]       # each run its own executor number


def test_a_remembered_kernel_that_raises_is_recorded_on_the_stream(lean, monkeypatch):
    """The kernel a lean plan calls fails as it would on the full route."""
    a = npumem.from_numpy(np.arange(16, dtype=np.float32))
    a - a
    plans = [plan for plan in FAST._plans.values() if plan.op == "Sub"]
    assert plans and plans[0].kernel.__name__ == "sub_kernel"

    def broken(args):
        raise FloatingPointError("broken")
    monkeypatch.setattr(plans[0], "kernel", broken)
    served, c = _served(lambda: a - a)
    assert served
    with pytest.raises(AsyncTaskError, match=r"Sub \(executor 0x[0-9a-f]+\) queued on .* "
                                             "failed: FloatingPointError: broken"):
        RUNTIME.current_stream().synchronize()


# --- the same errors --------------------------------------------------------------------------


def _error(expression) -> tuple[type, str]:
    with pytest.raises(Exception) as error:
        expression()
    return type(error.value), str(error.value)


def test_errors_are_the_full_routes(lean):
    """Calls that look like a remembered plan but are not one: the lean route hands each back
    before it does anything (no lean run), and the full route's error is what comes out."""
    a = npumem.from_numpy(np.ones(4, np.float32))
    b = npumem.from_numpy(np.ones(3, np.float32))
    ints = npumem.from_numpy(np.ones(4, np.int32))
    a + a, ints + ints
    cases = [lambda: a + b, lambda: ints / ints, lambda: a @ a, lambda: a + "x"]
    for expression in cases:
        with full_route():
            expected = _error(expression)
        runs = FAST.runs
        assert _error(expression) == expected
        assert FAST.runs == runs
    assert _error(lambda: a + b) == (OpParamError, "add: shapes (4,) and (3,) do not broadcast "
                                                   "[ACLNN_ERR_PARAM_INVALID 161002]")


def test_a_freed_input_is_refused_as_the_full_route_refuses_it(lean):
    pointer = npumem.malloc(256)
    view = npumem.create_tensor((64,), "float32", data_ptr=pointer)
    npumem.memcpy(pointer, 256, np.ones(64, np.float32), 256, npumem.MemcpyKind.HOST_TO_DEVICE)
    view + view
    assert _served(lambda: view + view)[0]
    allocated = npumem.memory.memory_allocated()
    npumem.free(pointer)
    runs = FAST.runs
    with pytest.raises(MemoryAccessError, match="use after free"):
        view + view
    assert FAST.runs == runs
    gc.collect()
    assert npumem.memory.memory_allocated() == allocated      # the result went back


def test_views_are_checked_again_after_a_release(lean):
    a = npumem.from_numpy(np.arange(64, dtype=np.float32))
    b = npumem.from_numpy(np.ones(64, np.float32))
    a + b
    assert _served(lambda: a + b)[0]
    made_at = a._kernel_view[0]
    npumem.free(npumem.malloc(1 << 20))      # a release: views made before are checked again
    npumem.memory.empty_cache()
    assert RELEASES.value != made_at
    resolved = []
    backend = RUNTIME.backend
    real = backend.resolve
    backend.resolve = lambda *args: resolved.append(args[0]) or real(*args)
    try:
        served, c = _served(lambda: a + b)
    finally:
        del backend.resolve
    assert served and a._kernel_view[0] == RELEASES.value
    assert a.storage.pointer in resolved and b.storage.pointer in resolved
    np.testing.assert_array_equal(c.numpy(), np.arange(64, dtype=np.float32) + 1)


def test_threads_share_the_stream_in_order(lean):
    a = npumem.from_numpy(np.arange(256, dtype=np.float32))
    a + a
    expected = 2 * np.arange(256, dtype=np.float32)
    failures = []

    def work(_):
        for _ in range(200):
            c = a + a
            if not np.array_equal(c.numpy(), expected):
                failures.append(c)
    from .conftest import run_threads
    assert run_threads(work, 4) == []
    assert failures == []


def test_a_device_reset_drops_the_plans(lean):
    a = npumem.from_numpy(np.ones(8, np.float32))
    a + a
    assert FAST._plans
    del a
    gc.collect()
    npumem.reset_device(0)
    assert not FAST._plans


@pytest.mark.parametrize("finalize", [False, True])
def test_live_results_at_exit_leave_no_noise(finalize):
    """Storages alive at exit give their bytes back as weakref.finalize did, quietly, and
    those dying in the interpreter's teardown afterwards do nothing."""
    import subprocess
    import sys
    code = ("import numpy as np, npumem\n"
            "from npumem.device import sanitizer\n"
            "sanitizer.disable()\n"
            "npumem.init(); npumem.set_device(0)\n"
            "a = npumem.from_numpy(np.ones(64, np.float32))\n"
            "results = [a + a for _ in range(3)]\n"
            "kept = {'cycle': None}; kept['cycle'] = kept; kept['t'] = a * a\n"
            + ("npumem.finalize()\n" if finalize else ""))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr
