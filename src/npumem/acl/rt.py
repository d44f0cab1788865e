"""`acl.rt`: runtime calls with pyACL's names and return conventions (see `_result`)."""

from __future__ import annotations

from types import SimpleNamespace

from .. import runtime as _rt
from ..constants import MallocPolicy, MemcpyKind
from ..errors import ACL_ERROR_INVALID_PARAM
from ..runtime import control as _control
from ..runtime import memory as _memory
from ..runtime.memory import lenient_policy
from ._result import code_of, values_and_code
from ._result import last_error_code as _last_error_code
from ._result import log as _log

# The seed article's spellings: acl.rt.malloc_type.HUGE_FIRST, acl.rt.memcpy_kind.HOST_TO_DEVICE.
malloc_type = SimpleNamespace(**{p.name: int(p) for p in MallocPolicy})
memcpy_kind = SimpleNamespace(**{k.name: int(k) for k in MemcpyKind})


def _handle(obj) -> int:
    return obj.handle


# devices and contexts

def set_device(device_id):
    return code_of(_rt.set_device, device_id)


def reset_device(device_id):
    return code_of(_rt.reset_device, device_id)


def get_device():
    return values_and_code(_rt.get_device)


def get_device_count():
    return values_and_code(_rt.get_device_count)


def synchronize_device():
    return code_of(_rt.synchronize_device)


def create_context(device_id):
    return values_and_code(lambda: _handle(_rt.create_context(device_id)))


def destroy_context(context):
    return code_of(_rt.destroy_context, context)


def set_context(context):
    return code_of(_rt.set_context, context)


def get_context():
    return values_and_code(lambda: _handle(_rt.get_context()))


def get_run_mode():
    return values_and_code(lambda: int(_rt.get_run_mode()))


# streams and events

def create_stream():
    return values_and_code(lambda: _handle(_rt.create_stream()))


def destroy_stream(stream):
    return code_of(_rt.destroy_stream, stream)


def synchronize_stream(stream):
    return code_of(_rt.synchronize_stream, stream)


def synchronize_stream_with_timeout(stream, timeout):
    """timeout in ms: -1 waits forever, 0 only looks; ACL_ERROR_RT_STREAM_SYNC_TIMEOUT (507046)
    when the stream is not idle in time, ACL_ERROR_RT_PARAM_INVALID below -1."""
    return code_of(_control.synchronize_stream_timeout_ms, stream, timeout)


def create_stream_with_config(priority, flag):
    """(stream, ret): priority 0..7 (clamped), flag ACL_STREAM_FAST_LAUNCH | FAST_SYNC | HUGE;
    PERSISTENT, CPU_SCHEDULE and DEVICE_USE_ONLY are ACL_ERROR_RT_FEATURE_NOT_SUPPORT."""
    return values_and_code(lambda: _handle(_control.create_stream_with_config(priority, flag)))


def stream_query(stream):
    """(status, ret): ACL_STREAM_STATUS_COMPLETE (0) when all its work ran, else NOT_READY (1)."""
    return values_and_code(lambda: 0 if _rt.query_stream(stream) else 1)


def stream_get_priority(stream):
    """(priority, ret): what create_stream_with_config was given (0 for other streams)."""
    return values_and_code(lambda: _rt.RUNTIME.stream(stream, "stream_get_priority").priority)


def stream_get_flags(stream):
    """(flags, ret): the ACL_STREAM_* flags the stream was created with."""
    return values_and_code(lambda: _rt.RUNTIME.stream(stream, "stream_get_flags").flags)


def synchronize_device_with_timeout(timeout):
    """timeout in ms (-1 forever): ACL_ERROR_RT_STREAM_SYNC_TIMEOUT (507046) when the current
    device's streams are not all idle in time."""
    return code_of(_control.synchronize_device_timeout_ms, timeout)


def create_event():
    return values_and_code(lambda: _handle(_rt.create_event()))


def create_event_with_flag(flag):
    """(event, ret): flag an OR of ACL_EVENT_SYNC (1), CAPTURE_STREAM_PROGRESS (2), TIME_LINE
    (8), or ACL_EVENT_DEVICE_USE_ONLY (0x10) / EXTERNAL (0x20) alone; else 107000."""
    return values_and_code(lambda: _handle(_control.create_event_with_flag(flag)))


def create_event_ex_with_flag(flag):
    """(event, ret): as create_event_with_flag, the solitary flag being ACL_EVENT_IPC (0x40),
    which npumem does not support (207000)."""
    return values_and_code(lambda: _handle(_control.create_event_with_flag(flag, reusable=True)))


def query_event_status(event):
    """(status, ret): ACL_EVENT_RECORDED_STATUS_COMPLETE (1) once its latest record ran, else
    NOT_READY (0), also for an event never recorded."""
    return values_and_code(lambda: 1 if _control.query_event_status(event) else 0)


def query_event_wait_status(event):
    """(status, ret): ACL_EVENT_WAIT_STATUS_COMPLETE (0) when a wait would not block, else 1."""
    return values_and_code(lambda: 0 if _control.query_event_status(event, "query_event_wait_status") else 1)


def synchronize_event_with_timeout(event, timeout):
    """timeout in ms (-1 forever, 0 only looks): ACL_ERROR_RT_EVENT_SYNC_TIMEOUT (507047)."""
    return code_of(_control.synchronize_event_timeout_ms, event, timeout)


def event_get_timestamp(event):
    """(timestamp in us, ret): when its latest record ran. Never recorded: 507000; recorded,
    not reached: ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID (107006)."""
    return values_and_code(_control.event_timestamp_us, event)


def destroy_event(event):
    return code_of(_rt.destroy_event, event)


def record_event(event, stream):
    return code_of(_rt.record_event, event, stream)


