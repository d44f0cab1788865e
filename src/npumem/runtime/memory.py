"""The driver-level memory API: malloc/free, pinned host memory, memset, memcpy, memory info.

This level does no caching (that is the pool's job): every malloc goes to the device backend.
Arguments are validated here, before anything changes, so a rejected call leaves all memory as it
was. Size rules (REFERENCE.md section 2): malloc takes ALIGN_UP(size, 32) + 32 bytes,
malloc_align32 takes ALIGN_UP(size, 32); device addresses start 64-byte aligned (dvpp: 128).
"""

from __future__ import annotations

import ctypes
import os
import threading

from ..constants import (
    ASYNC_COPY_ALIGN, MALLOC_ALIGN, MALLOC_PADDING, MALLOC_POLICY_FLAGS, MallocPolicy, MemAttr,
    MemcpyKind, RunMode,
)
from ..device.address_space import MAX_DEVICES, device_of, in_device_space
from ..device.backend import DeviceRange
from ..errors import (
    ACL_ERROR_HOST_MEMORY_ALREADY_REGISTERED, ACL_ERROR_HOST_MEMORY_NOT_REGISTERED,
    AddressUnalignedError, FeatureNotSupportedError, HostRegisterError, InvalidDeviceError,
    InvalidMemoryTypeError, InvalidParamError, MemoryAccessError, MemoryAllocationError,
    MemoryFreeError, integer_argument, strict,
)
from ..observe import OBSERVERS, emit
from ..units import align_up, format_size
from .hostmem import KNOWN_HOST, PINNED, HostRange, host_range
from .state import RUNTIME
from .stream import device_work

# --- argument checks -------------------------------------------------------------------------


def _size(size, api: str) -> int:
    size = integer_argument(size, f"{api}: size")
    if size <= 0:
        raise InvalidParamError(f"{api}: size must be positive, got {size}")
    return size


def _enum(value, enum, api: str, what: str):
    try:
        return enum(integer_argument(value, f"{api}: {what}"))
    except ValueError:
        choices = ", ".join(f"{m.name}={m.value}" for m in enum)
        raise InvalidParamError(f"{api}: unknown {what} {value!r}; expected one of {choices}") from None


def _count(count, limit, api: str, count_name: str, limit_name: str) -> tuple[int, int]:
    count = integer_argument(count, f"{api}: {count_name}")
    limit = integer_argument(limit, f"{api}: {limit_name}")
    if count < 0 or limit < 0:
        raise InvalidParamError(f"{api}: {count_name}={count} and {limit_name}={limit} must not be negative")
    if count > limit:
        raise InvalidParamError(f"{api}: {count_name}={count} exceeds {limit_name}={limit}")
    return count, limit


# --- allocation ------------------------------------------------------------------------------


def _policy(policy, api: str) -> MallocPolicy:
    """The policy without CANN's flag bits (bandwidth class, read-only), which the simulated
    device accepts and ignores; an unknown policy is an error here."""
    value = integer_argument(policy, f"{api}: malloc policy")
    return _enum(value & ~MALLOC_POLICY_FLAGS if value > 0 else value, MallocPolicy, api,
                 "malloc policy")


def lenient_policy(policy, api: str) -> int:
    """`policy` as the CANN runtime takes it (npumem.acl): an unknown one falls back to
    HUGE_FIRST (NPUMEM_STRICT=1 warns)."""
    value = integer_argument(policy, f"{api}: malloc policy")
    try:
        _policy(value, api)
    except InvalidParamError:
        strict(f"{api}: unknown malloc policy {value}; using HUGE_FIRST")
        return MallocPolicy.HUGE_FIRST
    return value


def _device_malloc(size, policy, api: str, padding: int) -> int:
    size = _size(size, api)
    policy = _policy(policy, api)
    device = RUNTIME.current_context().device
    reserved = align_up(size, MALLOC_ALIGN) + padding
    allocation = RUNTIME.backend.allocate(device, size, reserved, policy, api)
    if OBSERVERS.active:        # to a profiler, each driver allocation is a one-block segment
        _observe(allocation, "segment_alloc", "alloc")
    return allocation.start


def _observe(allocation, *actions: str) -> None:
    for action in actions:
        emit(RUNTIME.backend, action, allocation.device, allocation.start, allocation.reserved,
             allocation.size, None)


