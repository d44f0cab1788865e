"""Code written for real pyACL runs unchanged on npumem.acl (issue 21, part 1): the calls Ascend's
samples and acllite make, and the edge behaviour of CANN's runtime (docs/acl.md)."""

import logging
import textwrap

import numpy as np
import pytest

import npumem
import npumem.acl as acl
from npumem import errors as E
from npumem.errors import StrictWarning

H2H, H2D, D2H, D2D, DEFAULT = 0, 1, 2, 3, 4
H2BUF2D, INNER_D2D, INTER_D2D = 5, 6, 7


@pytest.fixture
def session(monkeypatch):
    monkeypatch.setenv("NPUMEM_SIM_MEMORY", "256MiB")
    monkeypatch.setenv("NPUMEM_SIM_DEVICES", "2")
    assert acl.init() == 0
    assert acl.rt.set_device(0) == 0
    yield


def test_a_sample_program_runs_with_only_its_import_changed(tmp_path, monkeypatch):
    """The shape of the samples' memory and callback code, `import acl` and all."""
    monkeypatch.setenv("NPUMEM_SIM_MEMORY", "256MiB")
    script = tmp_path / "sample.py"
    script.write_text(textwrap.dedent('''
        import numpy as np
        import npumem.acl
        npumem.acl.install_as_acl(force=True)
        import acl

        run_mode, ret = acl.rt.get_run_mode()          # acllite asks before init
        assert ret == 0 and run_mode == 1, (run_mode, ret)
        count, ret = acl.rt.get_device_count()
        assert ret == 0 and count >= 1
        assert acl.init() == 0 and acl.rt.set_device(0) == 0
        context, ret = acl.rt.create_context(0)
        stream, ret = acl.rt.create_stream()
        data = np.arange(256, dtype=np.float32)
        host, ret = acl.rt.malloc_host(data.nbytes)
        # the samples copy host to host with the device-to-host kind: the kind is reserved
        assert acl.rt.memcpy(host, data.nbytes, acl.util.numpy_to_ptr(data), data.nbytes,
                             acl.ACL_MEMCPY_DEVICE_TO_HOST) == 0
        device, ret = acl.rt.malloc(data.nbytes, acl.ACL_MEM_MALLOC_HUGE_FIRST)
        assert acl.rt.memcpy(device, data.nbytes, host, data.nbytes, acl.ACL_MEMCPY_HOST_TO_DEVICE) == 0

        seen = []
        running = [True]

        def callback_thread(timeout):
            while running[0]:
                acl.rt.process_report(timeout)

        thread_id, ret = acl.util.start_thread(callback_thread, [20])
        assert ret == 0
        assert acl.rt.subscribe_report(thread_id, stream) == 0
        out = np.zeros_like(data)
        assert acl.rt.memcpy_async(host, data.nbytes, device, data.nbytes,
                                   acl.ACL_MEMCPY_DEVICE_TO_HOST, stream) == 0
        assert acl.rt.launch_callback(lambda user: seen.append(user), "copied", 1, stream) == 0
        assert acl.rt.synchronize_stream(stream) == 0
        assert seen == ["copied"]
        assert acl.rt.memcpy(acl.util.numpy_to_ptr(out), out.nbytes, host, out.nbytes, 0) == 0
        assert (out == data).all()
        assert acl.rt.unsubscribe_report(thread_id, stream) == 0
        running[0] = False
        assert acl.util.stop_thread(thread_id) == 0
        acl.app_log(acl.ACL_INFO, "sample done")
        for ret in (acl.rt.free(device), acl.rt.free_host(host), acl.rt.destroy_stream(stream),
                    acl.rt.destroy_context(context), acl.rt.reset_device(0), acl.finalize()):
            assert ret == 0
        print("sample ok")
    '''))
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "sample ok" in done.stdout, done.stderr


def test_queries_that_need_no_device_work_before_init():
    assert acl.rt.get_run_mode() == (1, 0)
    count, ret = acl.rt.get_device_count()
    assert ret == 0 and count >= 1
    assert acl.get_soc_name().startswith("Ascend")


def test_edge_behaviour_matches_the_cann_runtime(session):
    assert acl.rt.free(0) == E.ACL_ERROR_INVALID_PARAM
    host, _ = acl.rt.malloc_host(64)
    device, _ = acl.rt.malloc(64, 0)
    assert acl.rt.memset(device, 64, 0, 0) == 0
    assert acl.rt.memcpy(device, 64, host, 0, H2D) == 0
    for policy in (99, 6, 7, 0x1000 | 2, 0x100000):       # unknown, HUGE1G, flags ORed in
        pointer, ret = acl.rt.malloc(4096, policy)
        assert ret == 0 and acl.rt.free(pointer) == 0
    with pytest.warns(RuntimeWarning, match="not C-contiguous"):
        pointer = acl.util.numpy_to_ptr(np.arange(10)[::2])
    assert pointer > 0
    with pytest.raises(E.InvalidParamError, match="expected a numpy array, got list"):
        acl.util.numpy_to_ptr([1, 2])
    strided = np.arange(10, dtype=np.int64)[::2]
    contiguous = acl.util.numpy_contiguous_to_ptr(strided)
    assert acl.util.ptr_to_numpy(contiguous, (5,), np.dtype(np.int64).num).tolist() == [0, 2, 4, 6, 8]


