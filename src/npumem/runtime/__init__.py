"""The AscendCL-style runtime, Pythonic: functions raise `npumem.errors.AclError` subclasses."""

from .callbacks import launch_callback, process_report, subscribe_report, unsubscribe_report
from .control import (
    device_can_access_peer, device_disable_peer_access, device_enable_peer_access,
    create_context, create_event, dependencies, create_stream, destroy_context, destroy_event, destroy_stream,
    event_elapsed_time, finalize, get_backend, get_context, get_device, get_device_count, init,
    native_pointer, set_backend,
    is_initialized, query_event, query_stream, record_event, reset_device, reset_event,
    set_context, set_device, set_op_wait_timeout, stream_wait_event, synchronize_device, synchronize_event,
    synchronize_stream,
)
from .memory import (
    copy_stats, dvpp_free, dvpp_malloc, free, free_host, get_mem_info, get_run_mode,
    host_register, host_unregister, malloc, malloc_align32,
    malloc_cached, malloc_host, mem_flush, mem_invalidate, memcpy, memcpy2d, memcpy2d_async,
    memcpy_async, memset, memset_async,
)
from .state import RUNTIME, Context
from .stream import Event, Stream

import types as _types

__all__ = [name for name, value in globals().items()
           if not name.startswith("_") and not isinstance(value, _types.ModuleType)]