def malloc(size: int, policy: MallocPolicy | int = MallocPolicy.HUGE_FIRST) -> int:
    """Device memory of at least `size` bytes on the current device; returns the device pointer.

    Reserves ALIGN_UP(size, 32) + 32 bytes; the address is 64-byte aligned; contents undefined.
    """
    return _device_malloc(size, policy, "malloc", MALLOC_PADDING)


def malloc_align32(size: int, policy: MallocPolicy | int = MallocPolicy.HUGE_FIRST) -> int:
    """Like `malloc` but reserves only ALIGN_UP(size, 32): for blocks you carve up yourself."""
    return _device_malloc(size, policy, "malloc_align32", 0)


def malloc_cached(size: int, policy: MallocPolicy | int = MallocPolicy.HUGE_FIRST) -> int:
    """Like `malloc`, for memory the device's CPU caches (see `mem_flush` / `mem_invalidate`)."""
    return _device_malloc(size, policy, "malloc_cached", MALLOC_PADDING)


def dvpp_malloc(size: int) -> int:
    """Media-processing (DVPP) device memory: huge pages first, start 128-byte aligned."""
    return _device_malloc(size, MallocPolicy.HUGE_FIRST, "dvpp_malloc", MALLOC_PADDING)


def _pointer(pointer, api: str) -> int:
    return integer_argument(pointer, f"{api}: pointer")


def free(pointer: int) -> None:
    """Release memory from malloc, malloc_align32 or malloc_cached."""
    pointer = _pointer(pointer, "free")
    backend = RUNTIME.require()
    if not pointer:
        raise InvalidParamError("free: the pointer is null")
    if not backend.is_device_pointer(pointer):
        if PINNED.find(pointer) is not None:
            raise MemoryFreeError(f"free(0x{pointer:x}): this is pinned host memory from "
                                  "malloc_host; release it with free_host")
        raise MemoryFreeError(f"free(0x{pointer:x}): not a device pointer")
    _device_free(backend, pointer, "free")


def _device_free(backend, pointer: int, api: str) -> None:
    allocation = backend.free(pointer, api)
    if OBSERVERS.active:
        _observe(allocation, "free", "segment_free")


def dvpp_free(pointer: int) -> None:
    """Release memory from dvpp_malloc."""
    pointer = _pointer(pointer, "dvpp_free")
    _device_free(RUNTIME.require(), pointer, "dvpp_free")


def malloc_host(size: int) -> int:
    """Pinned (page-locked) host memory, 64-byte aligned; release it with `free_host` only."""
    size = _size(size, "malloc_host")
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if size > physical:                 # page-locked memory cannot exceed the machine's RAM
        raise MemoryAllocationError(f"malloc_host({size}): {format_size(size)} of page-locked "
                                    f"memory is more than this machine's {format_size(physical)} "
                                    "of RAM")
    return PINNED.allocate(size, RUNTIME.require()).start


def free_host(pointer: int) -> None:
    """Release memory from malloc_host."""
    pointer = _pointer(pointer, "free_host")
    if RUNTIME.require().is_device_pointer(pointer):
        raise MemoryFreeError(f"free_host(0x{pointer:x}): this is device memory; release it "
                              "with free (or dvpp_free)")
    PINNED.free(pointer)


# --- zero copy: pinned host memory with a device address ------------------------------------


def host_register(host_pointer: int, size: int) -> int:
    """Map `size` bytes of pinned host memory (malloc_host) into the current device's address
    space; returns the device pointer. Device work on it reads and writes the host bytes
    directly, so no copy is needed. Undo with `host_unregister` before `free_host`."""
    api = "host_register"
    size = _size(size, api)
    host_pointer = _pointer(host_pointer, api)
    device = RUNTIME.current_context().device
    pinned = PINNED.find(host_pointer)
    if pinned is None:
        raise InvalidMemoryTypeError(f"{api}(0x{host_pointer:x}): only pinned host memory from "
                                     "malloc_host can be mapped into the device")
    offset = host_pointer - pinned.start
    if offset + size > pinned.size:
        raise InvalidParamError(f"{api}(0x{host_pointer:x}, {size}): runs {offset + size - pinned.size} "
                                f"bytes past the end of {pinned.describe()}")
    return RUNTIME.backend.register_host(device, pinned, offset, size).start


