"""Tensors and the two-phase operator API: results against numpy, honest workspaces, errors."""

import gc

import numpy as np
import pytest

import npumem
import npumem.memory as mem
from npumem import aclnn, ops
from npumem.constants import DataType
from npumem.errors import (
    ACLNN_ERR_INNER_NULLPTR, ACLNN_ERR_PARAM_INVALID, ACLNN_ERR_PARAM_NULLPTR, ExecutorError,
    MemoryAccessError, OpNullptrError, OpParamError,
)


@pytest.fixture
def rt(any_rt):
    """This module is a conformance suite: every test runs on each backend (conftest.BACKENDS)."""
    return any_rt



@pytest.fixture
def stream(rt):
    s = rt.create_stream()
    yield s
    s.synchronize()


def run(plan, runner, stream):
    """Both phases with a pool workspace; returns the workspace size phase 1 asked for."""
    return aclnn.run_with_pool_workspace(runner, plan, stream)


def rand(*shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# --- tensors --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int8, np.int32,
                                   np.int64, np.uint8, np.bool_])
def test_from_numpy_round_trips(rt, stream, dtype):
    host = (np.arange(24).reshape(2, 3, 4) % 5).astype(dtype)
    for s in (None, stream):
        tensor = ops.from_numpy(host, s)
        assert tensor.shape == (2, 3, 4) and tensor.is_contiguous()
        assert tensor.address % 32 == 0
        np.testing.assert_array_equal(tensor.numpy(), host)


def test_views_share_storage_and_copy_nothing(rt):
    host = rand(4, 6)
    tensor = ops.from_numpy(host)
    npumem.copy_stats(reset=True)
    views = {"t": (tensor.t(), host.T), "slice": (tensor[1:3, ::2], host[1:3, ::2]),
             "row": (tensor[2], host[2]), "permute": (tensor.permute([1, 0]), host.T)}
    assert npumem.copy_stats()["total_bytes"] == 0
    for name, (view, expected) in views.items():
        assert view.storage is tensor.storage, name
        np.testing.assert_array_equal(view.numpy(), expected)
    assert not tensor.t().is_contiguous() and tensor[1].is_contiguous()
    assert tensor.reshape(3, -1).shape == (3, 8)
    with pytest.raises(OpParamError, match="contiguous"):
        tensor.t().reshape(24)
    with pytest.raises(OpParamError, match="out of range"):
        tensor[4]
    with pytest.raises(OpParamError, match="negative slice"):
        tensor[::-1]


def test_tensor_memory_goes_back_to_the_pool(rt):
    before = mem.memory_allocated()
    tensor = ops.zeros((256, 256))
    assert mem.memory_allocated() > before
    np.testing.assert_array_equal(tensor.numpy(), np.zeros((256, 256), np.float32))
    view = tensor.t()
    del tensor
    assert mem.memory_allocated() > before       # the view keeps the storage
    del view
    gc.collect()
    assert mem.memory_allocated() == before


def test_create_tensor_checks_its_memory(rt):
    pointer = rt.malloc(4096)
    tensor = ops.create_tensor((8, 8), "float", (1, 8), 0, data_ptr=pointer)
    assert tensor.shape == (8, 8) and not tensor.is_contiguous()
    with pytest.raises(OpParamError, match="32-byte aligned"):
        ops.create_tensor((4,), "float", data_ptr=pointer + 4)
    with pytest.raises(OpNullptrError) as null:
        ops.create_tensor((4,), "float", data_ptr=0)
    assert null.value.code == ACLNN_ERR_PARAM_NULLPTR
    with pytest.raises(MemoryAccessError, match="past the end"):
        ops.create_tensor((2048,), "float", data_ptr=pointer)
    rt.free(pointer)
    with pytest.raises(MemoryAccessError, match="use after free"):
        ops.create_tensor((4,), "float", data_ptr=pointer)
    # the op checks again at launch: the memory was freed after phase 1
    other = rt.malloc(4096)
    a = ops.create_tensor((16,), "float", data_ptr=other)
    out = ops.empty((16,))
    size, executor = aclnn.add_get_workspace_size(a, a, 1, out)
    rt.free(other)
    with pytest.raises(MemoryAccessError, match="use after free"):
        aclnn.add(None, size, executor)