def reset_event(event, stream):
    return code_of(_rt.reset_event, event, stream)


def query_event(event):
    """(status, ret): status 0 (ACL_EVENT_STATUS_COMPLETE) or 1 (NOT_READY)."""
    return values_and_code(lambda: 0 if _rt.query_event(event) else 1)


def synchronize_event(event):
    return code_of(_rt.synchronize_event, event)


def stream_wait_event(stream, event):
    return code_of(_rt.stream_wait_event, stream, event)


def set_op_wait_timeout(timeout):
    """Seconds an event wait may block before failing; 0 waits forever."""
    return code_of(_rt.set_op_wait_timeout, timeout)


def event_elapsed_time(start, end):
    return values_and_code(_rt.event_elapsed_time, start, end, failed=(0.0,))


# memory

def malloc(size, policy):
    return values_and_code(lambda: _rt.malloc(size, lenient_policy(policy, "malloc")))


def malloc_align32(size, policy):
    return values_and_code(lambda: _rt.malloc_align32(size, lenient_policy(policy, "malloc_align32")))


def malloc_cached(size, policy):
    return values_and_code(lambda: _rt.malloc_cached(size, lenient_policy(policy, "malloc_cached")))


def free(dev_ptr):
    return code_of(_rt.free, dev_ptr)


def malloc_host(size):
    return values_and_code(_rt.malloc_host, size)


def malloc_host_with_cfg(size, cfg):
    """(host_ptr, ret): malloc_host with pyACL's config dict (None or {} for none)."""
    return values_and_code(_memory.malloc_host_with_cfg, size, cfg)


def host_register(ptr, size, type):  # noqa: A002 - pyACL's parameter name
    """(dev_ptr, ret): map registered host memory for the device (ACL_HOST_REGISTER_MAPPED).
    A range overlapping one registered: ACL_ERROR_HOST_MEMORY_ALREADY_REGISTERED (507910)."""
    return values_and_code(_memory.register_host_range, ptr, size, type)


def host_unregister(ptr):
    """ret: undo host_register given the host address; not registered: 507911."""
    return code_of(_memory.unregister_host_range, ptr)


def free_host(host_ptr):
    return code_of(_rt.free_host, host_ptr)


def memset(dev_ptr, max_count, value, count):
    return code_of(_rt.memset, dev_ptr, max_count, value, count)


def memset_async(dev_ptr, max_count, value, count, stream):
    return code_of(_rt.memset_async, dev_ptr, max_count, value, count, stream)


def memcpy(dst, dest_max, src, count, kind):
    return code_of(lambda: _rt.memcpy(dst, dest_max, src, count, kind, kind_is_reserved=True))


def memcpy_async(dst, dest_max, src, count, kind, stream):
    return code_of(_rt.memcpy_async, dst, dest_max, src, count, kind, stream)


def memcpy2d(dst, dpitch, src, spitch, width, height, kind):
    return code_of(lambda: _rt.memcpy2d(dst, dpitch, src, spitch, width, height, kind,
                                        kind_is_reserved=True))


def memcpy2d_async(dst, dpitch, src, spitch, width, height, kind, stream):
    return code_of(_rt.memcpy2d_async, dst, dpitch, src, spitch, width, height, kind, stream)


# peer access between devices

def device_can_access_peer(device_id, peer_device_id):
    """(can_access_peer: 1 or 0, ret)."""
    return values_and_code(lambda: int(_rt.device_can_access_peer(device_id, peer_device_id)))


def device_enable_peer_access(peer_device_id, flags):
    return code_of(_rt.device_enable_peer_access, peer_device_id, flags)


def device_disable_peer_access(peer_device_id):
    return code_of(_rt.device_disable_peer_access, peer_device_id)


# host callbacks in stream order

def subscribe_report(thread_id, stream):
    return code_of(_rt.subscribe_report, thread_id, stream)


def unsubscribe_report(thread_id, stream):
    return code_of(_rt.unsubscribe_report, thread_id, stream)


def launch_callback(fn, user_data, block_type, stream):
    return code_of(_rt.launch_callback, fn, user_data, block_type, stream)


def process_report(timeout):
    """Run the next callback for this (subscribed) thread; 507012 after `timeout` ms without one."""
    return code_of(_rt.process_report, timeout)


def get_mem_usage_info(device_id, input_num):
    """(mem_usage_info, ret): up to input_num dicts {"name", "cur_mem_size", "mem_peak_size"}
    (bytes), one per component, largest current usage first; output_num is its length."""
    return values_and_code(_memory.mem_usage_info, device_id, input_num, failed=([],))


def get_last_error(level):
    """This thread's last error code, then cleared (0 until the next failure). level must be
    ACL_RT_THREAD_LEVEL (0), else ACL_ERROR_INVALID_PARAM (which is not recorded)."""
    return _last_error(level, clear=True)


def peek_at_last_error(level):
    """This thread's last error code, left as it is."""
    return _last_error(level, clear=False)


ACL_RT_THREAD_LEVEL = 0


def _last_error(level, clear: bool) -> int:
    if isinstance(level, bool) or not isinstance(level, int) or level != ACL_RT_THREAD_LEVEL:
        _log.warning("get_last_error: level must be ACL_RT_THREAD_LEVEL (0), got %r", level)
        return ACL_ERROR_INVALID_PARAM
    return _last_error_code(clear)


def get_mem_info(attr):
    """(free, total, ret)."""
    return values_and_code(_rt.get_mem_info, attr, failed=(0, 0))


def mem_flush(dev_ptr, size):
    return code_of(_rt.mem_flush, dev_ptr, size)


def mem_invalidate(dev_ptr, size):
    return code_of(_rt.mem_invalidate, dev_ptr, size)