def host_unregister(device_pointer: int) -> None:
    """Remove a mapping made by `host_register` (the host memory stays allocated)."""
    device_pointer = _pointer(device_pointer, "host_unregister")
    backend = RUNTIME.require()
    if not backend.is_device_pointer(device_pointer):
        raise MemoryFreeError(f"host_unregister(0x{device_pointer:x}): pass the device pointer "
                              "that host_register returned")
    backend.free(device_pointer, "host_unregister")


# --- aclrtHostRegister / aclrtHostUnregister: CANN's rules, by host address -----------------

HOST_REGISTER_MAPPED, HOST_REGISTER_IOMEMORY, HOST_REGISTER_READONLY = 0, 0x04, 0x08
HOST_PAGE = 4096
_registered_lock = threading.Lock()
_registered: dict[int, tuple[int, int, int, object]] = {}   # host start -> (end, device ptr, device, host)


def register_host_range(host_pointer: int, size: int, register_type: int = HOST_REGISTER_MAPPED) -> int:
    """aclrtHostRegister: map [host_pointer, host_pointer + size) for the current device and
    return its device address. The range must be 4 KiB aligned (the start of a malloc_host
    buffer is accepted too: the simulator pins small buffers at 64 bytes) and lie in pinned
    memory or in a buffer npumem handed out and still holds (numpy_to_ptr, bytes_to_ptr), so
    that the bytes outlive the mapping. A range overlapping one already registered is
    ACL_ERROR_HOST_MEMORY_ALREADY_REGISTERED, as in CANN's runtime."""
    api = "host_register"
    host_pointer = _pointer(host_pointer, api)
    size = integer_argument(size, f"{api}: size")
    register_type = integer_argument(register_type, f"{api}: type")
    if host_pointer == 0 or size <= 0:
        raise InvalidParamError(f"{api}: ptr must be non-null and size positive, got "
                                f"0x{host_pointer:x}, {size}")
    if register_type in (HOST_REGISTER_IOMEMORY, HOST_REGISTER_READONLY):
        raise FeatureNotSupportedError(
            f"{api}: type {register_type} ({'IOMEMORY' if register_type == 4 else 'READONLY'}) is "
            "not supported: the simulator has no PCIe IO space and no read-only mappings; use "
            "ACL_HOST_REGISTER_MAPPED (0)")
    if register_type != HOST_REGISTER_MAPPED:
        raise InvalidParamError(f"{api}: unknown type {register_type}; expected "
                                "ACL_HOST_REGISTER_MAPPED (0)")
    device = RUNTIME.current_context().device
    if RUNTIME.backend.is_device_pointer(host_pointer):
        raise InvalidMemoryTypeError(f"{api}(0x{host_pointer:x}): this is device memory; "
                                     "host_register maps host memory")
    host = _registrable_host(host_pointer, size, api)
    end = host_pointer + size
    with _registered_lock:
        for start, (other_end, _, _, _) in _registered.items():
            if start < end and host_pointer < other_end:
                raise HostRegisterError(
                    f"{api}(0x{host_pointer:x}, {size}): overlaps [0x{start:x}, 0x{other_end:x}), "
                    "which is already registered; host_unregister it first",
                    ACL_ERROR_HOST_MEMORY_ALREADY_REGISTERED)
        offset = host_pointer - host.start
        mapped = RUNTIME.backend.register_host(device, host, offset, size)
        _registered[host_pointer] = (end, mapped.start, device, host)
    return mapped.start