# --- ops against numpy ----------------------------------------------------------------------


BINARY = [
    ("add", lambda a, b: a + 2 * b, {"alpha": 2.0}),
    ("sub", lambda a, b: a - b, {"alpha": 1}),
    ("mul", lambda a, b: a * b, {}),
    ("div", lambda a, b: a / b, {}),
]


@pytest.mark.parametrize("name,reference,extra", BINARY, ids=[b[0] for b in BINARY])
def test_binary_ops_broadcast(rt, stream, name, reference, extra):
    x, y = rand(3, 4, 5), rand(4, 1, seed=1) + 3
    a, b, out = ops.from_numpy(x, stream), ops.from_numpy(y, stream), ops.empty((3, 4, 5))
    plan = getattr(aclnn, f"{name}_get_workspace_size")(a, b, *extra.values(), out)
    size = run(plan, getattr(aclnn, name), stream)
    assert size == (64 if extra.get("alpha", 1) != 1 else 0)   # alpha * other, rounded to 64
    np.testing.assert_allclose(out.numpy(), reference(x, y), rtol=1e-6)


def test_non_contiguous_inputs_are_copied_into_the_workspace(rt, stream):
    x = rand(6, 6)
    a, out = ops.from_numpy(x, stream), ops.empty((6, 6))
    assert run(aclnn.add_get_workspace_size(a, a, 1, out), aclnn.add, stream) == 0
    size = run(aclnn.add_get_workspace_size(a.t(), a, 1, out), aclnn.add, stream)
    assert size == 192                               # 144 bytes of a.T, rounded up to 64
    np.testing.assert_allclose(out.numpy(), x.T + x)


def test_matmul_2d_batched_and_half(rt, stream):
    x, y = rand(5, 3), rand(3, 4, seed=1)
    a, b, out = ops.from_numpy(x), ops.from_numpy(y), ops.empty((5, 4))
    assert run(aclnn.matmul_get_workspace_size(a, b, out), aclnn.matmul, stream) == 0
    np.testing.assert_allclose(out.numpy(), x @ y, rtol=1e-5)

    bx, by = rand(2, 5, 3), rand(3, 4)
    batched = ops.empty((2, 5, 4))
    run(aclnn.matmul_get_workspace_size(ops.from_numpy(bx), ops.from_numpy(by), batched),
        aclnn.matmul, stream)
    np.testing.assert_allclose(batched.numpy(), bx @ by, rtol=1e-5)

    hx, hy = x.astype(np.float16), y.astype(np.float16)
    half = ops.empty((5, 4), "float16")
    size = run(aclnn.matmul_get_workspace_size(ops.from_numpy(hx), ops.from_numpy(hy), half),
               aclnn.matmul, stream)
    assert size == 5 * 4 * 4 + 48                    # float32 accumulator, rounded up to 64 * 2
    np.testing.assert_allclose(half.numpy(), (hx.astype(np.float32) @ hy).astype(np.float16),
                               rtol=1e-3)
    with pytest.raises(OpParamError, match="inner dims 3 and 5"):
        aclnn.matmul_get_workspace_size(a, a, out)