def test_the_sync_copy_kind_is_reserved_and_strict_mode_says_so(session, monkeypatch):
    a, _ = acl.rt.malloc_host(64)
    b, _ = acl.rt.malloc_host(64)
    acl.rt.memset(a, 64, 7, 64)
    assert acl.rt.memcpy(b, 64, a, 64, D2H) == 0
    assert acl.util.ptr_to_bytes(b, 64) == b"\x07" * 64
    stream, _ = acl.rt.create_stream()
    device, _ = acl.rt.malloc(64, 0)
    assert acl.rt.memcpy_async(device, 64, a, 64, D2H, stream) == E.ACL_ERROR_INVALID_PARAM
    monkeypatch.setenv("NPUMEM_STRICT", "1")
    with pytest.warns(StrictWarning, match="kind is DEVICE_TO_HOST"):
        assert acl.rt.memcpy(b, 64, a, 64, D2H) == 0
    with pytest.warns(StrictWarning, match="unknown malloc policy 99"):
        pointer, ret = acl.rt.malloc(64, 99)
    assert ret == 0


def test_memcpy2d_copies_pitched_rows_and_checks_every_row_first(session):
    rows = np.arange(8 * 12, dtype=np.uint8).reshape(8, 12)
    device, _ = acl.rt.malloc(16 * 8, 0)
    acl.rt.memset(device, 128, 0xEE, 128)
    assert acl.rt.memcpy2d(device, 16, acl.util.numpy_to_ptr(rows), 12, 10, 8, H2D) == 0
    back = np.zeros((8, 16), np.uint8)
    assert acl.rt.memcpy2d(acl.util.numpy_to_ptr(back), 16, device, 16, 16, 8, D2H) == 0
    assert (back[:, :10] == rows[:, :10]).all() and (back[:, 10:] == 0xEE).all()
    assert acl.rt.memcpy2d(device, 16, acl.util.numpy_to_ptr(rows), 12, 13, 8, H2D) == \
        E.ACL_ERROR_INVALID_PARAM                                       # wider than spitch
    assert acl.rt.memcpy2d(device, 16, acl.util.numpy_to_ptr(rows), 12, 12, 9, H2D) != 0
    back[:] = 0                                       # the refused copy wrote nothing
    acl.rt.memcpy2d(acl.util.numpy_to_ptr(back), 16, device, 16, 16, 8, D2H)
    assert (back[:, :10] == rows[:, :10]).all()
    stream, _ = acl.rt.create_stream()
    pinned, _ = acl.rt.malloc_host(16 * 8)
    assert acl.rt.memcpy2d_async(pinned, 16, device, 16, 16, 8, D2H, stream) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    assert acl.util.ptr_to_bytes(pinned, 128) == back.tobytes()


def test_the_newer_copy_kinds(session):
    stream, _ = acl.rt.create_stream()
    pageable = np.full(256, 3, np.uint8)
    device, _ = acl.rt.malloc(256, 0)
    # HOST_TO_BUF_TO_DEVICE: pageable memory is staged at the call, and may change afterwards
    assert acl.rt.memcpy_async(device, 256, acl.util.numpy_to_ptr(pageable), 256, H2BUF2D, stream) == 0
    pageable[:] = 9
    assert acl.rt.synchronize_stream(stream) == 0
    out = np.zeros(256, np.uint8)
    acl.rt.memcpy(acl.util.numpy_to_ptr(out), 256, device, 256, D2H)
    assert (out == 3).all()
    other, _ = acl.rt.malloc(256, 0)
    assert acl.rt.memcpy_async(other, 256, device, 256, INNER_D2D, stream) == 0
    assert acl.rt.memcpy_async(other, 256, device, 256, INTER_D2D, stream) == E.ACL_ERROR_INVALID_PARAM
    assert acl.rt.synchronize_stream(stream) == 0