def _registrable_host(host_pointer: int, size: int, api: str):
    """The host allocation (pinned, or a known buffer wrapped as one) holding the range."""
    pinned = PINNED.find(host_pointer)
    if pinned is not None:
        if host_pointer % HOST_PAGE and host_pointer != pinned.start:
            raise AddressUnalignedError(f"{api}(0x{host_pointer:x}): the host address must be "
                                        f"{HOST_PAGE}-byte (page) aligned")
        if host_pointer + size > pinned.end:
            raise MemoryAccessError(f"{api}(0x{host_pointer:x}, {size}): runs "
                                    f"{host_pointer + size - pinned.end} bytes past the end of "
                                    f"{pinned.describe()}")
        return pinned
    if PINNED.find_freed(host_pointer) is not None:
        raise MemoryAccessError(f"{api}(0x{host_pointer:x}): inside pinned memory released with "
                                "free_host: use after free")
    if host_pointer % HOST_PAGE:
        raise AddressUnalignedError(f"{api}(0x{host_pointer:x}): the host address must be "
                                    f"{HOST_PAGE}-byte (page) aligned")
    known = KNOWN_HOST.find(host_pointer, size)
    if known is None:
        raise InvalidMemoryTypeError(
            f"{api}(0x{host_pointer:x}, {size}): not memory npumem can keep alive while the device "
            "uses it: pass memory from malloc_host, or a buffer from numpy_to_ptr / bytes_to_ptr "
            "that you still hold")
    owner, writable = known
    if not writable:
        raise InvalidMemoryTypeError(f"{api}(0x{host_pointer:x}): the buffer is read-only "
                                     f"({type(owner).__name__}); the device could write to it")
    from ..device.address_index import Allocation
    from ..device.backing import host_bytes
    view = host_bytes(host_pointer, size)
    return Allocation(start=host_pointer, size=size, reserved=0, api="pageable host memory",
                      device=-1, buffer=view, host_address=host_pointer, free_api="",
                      extra={"owner": owner})


def unregister_host_range(host_pointer: int) -> None:
    """aclrtHostUnregister: undo register_host_range, given the host address it registered;
    memory never registered is ACL_ERROR_HOST_MEMORY_NOT_REGISTERED."""
    api = "host_unregister"
    host_pointer = _pointer(host_pointer, api)
    RUNTIME.current_context()
    if host_pointer == 0:
        raise InvalidParamError(f"{api}: the pointer is null")
    with _registered_lock:
        entry = _registered.get(host_pointer)
        if entry is None:
            raise HostRegisterError(f"{api}(0x{host_pointer:x}): this host address was not "
                                    "registered with host_register (pass the address registered)",
                                    ACL_ERROR_HOST_MEMORY_NOT_REGISTERED)
        RUNTIME.backend.free(entry[1], "host_unregister")
        del _registered[host_pointer]


def _forget_registrations(device: int) -> None:
    """reset_device / finalize: the device's mappings go with it."""
    with _registered_lock:
        for start in [s for s, entry in _registered.items() if entry[2] == device]:
            mapped = _registered.pop(start)[1]
            backend = RUNTIME.backend
            if backend is not None and backend.is_device_pointer(mapped):
                try:
                    backend.free(mapped, "host_unregister")
                except MemoryFreeError:
                    pass                      # already released with the device


RUNTIME.device_release_hooks.append(_forget_registrations)


# --- aclrtMallocHostWithCfg ------------------------------------------------------------------

MEM_ATTR_RSV, MEM_ATTR_MODULE_ID, MEM_ATTR_DEVICE_ID, MEM_ATTR_VA_FLAG = 0, 1, 2, 3


def malloc_host_with_cfg(size: int, cfg=None) -> int:
    """aclrtMallocHostWithCfg: malloc_host with a configuration, given as pyACL's dict
    {"attrs": [{"attr": ACL_RT_MEM_ATTR_..., "value": n}, ...]} (or None / {}). The module id
    is accepted (it only labels the memory); a device id must name a device; vaFlag 1 (host
    and device addresses equal) cannot be given by the simulator, whose device addresses live
    apart from host memory, and is ACL_ERROR_RT_FEATURE_NOT_SUPPORT."""
    api = "malloc_host_with_cfg"
    size = _size(size, api)
    for attr, value in _malloc_attrs(cfg, api):
        if attr == MEM_ATTR_DEVICE_ID:
            count = RUNTIME.require().device_count
            if not 0 <= value < count:
                raise InvalidDeviceError(f"{api}: device id {value} is not one of 0..{count - 1}")
        elif attr == MEM_ATTR_VA_FLAG and value:
            raise FeatureNotSupportedError(f"{api}: vaFlag=1 (the device address equal to the host "
                                           "address) is not supported by the simulator")
    return malloc_host(size)


