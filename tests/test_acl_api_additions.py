"""The pyACL calls added after the first shim (CANN's codes and edge cases), the areas left out
(acl.op / acl.mdl / acl.prof), the converters' refusal of memory npumem cannot vouch for, and a
sweep showing that no acl call raises on a wrong-typed argument (docs/acl.md)."""

import gc
import inspect
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import npumem.acl as acl
from npumem import errors as E
from npumem.runtime.handles import lookup
from npumem.runtime.stream import Stream

H2D, D2H = 1, 2
PARAM_CODES = {E.ACL_ERROR_INVALID_PARAM, E.ACL_ERROR_RT_PARAM_INVALID,
               E.ACL_ERROR_RT_INVALID_DEVICEID}


@pytest.fixture
def session(monkeypatch):
    monkeypatch.setenv("NPUMEM_SIM_MEMORY", "256MiB")
    assert acl.init() == 0
    assert acl.rt.set_device(0) == 0
    acl.rt.get_last_error(0)
    yield
    acl.set_result_order("ret_last")


def _gated_stream():
    """A stream held busy until the returned gate is set."""
    stream, ret = acl.rt.create_stream()
    assert ret == 0
    gate = threading.Event()
    lookup(stream, Stream, "test").enqueue(gate.wait, "held by the test")
    return stream, gate


def _page_aligned(nbytes: int) -> np.ndarray:
    raw = np.zeros(nbytes + 4096, dtype=np.uint8)
    skip = -raw.ctypes.data % 4096
    return raw[skip:skip + nbytes]


# --- version and last error ------------------------------------------------------------------

def test_get_version_works_before_init():
    major, minor, patch, ret = acl.get_version()
    assert ret == 0 and (major, minor, patch) == (1, 17, 0)


def test_last_error_is_per_thread_get_clears_and_peek_does_not(session):
    assert acl.rt.get_last_error(acl.rt.ACL_RT_THREAD_LEVEL) == 0
    assert acl.rt.free(0) == E.ACL_ERROR_INVALID_PARAM
    assert acl.rt.peek_at_last_error(0) == E.ACL_ERROR_INVALID_PARAM
    assert acl.rt.peek_at_last_error(0) == E.ACL_ERROR_INVALID_PARAM
    assert acl.rt.synchronize_stream(99) == E.ACL_ERROR_RT_PARAM_INVALID     # the latest wins
    seen = []
    thread = threading.Thread(target=lambda: seen.append(acl.rt.peek_at_last_error(0)))
    thread.start()
    thread.join()
    assert seen == [0]                                          # another thread's is its own
    assert acl.rt.get_last_error(1) == E.ACL_ERROR_INVALID_PARAM     # only the thread level
    assert acl.rt.get_last_error("thread") == E.ACL_ERROR_INVALID_PARAM
    assert acl.rt.get_last_error(0) == E.ACL_ERROR_RT_PARAM_INVALID  # a bad level kept it
    assert acl.rt.get_last_error(0) == 0
    with pytest.raises(E.InvalidParamError):
        acl.util.ptr_to_bytes(16, 64)
    assert acl.rt.get_last_error(0) == E.ACL_ERROR_INVALID_PARAM     # converters record too


# --- memory ----------------------------------------------------------------------------------

def test_get_mem_usage_info_reports_components_with_peaks(session):
    big, _ = acl.rt.malloc(3 << 20, 0)
    small, _ = acl.rt.malloc_align32(1000, 0)
    rows, ret = acl.rt.get_mem_usage_info(0, 8)
    assert ret == 0 and [row["name"] for row in rows] == ["malloc", "malloc_align32"]
    assert rows[0]["cur_mem_size"] >= 3 << 20 and rows[1]["cur_mem_size"] == 1024
    assert all(row["mem_peak_size"] >= row["cur_mem_size"] for row in rows)
    assert acl.rt.get_mem_usage_info(0, 1) == ([rows[0]], 0)        # input_num caps the list
    assert acl.rt.get_mem_usage_info(0, 0) == ([], 0)
    assert acl.rt.free(big) == 0
    rows, _ = acl.rt.get_mem_usage_info(0, 8)
    after = {row["name"]: row for row in rows}
    assert after["malloc"]["cur_mem_size"] == 0 and after["malloc"]["mem_peak_size"] >= 3 << 20
    assert rows[0]["name"] == "malloc_align32"                      # largest current first
    assert acl.rt.get_mem_usage_info(7, 8) == ([], E.ACL_ERROR_RT_INVALID_DEVICEID)
    assert acl.rt.get_mem_usage_info(0, -1)[1] == E.ACL_ERROR_INVALID_PARAM
    assert acl.rt.get_mem_usage_info(0, "8")[1] == E.ACL_ERROR_INVALID_PARAM
    assert acl.rt.free(small) == 0