def test_reductions_softmax_cast_fill_layout(rt, stream):
    x = rand(3, 4, 5)
    a = ops.from_numpy(x, stream)
    total = ops.empty((4,))
    run(aclnn.reduce_sum_get_workspace_size(a, (0, 2), False, None, total), aclnn.reduce_sum, stream)
    np.testing.assert_allclose(total.numpy(), x.sum(axis=(0, 2)), rtol=1e-5)
    mean = ops.empty((3, 1, 1))
    run(aclnn.mean_get_workspace_size(a, [-1, 1], True, "float", mean), aclnn.mean, stream)
    np.testing.assert_allclose(mean.numpy(), x.mean(axis=(1, 2), keepdims=True), rtol=1e-5)

    soft = ops.empty((3, 4, 5))
    size = run(aclnn.softmax_get_workspace_size(a, 1, soft), aclnn.softmax, stream)
    assert size > 0                                  # row maxima and sums
    expected = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(soft.numpy(), expected / expected.sum(1, keepdims=True), rtol=1e-5)

    as_int = ops.empty((3, 4, 5), "int32")
    run(aclnn.cast_get_workspace_size(a, "int32", as_int), aclnn.cast, stream)
    np.testing.assert_array_equal(as_int.numpy(), x.astype(np.int32))
    bf16 = ops.empty((3, 4, 5), "bf16")
    back = ops.empty((3, 4, 5))
    run(aclnn.cast_get_workspace_size(a, DataType.BF16, bf16), aclnn.cast, stream)
    run(aclnn.cast_get_workspace_size(bf16, "float", back), aclnn.cast, stream)
    np.testing.assert_allclose(back.numpy(), x, rtol=2 ** -8)

    perm = ops.empty((5, 3, 4))
    run(aclnn.transpose_get_workspace_size(a, (2, 0, 1), perm), aclnn.transpose, stream)
    np.testing.assert_array_equal(perm.numpy(), x.transpose(2, 0, 1))
    dense = ops.empty((5, 4, 3))
    assert run(aclnn.contiguous_get_workspace_size(a.permute([2, 1, 0]), dense),
               aclnn.contiguous, stream) == 0
    np.testing.assert_array_equal(dense.numpy(), x.transpose(2, 1, 0))
    run(aclnn.fill_get_workspace_size(dense[1:3], 7.5), aclnn.fill, stream)
    got = dense.numpy()
    assert (got[1:3] == 7.5).all() and np.array_equal(got[0], x.transpose(2, 1, 0)[0])


def test_ops_queue_asynchronously_in_stream_order(rt, stream):
    x = rand(64, 64)
    a, out = ops.from_numpy(x, stream), ops.empty((64, 64), stream=stream)
    for i in range(5):                   # out = a + a, then out = out + a four times, in order
        run(aclnn.add_get_workspace_size(out if i else a, a, 1, out), aclnn.add, stream)
    np.testing.assert_allclose(out.numpy(), 6 * x, rtol=1e-5)


def test_executor_records_what_it_touched(rt, stream):
    a = ops.from_numpy(rand(4, 4))
    out = ops.empty((4, 4))
    size, executor = aclnn.matmul_get_workspace_size(a.t(), a, out)
    aclnn.set_executor_repeatable(executor)
    run((size, executor), aclnn.matmul, stream)
    stream.synchronize()
    roles = [role for role, *_ in executor.touched]
    assert roles == ["workspace", "input self", "input mat2", "output out"]
    assert executor.runs == 1
    aclnn.destroy_executor(executor)


# --- executor lifecycle and errors ----------------------------------------------------------


def test_executor_is_single_use_unless_repeatable(rt, stream):
    a, out = ops.from_numpy(rand(8)), ops.empty((8,))
    size, executor = aclnn.add_get_workspace_size(a, a, 1, out)
    aclnn.add(None, size, executor, stream)
    with pytest.raises(ExecutorError, match="already ran") as again:
        aclnn.add(None, size, executor, stream)
    assert again.value.code == ACLNN_ERR_INNER_NULLPTR
    with pytest.raises(ExecutorError, match="already ran"):
        aclnn.set_executor_repeatable(executor)

    total = ops.zeros((8,))
    size, executor = aclnn.add_get_workspace_size(total, a, 1, total)
    with pytest.raises(ExecutorError, match="right after phase 1"):
        aclnn.add(None, size, executor, stream)
        aclnn.set_executor_repeatable(executor)
    size, executor = aclnn.add_get_workspace_size(total, a, 1, total)
    aclnn.set_executor_repeatable(executor)
    for _ in range(3):
        aclnn.add(None, size, executor, stream)
    np.testing.assert_allclose(total.numpy(), 4 * a.numpy(), rtol=1e-6)   # 1 + 3 runs
    aclnn.destroy_executor(executor)
    with pytest.raises(ExecutorError, match="destroyed"):
        aclnn.add(None, size, executor, stream)
    with pytest.raises(ExecutorError, match="null"):
        aclnn.add(None, 0, None, stream)


