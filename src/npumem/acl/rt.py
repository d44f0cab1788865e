"""`acl.rt`: runtime calls with pyACL's names and return conventions (see `_result`)."""

from __future__ import annotations

from types import SimpleNamespace

from .. import runtime as _rt
from ..constants import MallocPolicy, MemcpyKind
from ..runtime.memory import lenient_policy
from ._result import code_of, values_and_code

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


def synchronize_stream_with_timeout(stream, timeout_ms):
    """timeout_ms = -1 waits forever, as in AscendCL."""
    return code_of(_rt.synchronize_stream, stream, None if timeout_ms < 0 else timeout_ms / 1000)


def create_event():
    return values_and_code(lambda: _handle(_rt.create_event()))


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


def get_mem_info(attr):
    """(free, total, ret)."""
    return values_and_code(_rt.get_mem_info, attr, failed=(0, 0))


def mem_flush(dev_ptr, size):
    return code_of(_rt.mem_flush, dev_ptr, size)


def mem_invalidate(dev_ptr, size):
    return code_of(_rt.mem_invalidate, dev_ptr, size)