def test_malloc_host_with_cfg(session):
    for cfg in (None, {}, {"attrs": [{"attr": 1, "value": 7}, {"attr": 2, "value": 0}]},
                {"attrs": [{"attr": 2, "value": {"device_id": 0}}]}):
        pointer, ret = acl.rt.malloc_host_with_cfg(4096, cfg)
        assert ret == 0 and pointer % 64 == 0, cfg
        assert acl.rt.memset(pointer, 4096, 3, 4096) == 0
        assert acl.util.ptr_to_bytes(pointer, 4) == b"\x03" * 4
        assert acl.rt.free_host(pointer) == 0
    assert acl.rt.malloc_host_with_cfg(0, {}) == (0, E.ACL_ERROR_INVALID_PARAM)
    assert acl.rt.malloc_host_with_cfg(64, {"attrs": [{"attr": 2, "value": 5}]}) == \
        (0, E.ACL_ERROR_RT_INVALID_DEVICEID)
    assert acl.rt.malloc_host_with_cfg(64, {"attrs": [{"attr": 3, "value": 1}]}) == \
        (0, E.ACL_ERROR_RT_FEATURE_NOT_SUPPORT)
    assert acl.rt.malloc_host_with_cfg(64, {"attrs": [{"attr": 9, "value": 1}]}) == \
        (0, E.ACL_ERROR_INVALID_PARAM)
    assert acl.rt.malloc_host_with_cfg(64, "cfg") == (0, E.ACL_ERROR_INVALID_PARAM)
    assert acl.rt.malloc_host_with_cfg(64, {"attrs": 3}) == (0, E.ACL_ERROR_INVALID_PARAM)


def test_host_register_maps_pinned_memory_and_refuses_twice(session):
    host, _ = acl.rt.malloc_host(3 * 4096)
    assert acl.rt.memset(host, 3 * 4096, 0, 3 * 4096) == 0
    device, ret = acl.rt.host_register(host, 2 * 4096, acl.ACL_HOST_REGISTER_MAPPED)
    assert ret == 0 and device != host and device % 64 == 0
    data = np.arange(16, dtype=np.uint8)
    assert acl.rt.memcpy(device, 16, acl.util.numpy_to_ptr(data), 16, H2D) == 0
    assert acl.util.ptr_to_bytes(host, 16) == data.tobytes()         # no copy: the host sees it
    assert acl.rt.host_register(host, 2 * 4096, 0) == (0, E.ACL_ERROR_HOST_MEMORY_ALREADY_REGISTERED)
    aligned_inside = host + (-host % 4096) + 4096
    assert acl.rt.host_register(aligned_inside, 64, 0)[1] == E.ACL_ERROR_HOST_MEMORY_ALREADY_REGISTERED
    assert acl.rt.free_host(host) == E.ACL_ERROR_RT_MEMORY_FREE          # still mapped
    assert acl.rt.host_unregister(device) == E.ACL_ERROR_HOST_MEMORY_NOT_REGISTERED  # the host ptr
    assert acl.rt.host_unregister(host) == 0
    assert acl.rt.host_unregister(host) == E.ACL_ERROR_HOST_MEMORY_NOT_REGISTERED
    assert acl.rt.memcpy(device, 16, acl.util.numpy_to_ptr(data), 16, H2D) != 0    # unmapped
    assert acl.util.ptr_to_bytes(host, 16) == data.tobytes()         # the host bytes stay
    assert acl.rt.free_host(host) == 0