def test_workspace_errors_change_nothing(rt, stream):
    a, out = ops.from_numpy(rand(16, 16)), ops.empty((16, 16))
    size, executor = aclnn.matmul_get_workspace_size(a.t(), a, out)
    before = mem.memory_stats()
    with pytest.raises(OpNullptrError, match=f"needs a {size}-byte workspace") as missing:
        aclnn.matmul(None, size, executor, stream)
    assert missing.value.code == ACLNN_ERR_PARAM_NULLPTR
    small = mem.caching_allocator_alloc(size // 2)
    with pytest.raises(OpParamError, match="smaller than") as too_small:
        aclnn.matmul(small, size // 2, executor, stream)
    assert too_small.value.code == ACLNN_ERR_PARAM_INVALID
    short = rt.malloc(size // 2)
    with pytest.raises(MemoryAccessError, match="past the end"):
        aclnn.matmul(short, size, executor, stream)    # lies about its size: caught
    rt.free(short)
    with pytest.raises(OpParamError, match="planned for MatMul"):
        aclnn.add(small, size, executor, stream)
    mem.caching_allocator_delete(small)
    assert mem.memory_stats()["allocated_bytes.all.current"] == before["allocated_bytes.all.current"]
    # the executor survived every rejected launch
    assert run((size, executor), aclnn.matmul, stream) == size
    x = a.numpy()
    expected = x.T @ x                 # a GPU sums in another order: tolerance scaled to the data
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


@pytest.mark.parametrize("call,match", [
    (lambda t: aclnn.add_get_workspace_size(None, t["a"], 1, t["out"]), "self is null"),
    (lambda t: aclnn.add_get_workspace_size(t["a"], np.ones(3), 1, t["out"]), "must be an npumem.Tensor"),
    (lambda t: aclnn.add_get_workspace_size(t["a"], t["a"], 1, t["3x3"]), "has shape"),
    (lambda t: aclnn.add_get_workspace_size(t["a"], t["5"], 1, t["out"]), "do not broadcast"),
    (lambda t: aclnn.add_get_workspace_size(t["a"], t["a"], 1, t["int32"]), "cannot be stored"),
    (lambda t: aclnn.matmul_get_workspace_size(t["a"], t["a"], t["out"]), "at least 2 dims"),
    (lambda t: aclnn.reduce_sum_get_workspace_size(t["a"], 3, False, None, t["out"]), "out of range"),
    (lambda t: aclnn.reduce_sum_get_workspace_size(t["a"], (0, 0), False, None, t["out"]), "repeat"),
    (lambda t: aclnn.softmax_get_workspace_size(t["int32"], 0, t["out"]), "floating"),
    (lambda t: aclnn.cast_get_workspace_size(t["a"], "float16", t["out"]), "out is float"),
    (lambda t: aclnn.add_get_workspace_size(t["bf16"], t["a"], 1, t["out"]), "bf16"),
    (lambda t: aclnn.fill_get_workspace_size(t["int8"], 1000), "does not fit"),
])
def test_bad_arguments_raise_aclnn_errors(rt, call, match):
    tensors = {"a": ops.from_numpy(np.arange(4, dtype=np.float32)), "out": ops.empty((4,)),
               "3x3": ops.empty((3, 3)), "5": ops.empty((5,)), "int32": ops.empty((4,), "int32"),
               "bf16": ops.empty((4,), "bf16"), "int8": ops.empty((4,), "int8")}
    allocated = mem.memory_allocated()
    with pytest.raises((OpParamError, OpNullptrError), match=match) as error:
        call(tensors)
    assert error.value.code in (ACLNN_ERR_PARAM_INVALID, ACLNN_ERR_PARAM_NULLPTR)
    assert mem.memory_allocated() == allocated        # nothing leaked, nothing freed
    np.testing.assert_array_equal(tensors["a"].numpy(), np.arange(4, dtype=np.float32))


# --- registry -------------------------------------------------------------------------------


def test_registry_dispatch_priority_and_conflicts(rt, stream):
    registry = ops.REGISTRY
    assert {"Add", "Sub", "Mul", "Div", "MatMul", "Cast", "ReduceSum", "Mean", "Softmax",
            "Transpose", "Contiguous", "Fill"} <= set(ops.list_ops())
    calls = []
    device_type = npumem.get_backend().name          # "sim", "torch:cpu", ...

    def traced_add(args):
        calls.append(tuple(args.inputs["self"].shape))
        args.outputs["out"][...] = args.inputs["self"] + args.inputs["other"]   # numpy or torch

    with pytest.raises(OpParamError, match="would serve the same calls"):
        registry.register("Add", traced_add, device_types=(device_type,), dtypes=["float"])
    registry.register("Add", traced_add, device_types=(device_type,), dtypes=["float"], priority=5,
                      name="traced")
    try:
        a, out = ops.from_numpy(np.ones(3, np.float32)), ops.empty((3,))
        run(aclnn.add_get_workspace_size(a, a, 1, out), aclnn.add, stream)
        np.testing.assert_array_equal(out.numpy(), [2, 2, 2])
        assert calls == [(3,)]
        ints = ops.from_numpy(np.ones(3, np.int32))
        run(aclnn.add_get_workspace_size(ints, ints, 1, ops.empty((3,), "int32")), aclnn.add, stream)
        assert calls == [(3,)]                       # int32 went to the built-in kernel
        with pytest.raises(OpParamError, match="no implementation for float on device type 'gpu'"):
            registry.lookup("Softmax", "gpu", DataType.FLOAT)
        with pytest.raises(OpParamError, match="no op named 'Conv'"):
            registry.lookup("Conv", "sim", DataType.FLOAT)
    finally:
        registry.unregister("Add", "traced")
    replaced = registry.register("Fill", lambda args: None, device_types=("sim",),
                                 name="noop", override=True)
    try:
        assert [impl.name for impl in registry.implementations("Fill")
                if "sim" in impl.device_types] == ["noop"]
    finally:
        from npumem.ops import kernels
        registry.register("Fill", kernels.fill_kernel, device_types=("sim",),
                          name="numpy_fill", override=True)
    assert replaced.op == "Fill"


# --- zero copy and DLPack -------------------------------------------------------------------


def test_zero_copy_ops_move_no_bytes(rt, stream):
    with npumem.ZeroCopyMemory(1 << 16) as zc:
        x, y = zc.tensor((16, 16)), zc.tensor((16, 16))
        host = np.asarray(x)
        host[:] = rand(16, 16)
        npumem.copy_stats(reset=True)
        size = run(aclnn.matmul_get_workspace_size(x, x, y), aclnn.matmul, stream)
        stream.synchronize()
        expected = host @ host         # a GPU sums in another order: tolerance scaled to the data
        np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-5,
                                   atol=1e-5 * np.abs(expected).max())
        assert size == 0 and npumem.copy_stats()["total_bytes"] == 0
        with pytest.raises(npumem.errors.MemoryFreeError, match="host_unregister it first"):
            npumem.free_host(zc.host_ptr)
        del x, y, host
    assert rt.RUNTIME.backend.live_allocations(0) == []


def test_host_register_needs_pinned_memory(rt):
    with pytest.raises(npumem.errors.InvalidMemoryTypeError, match="malloc_host"):
        npumem.host_register(np.zeros(64).ctypes.data, 64)
    pinned = npumem.malloc_host(256)
    with pytest.raises(npumem.errors.InvalidParamError, match="past the end"):
        npumem.host_register(pinned + 128, 256)
    device = npumem.host_register(pinned + 128, 128)
    npumem.memset(device, 128, 9, 128)                     # the device writes the host bytes
    out = bytearray(128)
    npumem.memcpy(out, 128, pinned + 128, 128, npumem.MemcpyKind.HOST_TO_HOST)
    assert out == bytes([9]) * 128
    npumem.host_unregister(device)
    npumem.free_host(pinned)


def test_dlpack_exchange(rt):
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    if npumem.get_backend().name == "torch:cuda":          # a GPU maps page-locked memory only
        with pytest.raises(npumem.errors.FeatureNotSupportedError, match="pageable"):
            npumem.from_dlpack(host)
        host = _pinned(host)
    shared = npumem.from_dlpack(host)                      # host memory, mapped to the device
    assert shared.__dlpack_device__() == (1, 0)
    np.asarray(shared)[0, 0] = 99
    assert host[0, 0] == 99
    back = np.from_dlpack(shared.t())
    assert back[0, 0] == 99 and back.shape == (4, 3)

    device = ops.from_numpy(host)
    if npumem.get_backend().name == "sim":
        assert device.__dlpack_device__() == (12, 0)
        with pytest.raises(BufferError, match="device memory"):
            np.from_dlpack(device)
    elif npumem.get_backend().name == "torch:cuda":
        assert device.__dlpack_device__() == (2, 0)       # kDLCUDA: for CUDA consumers
    else:                          # torch:cpu device memory is host memory: exported in place
        assert device.__dlpack_device__() == (1, 0)
        assert np.from_dlpack(device)[0, 0] == 99
    assert not hasattr(device, "__array_interface__")
    same = npumem.from_dlpack(device)
    assert same.storage is device.storage


def _pinned(array: np.ndarray) -> np.ndarray:
    """A copy of `array` in page-locked memory (PyTorch's pinned allocator)."""
    import torch
    return torch.from_numpy(array).pin_memory().numpy()


def test_dlpack_with_torch(rt):
    torch = pytest.importorskip("torch")
    source = torch.arange(6, dtype=torch.float32)
    if npumem.get_backend().name == "torch:cuda":
        source = source.pin_memory()
    tensor = npumem.from_dlpack(source)
    out = ops.empty((6,))
    size, executor = aclnn.mul_get_workspace_size(tensor, tensor, out)
    aclnn.mul(None, size, executor)
    np.testing.assert_array_equal(out.numpy(), np.arange(6) ** 2)
    view = torch.from_dlpack(tensor)
    view[1] = 50
    assert source[1].item() == 50


def test_storage_used_on_another_stream_is_not_reused_early(rt):
    import threading

    alloc_stream, compute_stream = rt.create_stream(), rt.create_stream()
    gate = threading.Event()
    compute_stream.enqueue(gate.wait, "held until the test says so")
    x = rand(32, 32)
    source = ops.from_numpy(x, alloc_stream)
    alloc_stream.synchronize()
    out = ops.empty((32, 32), stream=compute_stream)
    address = source.address
    size, executor = aclnn.mul_get_workspace_size(source, source, out)
    aclnn.mul(None, size, executor, compute_stream)   # queued behind the gate
    try:
        source.storage.free()          # explicit early free; the queued op still reads it
        reused = ops.empty((32, 32), stream=alloc_stream)
        assert reused.address != address               # still in use on compute_stream
    finally:
        gate.set()
    np.testing.assert_allclose(out.numpy(), x * x)


def test_a_finished_op_does_not_pin_its_tensors(rt, stream):
    before = mem.memory_allocated()
    a, out = ops.from_numpy(rand(64, 64)), ops.empty((64, 64))
    run(aclnn.mul_get_workspace_size(a, a, out), aclnn.mul, stream)
    stream.synchronize()
    del a, out                    # the stream worker must not hold the last task's captures
    assert mem.memory_allocated() == before
