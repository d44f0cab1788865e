"""init/finalize, devices per thread, contexts, and the live-allocation report at teardown."""

import json
import threading

import pytest

import npumem
from npumem import errors as E
from npumem.device import SimBackend

from .conftest import SMALL_SIM, need_devices


@pytest.fixture
def rt(any_rt):
    """This module is a conformance suite: every test runs on each backend (conftest.BACKENDS)."""
    return any_rt



def test_init_finalize_init_again():
    npumem.init(backend=SimBackend(SMALL_SIM))
    assert npumem.is_initialized()
    assert npumem.finalize() == []
    npumem.init(backend=SimBackend(SMALL_SIM))
    npumem.finalize()


def test_init_reads_the_sim_section_of_a_config_file(tmp_path):
    path = tmp_path / "acl.json"
    path.write_text(json.dumps({"npumem_sim": {"devices": 4, "memory": "1GiB"}}))
    npumem.init(str(path))
    assert npumem.get_device_count() == 4
    npumem.set_device(3)
    assert npumem.get_mem_info(npumem.MemAttr.HBM_MEM)[1] == 1 << 30


@pytest.mark.parametrize("content, match", [(None, "does not exist"), ("{nope", "JSON"),
                                            ('{"npumem_sim": {"cores": 2}}', "unknown npumem_sim keys")])
def test_bad_config_file(tmp_path, content, match):
    path = tmp_path / "acl.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(E.AclError, match=match) as info:
        npumem.init(str(path))
    assert info.value.code == E.ACL_ERROR_INVALID_FILE
    assert not npumem.is_initialized()


def test_current_device_is_per_thread(rt):
    need_devices(2)
    npumem.set_device(1)
    seen = {}

    def other():
        npumem.set_device(0)
        seen["other"] = npumem.get_device()

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert seen["other"] == 0
    assert npumem.get_device() == 1


def test_a_new_thread_uses_the_process_device(rt):
    seen = {}
    thread = threading.Thread(target=lambda: seen.setdefault("device", npumem.get_device()))
    thread.start()
    thread.join()
    assert seen["device"] == 0


def test_malloc_goes_to_the_current_device(rt):
    need_devices(2)
    npumem.set_device(1)
    pointer = npumem.malloc(64)
    assert npumem.RUNTIME.backend.device_of(pointer) == 1


def test_set_device_is_reference_counted(rt):
    npumem.set_device(0)                   # second reference
    pointer = npumem.malloc(64)
    assert npumem.reset_device(0) == []    # one reference left: nothing released
    npumem.free(pointer)
    assert npumem.reset_device(0) == []


def test_reset_device_reports_and_releases_live_allocations(rt):
    free, total = npumem.get_mem_info(npumem.MemAttr.HBM_MEM)
    assert free == total
    kept = npumem.malloc(1000)
    npumem.malloc_align32(64)
    with pytest.warns(E.LiveAllocationsWarning, match=r"2 live allocation\(s\)") as record:
        leaked = npumem.reset_device(0)
    assert sorted(a.size for a in leaked) == [64, 1000]
    assert f"0x{kept:x}" in str(record[0].message)
    npumem.set_device(0)
    assert npumem.get_mem_info(npumem.MemAttr.HBM_MEM) == (total, total)
    with pytest.raises(E.MemoryFreeError):
        npumem.free(kept)


def test_finalize_reports_device_and_pinned_leaks(rt):
    npumem.malloc(128)
    npumem.malloc_host(256)
    with pytest.warns(E.LiveAllocationsWarning) as record:
        leaked = npumem.finalize()
    assert sorted(a.api for a in leaked) == ["malloc", "malloc_host"]
    text = " ".join(str(w.message) for w in record)
    assert "pinned host memory" in text and "reset of device 0" in text


def test_contexts(rt):
    need_devices(2)
    default = npumem.get_context()
    context = npumem.create_context(1)
    assert npumem.get_context() is context and npumem.get_device() == 1
    stream = npumem.create_stream()
    assert stream.device == 1
    npumem.set_context(default)
    assert npumem.get_device() == 0
    npumem.destroy_context(context)
    with pytest.raises(E.InvalidHandleError, match="destroyed"):
        npumem.set_context(context)
    with pytest.raises(E.InvalidHandleError):
        npumem.synchronize_stream(stream)       # its streams went with it
    with pytest.raises(E.InvalidParamError, match="default context"):
        npumem.destroy_context(default)


def test_destroying_the_current_context_leaves_no_current_device(rt):
    npumem.finalize()
    npumem.init(backend=SimBackend(SMALL_SIM))
    context = npumem.create_context(0)
    npumem.destroy_context(context)
    with pytest.raises(E.ContextNullError):
        npumem.malloc(64)