def test_host_register_argument_checks(session):
    host, _ = acl.rt.malloc_host(8192)
    before = acl.util.ptr_to_bytes(host, 64)
    assert acl.rt.host_register(host, 0, 0) == (0, E.ACL_ERROR_INVALID_PARAM)
    assert acl.rt.host_register(0, 64, 0) == (0, E.ACL_ERROR_INVALID_PARAM)
    assert acl.rt.host_register(host, 64, 4) == (0, E.ACL_ERROR_RT_FEATURE_NOT_SUPPORT)   # IOMEMORY
    assert acl.rt.host_register(host, 64, 8) == (0, E.ACL_ERROR_RT_FEATURE_NOT_SUPPORT)   # READONLY
    assert acl.rt.host_register(host, 64, 99) == (0, E.ACL_ERROR_INVALID_PARAM)
    # inside the buffer, not its start, not on a page (malloc_host aligns to 64 bytes only, so
    # host + 64 is a page's start when host lies 64 bytes below one)
    unaligned = host + 64 if (host + 64) % 4096 else host + 128
    assert acl.rt.host_register(unaligned, 64, 0) == (0, E.ACL_ERROR_RT_ADDR_UNALIGNED)
    assert acl.rt.host_register(host, 8193, 0) == (0, E.ACL_ERROR_RT_PARAM_INVALID)
    assert acl.rt.host_register(host, "64", 0)[1] == E.ACL_ERROR_INVALID_PARAM
    assert acl.rt.host_unregister("host") == E.ACL_ERROR_INVALID_PARAM
    device, _ = acl.rt.malloc(64, 0)
    assert acl.rt.host_register(device, 64, 0)[1] == E.ACL_ERROR_RT_INVALID_MEMORY_TYPE
    made_up = 0x7F0000000000
    assert acl.rt.host_register(made_up, 4096, 0)[1] == E.ACL_ERROR_RT_INVALID_MEMORY_TYPE
    assert acl.util.ptr_to_bytes(host, 64) == before and acl.rt.free_host(host) == 0


def test_host_register_of_a_buffer_npumem_handed_out(session):
    pageable = _page_aligned(4096)
    pointer = acl.util.numpy_to_ptr(pageable)
    device, ret = acl.rt.host_register(pointer, 4096, 0)
    assert ret == 0
    assert acl.rt.memset(device, 4096, 7, 4096) == 0
    assert (pageable == 7).all()
    assert acl.rt.host_unregister(pointer) == 0
    frozen = bytes(8192)
    start = acl.util.bytes_to_ptr(frozen)
    inside = start + (-start % 4096)
    assert acl.rt.host_register(inside, 64, 0)[1] == E.ACL_ERROR_RT_INVALID_MEMORY_TYPE  # read-only


def test_reset_device_drops_host_registrations(session):
    host, _ = acl.rt.malloc_host(4096)
    assert acl.rt.host_register(host, 4096, 0)[1] == 0
    assert acl.rt.reset_device(0) == 0
    assert acl.rt.set_device(0) == 0
    assert acl.rt.host_unregister(host) == E.ACL_ERROR_HOST_MEMORY_NOT_REGISTERED
    assert acl.rt.free_host(host) == 0


# --- streams ---------------------------------------------------------------------------------

def test_create_stream_with_config(session):
    stream, ret = acl.rt.create_stream_with_config(9, acl.ACL_STREAM_FAST_LAUNCH | acl.ACL_STREAM_FAST_SYNC)
    assert ret == 0
    assert acl.rt.stream_get_priority(stream) == (7, 0)            # clamped to the bound
    assert acl.rt.stream_get_flags(stream) == (3, 0)
    plain, ret = acl.rt.create_stream_with_config(3, 0x100)         # unknown bits: plain stream
    assert ret == 0 and acl.rt.stream_get_flags(plain) == (0, 0)
    assert acl.rt.stream_get_priority(0) == (0, 0)                 # the default stream
    for flag in (0x4, 0x10, 0x20):
        assert acl.rt.create_stream_with_config(0, flag) == (0, E.ACL_ERROR_RT_FEATURE_NOT_SUPPORT)
    assert acl.rt.create_stream_with_config("high", 0) == (0, E.ACL_ERROR_INVALID_PARAM)
    assert acl.rt.stream_get_flags("s")[1] == E.ACL_ERROR_RT_PARAM_INVALID
    for handle in (stream, plain):
        assert acl.rt.destroy_stream(handle) == 0