def _malloc_attrs(cfg, api: str) -> list[tuple[int, int]]:
    if cfg is None:
        return []
    if not isinstance(cfg, dict):
        raise InvalidParamError(f"{api}: cfg must be a dict (or None), got {type(cfg).__name__}")
    attrs = cfg.get("attrs", [])
    if not isinstance(attrs, (list, tuple)):
        raise InvalidParamError(f"{api}: cfg['attrs'] must be a list, got {type(attrs).__name__}")
    result = []
    for item in attrs:
        if not isinstance(item, dict) or "attr" not in item:
            raise InvalidParamError(f"{api}: each attribute must be a dict with 'attr' and "
                                    f"'value', got {item!r}")
        attr = integer_argument(item["attr"], f"{api}: attr")
        value = item.get("value", 0)
        if isinstance(value, dict):          # the C union spelled out: {"device_id": 0}
            value = next(iter(value.values()), 0)
        value = integer_argument(value, f"{api}: value of attr {attr}")
        if attr not in (MEM_ATTR_RSV, MEM_ATTR_MODULE_ID, MEM_ATTR_DEVICE_ID, MEM_ATTR_VA_FLAG):
            raise InvalidParamError(f"{api}: unknown attr {attr}; expected ACL_RT_MEM_ATTR_RSV (0), "
                                    "MODULE_ID (1), DEVICE_ID (2) or VA_FLAG (3)")
        result.append((attr, value))
    return result


# --- aclrtGetMemUsageInfo ---------------------------------------------------------------------

def mem_usage_info(device: int, count: int) -> list[dict]:
    """Device memory by component (the call that allocated it: malloc, malloc_align32 (the
    caching pools' segments), dvpp_malloc, ...): name, current and peak bytes reserved since
    the device was opened, largest current first, at most `count` of them."""
    device = RUNTIME.check_device(device)
    count = integer_argument(count, "get_mem_usage_info: input_num")
    if count < 0:
        raise InvalidParamError(f"get_mem_usage_info: input_num must not be negative, got {count}")
    backend = RUNTIME.backend
    device_of = getattr(backend, "_device", None)         # the sim and torch backends
    index = getattr(device_of(device), "allocations", None) if callable(device_of) else None
    if index is not None and index.usage is not None:
        usage = {api: tuple(numbers) for api, numbers in index.usage.items() if numbers[1]}
    else:                                  # a backend without an index: no peaks to report
        usage = {}
        for allocation in backend.live_allocations(device):
            current = usage.get(allocation.api, (0, 0))[0] + allocation.reserved
            usage[allocation.api] = (current, current)
    rows = [{"name": api[:31], "cur_mem_size": current, "mem_peak_size": peak}
            for api, (current, peak) in usage.items()]
    rows.sort(key=lambda row: (-row["cur_mem_size"], -row["mem_peak_size"], row["name"]))
    return rows[:count]


# --- bytes: memset and memcpy ----------------------------------------------------------------


def _endpoint(obj, nbytes: int, what: str, writable: bool) -> DeviceRange | HostRange:
    """Resolve a copy end: device pointers are bounds-checked against live allocations."""
    backend = RUNTIME.backend
    if isinstance(obj, int) and not isinstance(obj, bool):
        if backend.is_device_pointer(obj):
            return backend.resolve(obj, nbytes, what)
        if in_device_space(obj, MAX_DEVICES):     # no host memory lives there: never touch it
            raise MemoryAccessError(
                f"{what}: 0x{obj:x} is an address of device {device_of(obj)}, which does not "
                f"exist (this runtime has {backend.device_count} device(s))")
    return host_range(obj, nbytes, what, writable)


def _fill(dst, value: int) -> None:
    if isinstance(dst, DeviceRange):
        RUNTIME.backend.fill(dst, value)
    else:
        dst.check_live("memset")
        ctypes.memset(dst.address, value, dst.nbytes)


def _memset_args(dst, max_count, value, count, api):
    RUNTIME.current_context()
    count, _ = _count(count, max_count, api, "count", "max_count")
    value = integer_argument(value, f"{api}: value")
    if not 0 <= value <= 255:
        raise InvalidParamError(f"{api}: value {value} is not a byte value (0..255)")
    return _endpoint(dst, count, api, writable=True), value