def test_peer_access_and_copies_between_two_devices(session):
    assert acl.rt.device_can_access_peer(0, 1) == (1, 0)
    assert acl.rt.device_can_access_peer(0, 0)[1] == E.ACL_ERROR_INVALID_PARAM
    assert acl.rt.device_can_access_peer(0, 5)[1] == E.ACL_ERROR_RT_INVALID_DEVICEID
    assert acl.rt.device_enable_peer_access(1, 0) == 0
    on_0, _ = acl.rt.malloc(1024, 0)
    acl.rt.memset(on_0, 1024, 0x42, 1024)
    assert acl.rt.set_device(1) == 0
    on_1, _ = acl.rt.malloc(1024, 0)
    assert acl.rt.memcpy(on_1, 1024, on_0, 1024, INTER_D2D) == 0
    stream, _ = acl.rt.create_stream()
    assert acl.rt.memcpy_async(on_1, 1024, on_0, 1024, INNER_D2D, stream) == E.ACL_ERROR_INVALID_PARAM
    host, _ = acl.rt.malloc_host(1024)
    acl.rt.memcpy(host, 1024, on_1, 1024, D2H)
    assert acl.util.ptr_to_bytes(host, 1024) == b"\x42" * 1024
    assert acl.rt.set_device(0) == 0
    assert acl.rt.device_disable_peer_access(1) == 0
    assert acl.rt.device_disable_peer_access(1) == E.ACL_ERROR_INVALID_PARAM


def test_callbacks_run_in_stream_order_on_the_subscribed_thread(session):
    import threading

    stream, _ = acl.rt.create_stream()
    order, threads = [], []
    running = [True]

    def serve(timeout):
        while running[0]:
            acl.rt.process_report(timeout)

    thread_id, ret = acl.util.start_thread(serve, [10])
    assert acl.rt.launch_callback(print, None, 1, stream) == E.ACL_ERROR_RT_STREAM_NO_CB_REG
    assert acl.rt.subscribe_report(thread_id, stream) == 0
    assert acl.rt.subscribe_report(thread_id, stream) == E.ACL_ERROR_REPEAT_SUBSCRIBE
    host, _ = acl.rt.malloc_host(64)
    device, _ = acl.rt.malloc(64, 0)
    acl.rt.memset(host, 64, 5, 64)

    def note(tag):
        order.append((tag, acl.util.ptr_to_bytes(host, 1)))
        threads.append(threading.get_ident())

    acl.rt.launch_callback(note, "before", 1, stream)
    acl.rt.memset_async(host, 64, 6, 64, stream)
    acl.rt.launch_callback(note, "after", 0, stream)
    assert acl.rt.synchronize_stream(stream) == 0
    while len(order) < 2:                 # the non-blocking one may still be running
        threading.Event().wait(0.01)
    assert order == [("before", b"\x05"), ("after", b"\x06")]
    assert set(threads) == {thread_id}
    assert acl.rt.process_report(1) == E.ACL_ERROR_RT_THREAD_SUBSCRIBE   # not this thread's
    assert acl.rt.unsubscribe_report(thread_id, stream) == 0
    assert acl.rt.unsubscribe_report(thread_id, stream) == E.ACL_ERROR_STREAM_NOT_SUBSCRIBE
    running[0] = False
    assert acl.util.stop_thread(thread_id) == 0
    assert acl.util.stop_thread(thread_id) == E.ACL_ERROR_INVALID_PARAM


def test_a_blocking_callback_nobody_serves_does_not_hang_teardown(session):
    stream, _ = acl.rt.create_stream()
    assert acl.rt.subscribe_report(12345, stream) == 0          # a thread that never serves
    assert acl.rt.launch_callback(print, None, 1, stream) == 0
    assert acl.rt.destroy_stream(stream) == E.ACL_ERROR_RT_STREAM_NO_CB_REG   # gave up waiting
    assert "was unsubscribed" in acl.get_recent_err_msg()
    assert acl.rt.reset_device(0) == 0


def test_app_log_writes_to_the_application_log(session, caplog):
    with caplog.at_level(logging.DEBUG, logger="npumem.acl.app"):
        acl.app_log(acl.ACL_WARNING, "disk almost full")
        acl.app_log(0, "details")
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == \
        [(logging.WARNING, "disk almost full"), (logging.DEBUG, "details")]


def test_the_pythonic_api_has_the_same_calls(session):
    assert npumem.runtime.device_can_access_peer(0, 1) is True
    assert callable(npumem.runtime.memcpy2d) and callable(npumem.runtime.launch_callback)


def test_docs_acl_md_covers_every_call():
    """docs/acl.md's table has a row for each call the shim offers."""
    import inspect
    import pathlib

    table = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "acl.md").read_text()
    internal = {"code_of", "values_and_code", "report_failure", "recent_error_message",
                "set_result_order", "install_as_acl"}
    missing = []
    for module, prefix in ((acl, "acl."), (acl.rt, "acl.rt."), (acl.util, "acl.util."),
                           (acl.media, "acl.media.")):
        for name, value in vars(module).items():
            if inspect.isfunction(value) and not name.startswith("_") and name not in internal \
                    and value.__module__.startswith("npumem.acl") and name not in table:
                missing.append(prefix + name)
    assert not missing, missing