def test_stream_query_and_timeouts(session):
    stream, gate = _gated_stream()
    try:
        assert acl.rt.stream_query(stream) == (1, 0)                # ACL_STREAM_STATUS_NOT_READY
        assert acl.rt.synchronize_stream_with_timeout(stream, 20) == E.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT
        assert acl.rt.synchronize_stream_with_timeout(stream, 0) == E.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT
        assert acl.rt.synchronize_device_with_timeout(20) == E.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT
        assert acl.rt.synchronize_stream_with_timeout(stream, -2) == E.ACL_ERROR_RT_PARAM_INVALID
        assert acl.rt.synchronize_device_with_timeout(-5) == E.ACL_ERROR_RT_PARAM_INVALID
        assert acl.rt.synchronize_stream_with_timeout(stream, "x") == E.ACL_ERROR_INVALID_PARAM
        assert acl.rt.synchronize_device_with_timeout(1.5) == E.ACL_ERROR_INVALID_PARAM
    finally:
        gate.set()
    assert acl.rt.synchronize_stream_with_timeout(stream, -1) == 0
    assert acl.rt.stream_query(stream) == (0, 0)
    assert acl.rt.synchronize_device_with_timeout(1000) == 0
    assert acl.rt.stream_query(12345)[1] == E.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.destroy_stream(stream) == 0


# --- events ----------------------------------------------------------------------------------

@pytest.mark.parametrize("flag, ex, code", [
    (0x1, False, 0), (0x1 | 0x2 | 0x8, False, 0), (0x10, False, 0), (0x20, False, 0),
    (0, False, 107000), (0x10 | 0x1, False, 107000), (0x20 | 0x8, False, 107000),
    (0x40, False, 107000), (0x80, False, 107000), (-1, False, 107000),
    (0x8, True, 0), (0x10, True, 107000), (0x40 | 0x1, True, 107000), (0x40, True, 207000),
    ("sync", False, 100000), (None, True, 100000),
])
def test_create_event_with_flag_checks_the_flag_as_the_runtime_does(session, flag, ex, code):
    create = acl.rt.create_event_ex_with_flag if ex else acl.rt.create_event_with_flag
    event, ret = create(flag)
    assert ret == code
    assert (event != 0) == (code == 0)
    if event:
        assert acl.rt.record_event(event, 0) == 0 and acl.rt.synchronize_event(event) == 0
        assert acl.rt.destroy_event(event) == 0


def test_event_status_timestamp_and_timeout(session):
    event, _ = acl.rt.create_event_with_flag(0x8)
    assert acl.rt.query_event(event) == (0, 0)                      # never recorded: complete
    assert acl.rt.query_event_status(event) == (0, 0)               # but not "recorded"
    assert acl.rt.query_event_wait_status(event) == (1, 0)
    assert acl.rt.event_get_timestamp(event) == (0, E.ACL_ERROR_RT_INTERNAL_ERROR)
    stream, gate = _gated_stream()
    try:
        assert acl.rt.record_event(event, stream) == 0
        assert acl.rt.query_event_status(event) == (0, 0)
        assert acl.rt.query_event_wait_status(event) == (1, 0)
        assert acl.rt.event_get_timestamp(event) == (0, E.ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID)
        assert acl.rt.synchronize_event_with_timeout(event, 20) == E.ACL_ERROR_RT_EVENT_SYNC_TIMEOUT
        assert acl.rt.synchronize_event_with_timeout(event, -3) == E.ACL_ERROR_RT_PARAM_INVALID
        assert acl.rt.synchronize_event_with_timeout(event, "x") == E.ACL_ERROR_INVALID_PARAM
        before = int(time.perf_counter() * 1e6)
    finally:
        gate.set()
    assert acl.rt.synchronize_event_with_timeout(event, -1) == 0
    after = int(time.perf_counter() * 1e6)
    stamp, ret = acl.rt.event_get_timestamp(event)
    assert ret == 0 and before <= stamp <= after
    assert acl.rt.query_event_status(event) == (1, 0)
    assert acl.rt.query_event_wait_status(event) == (0, 0)
    later, _ = acl.rt.create_event()
    assert acl.rt.record_event(later, stream) == 0 and acl.rt.synchronize_stream(stream) == 0
    assert acl.rt.event_get_timestamp(later)[0] >= stamp
    assert acl.rt.reset_event(event, stream) == 0
    assert acl.rt.event_get_timestamp(event) == (0, E.ACL_ERROR_RT_INTERNAL_ERROR)
    assert acl.rt.event_get_timestamp("e")[1] == E.ACL_ERROR_RT_PARAM_INVALID
    for handle in (event, later):
        assert acl.rt.destroy_event(handle) == 0
    assert acl.rt.query_event_status(event)[1] == E.ACL_ERROR_RT_PARAM_INVALID


