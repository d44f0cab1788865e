"""npumem.acl behaves like pyACL: names, return conventions, codes, constants, util helpers."""

import importlib.util
import pathlib
import sys

import numpy as np
import pytest

import npumem
import npumem.acl as acl
from npumem import errors as E

SEED_FRAMEWORK = pathlib.Path(__file__).parent / "data" / "seed000_test_framework.py"


@pytest.fixture
def session(monkeypatch):
    monkeypatch.setenv("NPUMEM_SIM_MEMORY", "256MiB")
    assert acl.init() == 0
    assert acl.rt.set_device(0) == 0
    yield
    acl.set_result_order("ret_last")


def test_lifecycle_codes(monkeypatch):
    monkeypatch.setenv("NPUMEM_SIM_MEMORY", "64MiB")
    assert acl.rt.set_device(0) == E.ACL_ERROR_UNINITIALIZE
    assert acl.init() == 0
    assert acl.init() == E.ACL_ERROR_REPEAT_INITIALIZE
    assert acl.rt.set_device(7) == E.ACL_ERROR_RT_INVALID_DEVICEID
    assert "ids 0..0" in acl.get_recent_err_msg()
    assert acl.finalize() == 0
    assert acl.finalize() == E.ACL_ERROR_REPEAT_FINALIZE