def memset(dst, max_count: int, value: int, count: int) -> None:
    """Set `count` bytes at `dst` (device or host memory) to `value`; count <= max_count."""
    target, value = _memset_args(dst, max_count, value, count, "memset")
    _fill(target, value)


def memset_async(dst, max_count: int, value: int, count: int, stream=None) -> None:
    """`memset` queued on `stream` (None: the default stream)."""
    target, value = _memset_args(dst, max_count, value, count, "memset_async")
    RUNTIME.stream(stream, "memset_async").enqueue(device_work(lambda: _fill(target, value)),
                                                    f"memset_async of {count} bytes")


_KIND_OF = {
    (False, False): MemcpyKind.HOST_TO_HOST,
    (False, True): MemcpyKind.HOST_TO_DEVICE,
    (True, False): MemcpyKind.DEVICE_TO_HOST,
    (True, True): MemcpyKind.DEVICE_TO_DEVICE,
}
# The direction the kinds past DEFAULT name.
_DIRECTION = {MemcpyKind.HOST_TO_BUF_TO_DEVICE: MemcpyKind.HOST_TO_DEVICE,
              MemcpyKind.INNER_DEVICE_TO_DEVICE: MemcpyKind.DEVICE_TO_DEVICE,
              MemcpyKind.INTER_DEVICE_TO_DEVICE: MemcpyKind.DEVICE_TO_DEVICE}


def _describe(end) -> str:
    return "device memory" if isinstance(end, DeviceRange) else "host memory"


def _kind_mismatch(kind: MemcpyKind, actual: MemcpyKind, target, source) -> str | None:
    """Why `kind` does not describe a copy between these two ends (None when it does)."""
    if kind == MemcpyKind.DEFAULT:
        return None
    if _DIRECTION.get(kind, kind) != actual:
        return (f"kind is {kind.name} but the destination is {_describe(target)} and the "
                f"source is {_describe(source)} ({actual.name})")
    if kind in (MemcpyKind.INNER_DEVICE_TO_DEVICE, MemcpyKind.INTER_DEVICE_TO_DEVICE):
        same = target.allocation.device == source.allocation.device
        if same != (kind == MemcpyKind.INNER_DEVICE_TO_DEVICE):
            return (f"kind is {kind.name} but the copy goes from device "
                    f"{source.allocation.device} to device {target.allocation.device}")
    return None


def _copy_args(dst, dest_max, src, count, kind, api, kind_is_reserved: bool = False):
    """The two ends and the direction. `kind_is_reserved`: the synchronous copies, whose kind
    CANN documents as reserved (the addresses decide): a mismatch is only a strict warning."""
    RUNTIME.current_context()
    count, _ = _count(count, dest_max, api, "count", "dest_max")
    kind = _enum(kind, MemcpyKind, api, "memcpy kind")
    target = _endpoint(dst, count, f"{api} destination", writable=True)
    source = _endpoint(src, count, f"{api} source", writable=False)
    actual = _KIND_OF[isinstance(source, DeviceRange), isinstance(target, DeviceRange)]
    mismatch = _kind_mismatch(kind, actual, target, source)
    if mismatch and not kind_is_reserved:
        raise InvalidParamError(f"{api}: {mismatch}; pass {actual.name} or DEFAULT")
    if mismatch:
        strict(f"{api}: {mismatch}; copying {actual.name}, as CANN does (kind is reserved)")
    if actual == MemcpyKind.DEVICE_TO_DEVICE and \
            target.allocation.device != source.allocation.device:
        pair = (source.allocation.device, target.allocation.device)
        if pair not in RUNTIME.peers and pair[::-1] not in RUNTIME.peers:
            strict(f"{api}: a copy from device {pair[0]} to device {pair[1]} without "
                   "device_enable_peer_access; CANN requires it, npumem copies anyway")
    return target, source, actual, kind


class CopyCounter:
    """Bytes and calls moved by memcpy per direction: zero copy shows up as nothing moved."""

    def __init__(self):
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.bytes = {kind.name: 0 for kind in _KIND_OF.values()}
            self.calls = dict.fromkeys(self.bytes, 0)

    def add(self, kind: MemcpyKind, nbytes: int) -> None:
        with self._lock:
            self.bytes[kind.name] += nbytes
            self.calls[kind.name] += 1

    def snapshot(self) -> dict:
        with self._lock:
            return {"bytes": dict(self.bytes), "calls": dict(self.calls),
                    "total_bytes": sum(self.bytes.values())}