# --- reset with a wait that can never end ----------------------------------------------------

def test_reset_device_with_a_wait_for_an_unrecorded_event_returns_an_error(session):
    stream, _ = acl.rt.create_stream()
    event, _ = acl.rt.create_event()
    kept, _ = acl.rt.malloc_host(64)
    assert acl.rt.memset(kept, 64, 5, 64) == 0
    assert acl.rt.stream_wait_event(stream, event) == 0
    assert acl.rt.reset_device(0) == E.ACL_ERROR_RT_CONTEXT_RELEASE_ERROR
    message = acl.get_recent_err_msg()
    assert "never recorded" in message and "device was released" in message
    assert acl.rt.malloc(64, 0)[1] == E.ACL_ERROR_RT_CONTEXT_NULL   # it really was released
    assert acl.rt.set_device(0) == 0 and acl.rt.reset_device(0) == 0     # and opens again
    assert acl.util.ptr_to_bytes(kept, 64) == b"\x05" * 64             # host memory untouched


def test_destroy_context_with_an_unrecorded_wait_returns_an_error(session):
    context, _ = acl.rt.create_context(0)
    stream, _ = acl.rt.create_stream()
    event, _ = acl.rt.create_event()
    assert acl.rt.stream_wait_event(stream, event) == 0
    assert acl.rt.destroy_context(context) == E.ACL_ERROR_RT_CONTEXT_RELEASE_ERROR
    assert acl.rt.destroy_context(context) == E.ACL_ERROR_RT_PARAM_INVALID   # it is gone


# --- out of scope ----------------------------------------------------------------------------

@pytest.mark.parametrize("module, name, instead", [
    ("op", "execute_v2", "npumem.ops"), ("op", "create_attr", "aclnn"),
    ("mdl", "load_from_file", "nothing in its place"), ("mdl", "ACL_MDL_PRIORITY_INT32", "CANN"),
    ("prof", "init", "npumem profile"), ("prof", "start", "msprof"),
])
def test_out_of_scope_modules_say_what_to_use(module, name, instead):
    area = getattr(acl, module)
    with pytest.raises(E.OutOfScopeError) as caught:
        getattr(area, name)
    assert not isinstance(caught.value, AttributeError)
    assert isinstance(caught.value, E.AclError) and caught.value.code == E.ACL_ERROR_API_NOT_SUPPORT
    assert "not part of npumem's memory scope" in str(caught.value) and instead in str(caught.value)
    with pytest.raises(E.OutOfScopeError):
        getattr(area, name)(1, 2)
    with pytest.raises(E.OutOfScopeError):
        hasattr(area, name)                          # hasattr cannot hide it
    assert getattr(area, "__path__", None) is None   # import machinery still sees a module


