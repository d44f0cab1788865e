"""PyTorch habits on the Pythonic API (issue 21, part 2): where npumem uses torch's name it
behaves as torch does, or says what to write instead."""

import numpy as np
import pytest

import npumem
import npumem.acl as acl
from npumem import errors as E
from npumem.constants import DataType


def test_sizes_are_given_as_torch_gives_them():
    assert npumem.zeros(2, 2).shape == (2, 2) and npumem.zeros(2, 2).dtype == "float32"
    assert npumem.empty(4, 4).shape == (4, 4)
    assert npumem.zeros((2, 3), dtype="float16").dtype == DataType.FLOAT16
    assert npumem.empty([5]).shape == (5,)
    assert npumem.empty((4,), "uint8").dtype == np.uint8          # a dtype cannot be a size
    assert (npumem.zeros(3, dtype=np.int64).numpy() == 0).all()
    with pytest.raises(E.OpParamError, match="as a keyword"):
        npumem.empty((4, 4), 5)
    with pytest.raises(E.OpParamError, match="sizes are integers"):
        npumem.empty(2, "float32")
    with pytest.raises(E.OpParamError, match="needs a size"):
        npumem.zeros()


def test_first_use_starts_the_runtime_and_device_0():
    assert not npumem.is_initialized()
    assert npumem.memory.memory_allocated() == 0
    assert npumem.is_initialized() and npumem.get_device() == 0
    npumem.finalize()
    tensor = npumem.from_numpy(np.arange(4, dtype=np.float32))
    assert tensor.tolist() == [0, 1, 2, 3]
    assert "npumem NPU memory" in npumem.memory.memory_summary()
    del tensor
    npumem.finalize()
    assert isinstance(npumem.Stream(), npumem.Stream)
    npumem.finalize()
    with npumem.profile.track() as tracker:
        npumem.empty(16)
    assert [e.action for e in tracker.events() if e.action == "alloc"]


def test_the_ascendcl_calls_stay_strict():
    with pytest.raises(E.UninitializedError):
        npumem.malloc(64)
    assert acl.rt.malloc(64, 0)[1] == E.ACL_ERROR_UNINITIALIZE
    assert not npumem.is_initialized()


def test_streams_and_events_as_torch_has_them():
    side = npumem.Stream()
    assert npumem.current_stream() is not side
    a = npumem.from_numpy(np.ones((64, 64), np.float32))
    with npumem.stream(side):
        assert npumem.current_stream() is side
        start, end = npumem.Event(enable_timing=True), npumem.Event(enable_timing=True)
        start.record()
        product = a @ a
        end.record()
    assert npumem.current_stream() is not side
    end.synchronize()
    assert start.elapsed_time(end) >= 0
    other = npumem.Stream()
    other.wait_stream(side)
    done = other.record_event()
    done.synchronize() if hasattr(done, "synchronize") else npumem.synchronize_event(done)
    npumem.synchronize()
    assert (product.numpy() == 64).all()
    with npumem.stream(None):                         # torch.cuda.stream(None): no change
        assert npumem.current_stream() is npumem.default_stream()
    with pytest.raises(E.InvalidParamError, match="takes an npumem.Stream"):
        with npumem.stream("s"):
            pass


def test_device_queries():
    assert npumem.is_available() is True
    assert npumem.device_count() == npumem.get_device_count() >= 1
    free, total = npumem.memory.mem_get_info()
    assert 0 < free <= total


def test_tensor_methods_have_torchs_names():
    tensor = npumem.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4))
    assert tensor.numel() == 12 and tensor.dim() == 2 and tensor.element_size() == 4
    assert tensor.size() == (3, 4) and tensor.size(1) == 4 and tensor.size(-1) == 4
    row = tensor[1]
    assert row.data_ptr() == tensor.data_ptr() + 4 * 4          # the first element's address
    assert tensor[1, 2].item() == 6.0 and isinstance(tensor[1, 2].item(), float)
    with pytest.raises(E.OpParamError, match="one element"):
        tensor.item()
    assert tensor.tolist() == np.arange(12).reshape(3, 4).tolist()
    as_array = np.asarray(tensor)
    assert as_array.dtype == np.float32 and as_array.shape == (3, 4)
    scalar = npumem.from_numpy(np.float32(3.5))
    assert scalar.shape == () and scalar.item() == 3.5
    assert npumem.from_numpy(np.array(2, dtype=np.int64)).shape == ()


def test_dtypes_compare_with_torchs_and_numpys_names():
    tensor = npumem.zeros(2, dtype="bfloat16")
    assert tensor.dtype == "bfloat16" == DataType.BF16 and tensor.dtype != "float16"
    floats = npumem.zeros(2)
    assert floats.dtype == np.float32 and floats.dtype == "float" and floats.dtype == "torch.float32"
    assert floats.dtype != "no such type"
    torch = pytest.importorskip("torch")
    assert floats.dtype == torch.float32 and npumem.zeros(2, dtype=torch.float16).dtype == "half"


def test_arithmetic_operators_run_the_ops_on_the_current_stream():
    a = npumem.from_numpy(np.array([1.0, 2.0, 3.0], np.float32))
    b = npumem.from_numpy(np.array([4.0, 5.0, 6.0], np.float32))
    assert (a + b).tolist() == [5, 7, 9] and (b - a).tolist() == [3, 3, 3]
    assert (a * b).tolist() == [4, 10, 18] and (b / a).tolist() == [4, 2.5, 2]
    assert (2 * a).tolist() == [2, 4, 6] and (a + 1).tolist() == [2, 3, 4]
    m = npumem.from_numpy(np.eye(3, dtype=np.float32) * 2)
    column = npumem.from_numpy(np.ones((3, 1), np.float32))
    assert (m @ column).tolist() == [[2], [2], [2]]
    with pytest.raises(E.OpParamError, match="do not broadcast"):
        a + npumem.zeros(2)
    with pytest.raises(TypeError):
        a + "x"


def test_an_oom_larger_than_the_device_says_so(monkeypatch):
    monkeypatch.setenv("NPUMEM_SIM_MEMORY", "64MiB")
    with pytest.raises(E.MemoryAllocationError) as info:
        npumem.empty(1 << 30)                      # 4 GiB of float32 on a 64 MiB device
    assert "whole capacity" in str(info.value) and "Free tensors" not in str(info.value)


def test_custom_matmul_in_both_forms():
    torch = pytest.importorskip("torch")
    from npumem.bridges.autograd import CustomMatMul, CustomMatMulFunction

    a, b = torch.randn(4, 3), torch.randn(3, 2)
    expected = a @ b
    for product in (CustomMatMulFunction.apply(a, b), CustomMatMul.apply(a, b), CustomMatMul()(a, b)):
        torch.testing.assert_close(product, expected)


def test_a_stream_on_another_device_leaves_the_current_device_alone(monkeypatch):
    monkeypatch.setenv("NPUMEM_SIM_DEVICES", "2")
    assert npumem.Stream(device=1).device == 1
    assert npumem.current_device() == 0 and npumem.current_stream(1).device == 1
    assert npumem.current_device() == 0