def test_memory_flow_with_pyacl_conventions(session):
    stream, ret = acl.rt.create_stream()
    assert ret == 0 and isinstance(stream, int) and stream != 0
    dev, ret = acl.rt.malloc(4096, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    assert ret == 0 and dev % 64 == 0
    host, ret = acl.rt.malloc_host(4096)
    assert ret == 0
    data = np.arange(1024, dtype=np.float32)
    assert acl.rt.memcpy(dev, 4096, acl.util.numpy_to_ptr(data), 4096, acl.ACL_MEMCPY_HOST_TO_DEVICE) == 0
    assert acl.rt.memset(host, 4096, 0, 4096) == 0
    assert acl.rt.memcpy_async(host, 4096, dev, 4096, acl.ACL_MEMCPY_DEVICE_TO_HOST, stream) == 0
    event, ret = acl.rt.create_event()
    assert acl.rt.record_event(event, stream) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    assert acl.rt.query_event(event) == (acl.ACL_EVENT_STATUS_COMPLETE, 0)
    view = acl.util.ptr_to_numpy(host, (1024,), 11)
    assert np.array_equal(view, data)
    free, total, ret = acl.rt.get_mem_info(acl.ACL_HBM_MEM)
    assert ret == 0 and total == 256 << 20 and free < total
    assert acl.rt.get_run_mode() == (acl.ACL_HOST, 0)
    assert acl.rt.get_device() == (0, 0)
    assert acl.rt.free(dev) == 0
    assert acl.rt.free_host(host) == 0
    assert acl.rt.destroy_event(event) == 0
    assert acl.rt.destroy_stream(stream) == 0
    assert acl.rt.reset_device(0) == 0
    assert acl.finalize() == 0


def test_failures_return_codes_and_zero_values(session):
    assert acl.rt.malloc(0, 0) == (0, E.ACL_ERROR_INVALID_PARAM)
    assert acl.rt.malloc(1 << 40, 0) == (0, E.ACL_ERROR_RT_MEMORY_ALLOCATION)
    assert "needs 1099511627808 bytes" in acl.get_recent_err_msg()
    dev, _ = acl.rt.malloc(64, 0)
    assert acl.rt.free(dev) == 0
    assert acl.rt.free(dev) == E.ACL_ERROR_RT_MEMORY_FREE
    assert acl.rt.memcpy(dev, 10, b"x" * 64, 64, 1) == E.ACL_ERROR_INVALID_PARAM
    assert acl.rt.get_mem_info(17) == (0, 0, E.ACL_ERROR_INVALID_PARAM)
    assert acl.rt.synchronize_stream(99) == E.ACL_ERROR_RT_PARAM_INVALID
    host, _ = acl.rt.malloc_host(128)
    assert acl.rt.memcpy_async(host, 128, host, 128, 0, 0) == E.ACL_ERROR_RT_FEATURE_NOT_SUPPORT


def test_contexts_and_timing(session):
    context, ret = acl.rt.create_context(0)
    assert ret == 0 and acl.rt.get_context() == (context, 0)
    stream, _ = acl.rt.create_stream()
    start, _ = acl.rt.create_event()
    end, _ = acl.rt.create_event()
    assert acl.rt.record_event(start, stream) == 0
    assert acl.rt.record_event(end, stream) == 0
    assert acl.rt.stream_wait_event(0, end) == 0
    assert acl.rt.synchronize_event(end) == 0
    elapsed, ret = acl.rt.event_elapsed_time(start, end)
    assert ret == 0 and elapsed >= 0
    assert acl.rt.synchronize_stream_with_timeout(stream, 1000) == 0
    assert acl.rt.synchronize_device() == 0
    assert acl.rt.destroy_context(context) == 0
    assert acl.rt.get_device_count() == (1, 0)


def test_seed_aliases_and_constants():
    assert acl.rt.malloc_type.HUGE_FIRST == acl.ACL_MEM_MALLOC_HUGE_FIRST == 0
    assert acl.rt.malloc_type.NORMAL_ONLY_P2P == 5
    assert acl.rt.memcpy_kind.HOST_TO_DEVICE == acl.ACL_MEMCPY_HOST_TO_DEVICE == 1
    assert acl.rt.memcpy_kind.DEVICE_TO_DEVICE == 3 and acl.ACL_MEMCPY_DEFAULT == 4
    assert (acl.ACL_DDR_MEM, acl.ACL_HBM_MEM, acl.ACL_HBM_MEM_NORMAL) == (0, 1, 5)
    assert (acl.ACL_DEVICE, acl.ACL_HOST) == (0, 1)
    assert (acl.ACL_FLOAT, acl.ACL_FLOAT16, acl.ACL_INT32, acl.ACL_FORMAT_ND) == (0, 1, 3, 2)
    assert acl.ACL_ERROR_RT_MEMORY_ALLOCATION == 207001 and acl.ACL_SUCCESS == 0


def test_dvpp_memory(session):
    pointer, ret = acl.media.dvpp_malloc(1000)
    assert ret == 0 and pointer % 128 == 0
    assert acl.rt.free(pointer) == E.ACL_ERROR_RT_MEMORY_FREE
    assert acl.media.dvpp_free(pointer) == 0


def test_util_conversions(session):
    data = b"hello npu"
    pointer = acl.util.bytes_to_ptr(data)
    assert acl.util.ptr_to_bytes(pointer, len(data)) == data
    array = np.array([1.5, 2.5], dtype=np.float16)
    assert np.array_equal(acl.util.ptr_to_numpy(acl.util.numpy_to_ptr(array), (2,), 23), array)
    dev, _ = acl.rt.malloc(64, 0)
    with pytest.raises(E.InvalidParamError, match="device memory"):
        acl.util.ptr_to_bytes(dev, 8)
    with pytest.raises(E.InvalidParamError, match="type number"):
        acl.util.ptr_to_numpy(pointer, (2,), 9999)
    host, _ = acl.rt.malloc_host(64)
    with pytest.raises(E.InvalidParamError, match="past"):
        acl.util.ptr_to_numpy(host, (32,), 11)
    view = acl.util.ptr_to_numpy(host, (16,), 11)
    acl.rt.free_host(host)
    view[:] = 1.0                     # the view keeps its pinned buffer alive: no crash


def test_data_buffers(session):
    dev, _ = acl.rt.malloc(256, 0)
    buffer = acl.create_data_buffer(dev, 256)
    assert acl.get_data_buffer_addr(buffer) == dev
    assert acl.get_data_buffer_size_v2(buffer) == 256
    assert acl.update_data_buffer(buffer, dev, 128) == 0
    assert acl.get_data_buffer_size(buffer) == 128
    assert acl.destroy_data_buffer(buffer) == 0
    assert acl.destroy_data_buffer(buffer) == E.ACL_ERROR_RT_PARAM_INVALID
    assert acl.get_data_buffer_addr(buffer) == 0
    assert acl.create_data_buffer(0, 10) == 0


def test_result_order_can_put_ret_first(session):
    acl.set_result_order("ret_first")
    ret, pointer = acl.rt.malloc(64, 0)
    assert ret == 0 and pointer > 0
    assert acl.rt.get_mem_info(1)[0] == 0
    with pytest.raises(ValueError):
        acl.set_result_order("sideways")


def test_the_seed_article_framework_runs_unchanged(monkeypatch, capsys):
    """Seed 000's test_framework.py, verbatim, against `import acl` = npumem.acl."""
    monkeypatch.setenv("NPUMEM_SIM_MEMORY", "256MiB")
    monkeypatch.setitem(sys.modules, "acl", None)          # no real pyACL here
    acl.install_as_acl(force=True)
    acl.set_result_order("ret_first")                      # the article unpacks `ret, value = ...`
    try:
        spec = importlib.util.spec_from_file_location("seed_framework", SEED_FRAMEWORK)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        framework = module.AclnnTestFramework(device_id=0)
        data = framework.generate_test_data((64, 64), np.float32)
        device_ptr = framework.allocate_device_memory(data)
        copy_ptr = framework.allocate_device_memory(np.zeros_like(data))

        def copy_on_stream():
            acl.rt.memcpy_async(copy_ptr, data.nbytes, device_ptr, data.nbytes,
                                acl.rt.memcpy_kind.DEVICE_TO_DEVICE, framework.stream)

        assert framework.execute_operator(copy_on_stream) >= 0
        assert framework.verify_results(copy_ptr, data) is True
        ints = framework.generate_test_data((10,), np.int32, (0, 100))
        assert framework.verify_results(framework.allocate_device_memory(ints), ints) is True
        acl.rt.free(device_ptr)
        with pytest.warns(E.LiveAllocationsWarning):
            framework.cleanup()
        assert not npumem.is_initialized()
        assert "Verification passed" in capsys.readouterr().out
    finally:
        acl.set_result_order("ret_last")
        sys.modules.pop("acl.rt", None), sys.modules.pop("acl.util", None)
        sys.modules.pop("acl.media", None), sys.modules.pop("acl.constants", None)


def test_op_wait_timeout_through_the_shim(session):
    assert acl.rt.set_op_wait_timeout(-1) == E.ACL_ERROR_INVALID_PARAM
    assert acl.rt.set_op_wait_timeout(5) == 0
    assert acl.rt.set_op_wait_timeout(0) == 0