def test_install_as_acl_registers_the_out_of_scope_modules(monkeypatch):
    monkeypatch.setitem(sys.modules, "acl", None)
    try:
        acl.install_as_acl(force=True)
        import importlib
        installed = importlib.import_module("acl")
        op_module = importlib.import_module("acl.op")
        mdl, prof = importlib.import_module("acl.mdl"), installed.prof
        assert installed is acl and op_module is acl.op is sys.modules["acl.op"]
        assert mdl is acl.mdl and prof is acl.prof
        with pytest.raises(E.OutOfScopeError, match="acl.mdl.load_from_file"):
            mdl.load_from_file("model.om")
    finally:
        for name in ("rt", "util", "media", "constants", "op", "mdl", "prof"):
            sys.modules.pop(f"acl.{name}", None)


# --- converters ------------------------------------------------------------------------------

def test_ptr_to_bytes_of_a_made_up_address_is_refused_without_a_crash():
    code = textwrap.dedent("""
        import npumem.acl as acl
        from npumem.errors import InvalidParamError
        for pointer, size in ((16, 64), (0x7F0000001000, 8), (2**47 + 5, 1)):
            try:
                acl.util.ptr_to_bytes(pointer, size)
            except InvalidParamError as exc:
                print("refused", exc.code)
        try:
            acl.util.ptr_to_numpy(16, (4,), 11)
        except InvalidParamError as exc:
            print("refused", exc.code)
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["refused", "100000"] * 4


def test_converters_refuse_memory_that_is_no_longer_live(session):
    array = np.arange(8, dtype=np.int32)
    pointer = acl.util.numpy_to_ptr(array)
    assert acl.util.ptr_to_numpy(pointer, (8,), 5).tolist() == list(range(8))
    del array
    gc.collect()
    with pytest.raises(E.InvalidParamError, match="not host memory npumem knows"):
        acl.util.ptr_to_bytes(pointer, 4)
    held = b"kept alive"
    view = acl.util.ptr_to_numpy(acl.util.bytes_to_ptr(held), (4,), np.dtype(np.uint8).num)
    assert bytes(view) == b"kept" and not view.flags.writeable     # bytes are immutable
    pinned, _ = acl.rt.malloc_host(64)
    assert acl.rt.free_host(pinned) == 0
    with pytest.raises(E.InvalidParamError, match="use after free"):
        acl.util.ptr_to_bytes(pinned, 8)
    device, _ = acl.rt.malloc(64, 0)
    with pytest.raises(E.InvalidParamError, match="device memory"):
        acl.util.set_ptr_data(device, b"x")
    with pytest.raises(E.InvalidParamError, match="not host memory"):
        acl.util.ptr_to_bytes(acl.util.bytes_to_ptr(held), len(held) + 1)   # past the end


def test_set_ptr_data(session):
    pinned, _ = acl.rt.malloc_host(16)
    acl.util.set_ptr_data(pinned, b"\x01\x02\x03")
    acl.util.set_ptr_data(pinned + 3, np.array([4, 5], dtype=np.uint8))
    assert acl.util.ptr_to_bytes(pinned, 5) == b"\x01\x02\x03\x04\x05"
    target = np.zeros(4, dtype=np.float32)
    acl.util.set_ptr_data(acl.util.numpy_to_ptr(target), np.ones(2, dtype=np.float32).tobytes())
    assert target.tolist() == [1, 1, 0, 0]
    with pytest.raises(E.InvalidParamError, match="past"):
        acl.util.set_ptr_data(pinned, bytes(17))
    with pytest.raises(E.InvalidParamError, match="read-only"):
        acl.util.set_ptr_data(acl.util.bytes_to_ptr(b"frozen"), b"F")
    with pytest.raises(E.InvalidParamError, match="data must be"):
        acl.util.set_ptr_data(pinned, "text")
    assert acl.util.ptr_to_bytes(pinned, 5) == b"\x01\x02\x03\x04\x05"     # refusals wrote nothing


@pytest.mark.parametrize("call", [
    lambda: acl.util.bytes_to_ptr("abc"), lambda: acl.util.bytes_to_ptr(123),
    lambda: acl.util.bytes_to_ptr(None), lambda: acl.util.bytes_to_ptr([1, 2]),
    lambda: acl.util.numpy_to_ptr("abc"), lambda: acl.util.numpy_contiguous_to_ptr(b"x"),
    lambda: acl.util.ptr_to_bytes("0x10", 4), lambda: acl.util.ptr_to_bytes(16, "4"),
    lambda: acl.util.ptr_to_bytes(16.0, 4), lambda: acl.util.ptr_to_bytes(None, None),
    lambda: acl.util.ptr_to_numpy(16, "4", 11), lambda: acl.util.ptr_to_numpy(16, (4,), "11"),
    lambda: acl.util.ptr_to_numpy(16, (4,), [11]), lambda: acl.util.ptr_to_numpy(16, (-1,), 11),
    lambda: acl.util.ptr_to_bytes(16, -1), lambda: acl.util.set_ptr_data("p", b"x"),
    lambda: acl.util.set_ptr_data(16, b"x"), lambda: acl.util.set_ptr_data(16, 5),
])
def test_converters_refuse_wrong_types_with_invalid_param(call):
    with pytest.raises(E.InvalidParamError) as caught:
        call()
    assert caught.value.code == E.ACL_ERROR_INVALID_PARAM


# --- every call, wrong-typed arguments -------------------------------------------------------

# npumem's own switches and the shim's plumbing, which pyACL does not have: they may raise.
NOT_PYACL = {"set_result_order", "install_as_acl", "code_of", "values_and_code",
             "report_failure", "recent_error_message"}
CONVERTERS = {"numpy_to_ptr", "numpy_contiguous_to_ptr", "bytes_to_ptr", "ptr_to_numpy",
              "ptr_to_bytes", "set_ptr_data"}


def _public_calls():
    calls = []
    for prefix, module in (("acl", acl), ("acl.rt", acl.rt), ("acl.util", acl.util),
                           ("acl.media", acl.media)):
        for name, value in sorted(vars(module).items()):
            if inspect.isfunction(value) and not name.startswith("_") and name not in NOT_PYACL \
                    and value.__module__.startswith("npumem.acl"):
                required = [p for p in inspect.signature(value).parameters.values()
                            if p.default is p.empty and p.kind == p.POSITIONAL_OR_KEYWORD]
                if required:
                    calls.append(pytest.param(value, len(required), id=f"{prefix}.{name}"))
    return calls


@pytest.mark.parametrize("bad", ["x", [1], None, {"k": 1}, object()],
                         ids=["str", "list", "None", "dict", "object"])
@pytest.mark.parametrize("function, arity", _public_calls())
def test_no_acl_call_raises_on_a_wrong_typed_argument(session, function, arity, bad):
    device, _ = acl.rt.malloc(256, 0)
    host, _ = acl.rt.malloc_host(256)
    pattern = np.arange(256, dtype=np.uint8)
    assert acl.rt.memcpy(device, 256, acl.util.numpy_to_ptr(pattern), 256, H2D) == 0
    assert acl.rt.memcpy(host, 256, device, 256, D2H) == 0
    if function.__name__ in CONVERTERS:
        try:
            function(*[bad] * arity)
        except E.InvalidParamError:
            pass
    else:
        result = function(*[bad] * arity)
        if function.__name__ != "app_log":              # pyACL's app_log returns nothing
            code = result[-1] if isinstance(result, tuple) else result
            assert isinstance(code, int), result
            if function.__name__.startswith(("create_data_buffer", "get_data_buffer")):
                assert code == 0                        # pyACL: a 0 handle / value, not a code
            elif bad is None and list(inspect.signature(function).parameters) == ["stream"]:
                assert code in PARAM_CODES | {0}        # None is NULL: the default stream
            else:
                assert code != 0 and code in PARAM_CODES | {E.ACL_ERROR_RT_CONTEXT_NULL}, \
                    (code, acl.get_recent_err_msg())
    out = np.zeros(256, dtype=np.uint8)                # what was allocated is intact
    assert acl.rt.memcpy(acl.util.numpy_to_ptr(out), 256, device, 256, D2H) == 0
    assert np.array_equal(out, pattern)
    assert acl.util.ptr_to_bytes(host, 256) == pattern.tobytes()
    assert acl.rt.free(device) == 0 and acl.rt.free_host(host) == 0