COPIES = CopyCounter()


def copy_stats(reset: bool = False) -> dict:
    """{"bytes": {direction: n}, "calls": {direction: n}, "total_bytes": n} since the last reset."""
    stats = COPIES.snapshot()
    if reset:
        COPIES.reset()
    return stats


def _transfer(target, source, kind: MemcpyKind) -> None:
    COPIES.add(kind, source.nbytes)
    backend = RUNTIME.backend
    if kind == MemcpyKind.HOST_TO_DEVICE:
        source.check_live("memcpy source")
        backend.write(target, source.address)
    elif kind == MemcpyKind.DEVICE_TO_HOST:
        target.check_live("memcpy destination")
        backend.read(target.address, source)
    elif kind == MemcpyKind.DEVICE_TO_DEVICE:
        backend.copy(target, source)
    else:
        source.check_live("memcpy source")
        target.check_live("memcpy destination")
        ctypes.memmove(target.address, source.address, source.nbytes)


def memcpy(dst, dest_max: int, src, count: int, kind: MemcpyKind | int, *,
           kind_is_reserved: bool = False) -> None:
    """Copy `count` bytes from `src` to `dst` now; count <= dest_max; kind must match the ends
    (with `kind_is_reserved`, as CANN documents aclrtMemcpy and npumem.acl calls it, the two
    addresses decide and a mismatched kind is only a strict-mode warning)."""
    target, source, kind, _ = _copy_args(dst, dest_max, src, count, kind, "memcpy",
                                         kind_is_reserved)
    if count:
        _transfer(target, source, kind)


def memcpy_async(dst, dest_max: int, src, count: int, kind: MemcpyKind | int, stream=None) -> None:
    """Queue a copy on `stream` (None: the default stream) and return at once.

    Both ends must be 64-byte aligned, host memory must be pinned (malloc_host), and
    host-to-host copies are not supported, as in AscendCL. HOST_TO_BUF_TO_DEVICE takes pageable
    host memory too: its bytes are staged before the call returns, so the caller may reuse them.
    """
    api = "memcpy_async"
    target, source, kind, named = _copy_args(dst, dest_max, src, count, kind, api)
    if named == MemcpyKind.HOST_TO_BUF_TO_DEVICE and count:
        source = _staged(source, api)
    if kind == MemcpyKind.HOST_TO_HOST:
        raise FeatureNotSupportedError(f"{api}: host-to-host copies cannot be asynchronous; use memcpy")
    for end, name in ((target, "destination"), (source, "source")):
        if end.address % ASYNC_COPY_ALIGN:
            raise AddressUnalignedError(
                f"{api}: {name} 0x{end.address:x} is not {ASYNC_COPY_ALIGN}-byte aligned "
                f"(it is {end.address % ASYNC_COPY_ALIGN} bytes past a boundary)"
            )
        if isinstance(end, HostRange) and end.pinned is None and \
                named != MemcpyKind.HOST_TO_BUF_TO_DEVICE:
            raise InvalidMemoryTypeError(
                f"{api}: {name} 0x{end.address:x} is pageable host memory; asynchronous copies "
                "need pinned memory from malloc_host (or HOST_TO_BUF_TO_DEVICE, which stages it)"
            )
    stream = RUNTIME.stream(stream, api)
    if count:
        stream.enqueue(device_work(lambda: _transfer(target, source, kind)),
                       f"{api} {kind.name} of {count} bytes")


def _staged(source: HostRange, api: str) -> HostRange:
    """A pinned copy of the source bytes, taken now (HOST_TO_BUF_TO_DEVICE)."""
    from ..device.backing import address_of, allocate_bytes

    source.check_live(f"{api} source")
    buffer = allocate_bytes(source.nbytes, ASYNC_COPY_ALIGN)
    ctypes.memmove(address_of(buffer), source.address, source.nbytes)
    return HostRange(address_of(buffer), source.nbytes, None, buffer)


def _rows(dst, dpitch, src, spitch, width, height, api):
    """The (destination, source) addresses of each row of a 2-D copy, checked."""
    dpitch, spitch = integer_argument(dpitch, f"{api}: dpitch"), integer_argument(spitch, f"{api}: spitch")
    width, height = integer_argument(width, f"{api}: width"), integer_argument(height, f"{api}: height")
    if min(dpitch, spitch, width, height) < 0:
        raise InvalidParamError(f"{api}: dpitch={dpitch}, spitch={spitch}, width={width} and "
                                f"height={height} must not be negative")
    if width > dpitch or width > spitch:
        raise InvalidParamError(f"{api}: width {width} is wider than dpitch {dpitch} or spitch "
                                f"{spitch}; each row must fit in its pitch")
    for name, end in (("dst", dst), ("src", src)):
        if not isinstance(end, int) or isinstance(end, bool):
            raise InvalidParamError(f"{api}: {name} must be an address (int), got {type(end).__name__}")
    return [(dst + row * dpitch, src + row * spitch) for row in range(height)], width


def memcpy2d(dst: int, dpitch: int, src: int, spitch: int, width: int, height: int,
             kind: MemcpyKind | int, *, kind_is_reserved: bool = False) -> None:
    """Copy a `height` x `width`-byte matrix whose rows are `spitch` bytes apart into rows
    `dpitch` bytes apart (aclrtMemcpy2d). Every row is bounds-checked before any is copied;
    `kind_is_reserved` as for `memcpy`."""
    rows, width = _rows(dst, dpitch, src, spitch, width, height, "memcpy2d")
    ends = [_copy_args(d, width, s, width, kind, "memcpy2d", kind_is_reserved) for d, s in rows]
    for target, source, direction, _ in ends:
        if width:
            _transfer(target, source, direction)


def memcpy2d_async(dst: int, dpitch: int, src: int, spitch: int, width: int, height: int,
                   kind: MemcpyKind | int, stream=None) -> None:
    """`memcpy2d` queued on `stream`, with memcpy_async's rules for each row."""
    rows, width = _rows(dst, dpitch, src, spitch, width, height, "memcpy2d_async")
    ends = [_copy_args(d, width, s, width, kind, "memcpy2d_async") for d, s in rows]
    if any(direction == MemcpyKind.HOST_TO_HOST for _, _, direction, _ in ends):
        raise FeatureNotSupportedError("memcpy2d_async: host-to-host copies cannot be "
                                       "asynchronous; use memcpy2d")
    for target, source, _, _ in ends:
        for end, name in ((target, "destination"), (source, "source")):
            if isinstance(end, HostRange) and end.pinned is None:
                raise InvalidMemoryTypeError(
                    f"memcpy2d_async: {name} 0x{end.address:x} is pageable host memory; "
                    "asynchronous copies need pinned memory from malloc_host")

    def copy_rows():
        for target, source, direction, _ in ends:
            _transfer(target, source, direction)
    if width and rows:
        RUNTIME.stream(stream, "memcpy2d_async").enqueue(
            device_work(copy_rows), f"memcpy2d_async of {len(rows)} rows of {width} bytes")


# --- information -----------------------------------------------------------------------------


def get_mem_info(attr: MemAttr | int) -> tuple[int, int]:
    """(free, total) bytes of the memory `attr` names, on the current device."""
    attr = _enum(attr, MemAttr, "get_mem_info", "memory attribute")
    device = RUNTIME.current_context().device
    return RUNTIME.backend.mem_info(device, attr)


def get_run_mode() -> RunMode:
    """Where this program runs: always ACL_HOST (a host driving the device). Like CANN's, it
    needs no init (acllite asks at import)."""
    return RunMode.HOST


def _cached_range(pointer, size, api: str) -> None:
    RUNTIME.current_context()
    size = _size(size, api)
    RUNTIME.backend.resolve(_pointer(pointer, api), size, api)


def mem_flush(pointer: int, size: int) -> None:
    """Write cached device memory back (coherence point); checks the range is allocated."""
    _cached_range(pointer, size, "mem_flush")


def mem_invalidate(pointer: int, size: int) -> None:
    """Drop cached copies of device memory (coherence point); checks the range is allocated."""
    _cached_range(pointer, size, "mem_invalidate")
