"""The MemoryResource contract, run against every resource and adaptor (add new ones to RESOURCES)."""

import io
import threading

import numpy as np
import pytest

from npumem.alloc import StaticPlan
from npumem.alloc.adaptors import LimitingAdaptor, LoggingAdaptor, StatisticsAdaptor, TrackingAdaptor
from npumem.alloc.caching_allocator import CachingAllocator
from npumem.alloc.resource import DeviceResource
from npumem.alloc.settings import AllocatorSettings
from npumem.device import SimBackend, SimConfig
from npumem.errors import InvalidParamError, MemoryAllocationError, MemoryFreeError
from npumem.trace import TraceEvent
from npumem.units import MiB

from .conftest import run_threads, cuda_available, torch_cpu_backend, torch_cuda_backend

RESOURCES = {
    "device": lambda b: DeviceResource(b),
    "pool": lambda b: CachingAllocator(b),
    "pool-segments": lambda b: CachingAllocator(b, settings=AllocatorSettings(expandable_segments=False)),
    "torch-emulation": lambda b: CachingAllocator(b, settings=AllocatorSettings(expandable_segments=False),
                                                  flavour="torch"),
    "statistics(pool)": lambda b: StatisticsAdaptor(CachingAllocator(b)),
    "tracking(pool)": lambda b: TrackingAdaptor(CachingAllocator(b), stacks=True),
    "logging(pool)": lambda b: LoggingAdaptor(CachingAllocator(b), io.StringIO()),
    "limiting(pool)": lambda b: LimitingAdaptor(CachingAllocator(b), 48 * MiB),
    # A plan of a small recorded step; requests off the plan fall back to the pool.
    "static-plan(pool)": lambda b: StaticPlan.from_trace(
        [TraceEvent(0, "alloc", 1, 4096), TraceEvent(1, "alloc", 2, 100), TraceEvent(2, "free", 1, 4096),
         TraceEvent(3, "alloc", 3, 1 << 20), TraceEvent(4, "free", 2, 100), TraceEvent(5, "free", 3, 1 << 20)],
        CachingAllocator(b), time_limit=0.2),
    "stack of all": lambda b: LoggingAdaptor(StatisticsAdaptor(TrackingAdaptor(
        LimitingAdaptor(CachingAllocator(b), 48 * MiB))), io.StringIO()),
}


DEVICE_BACKENDS = {"sim": lambda: SimBackend(SimConfig(memory=64 * MiB)),
                   "torch:cpu": lambda: torch_cpu_backend(64 * MiB)}
if cuda_available():
    DEVICE_BACKENDS["torch:cuda"] = lambda: torch_cuda_backend(64 * MiB)


@pytest.fixture(params=[(b, r) for b in sorted(DEVICE_BACKENDS) for r in sorted(RESOURCES)],
                ids=lambda p: f"{p[0]}-{p[1]}")
def resource(request):
    backend_name, resource_name = request.param
    backend = DEVICE_BACKENDS[backend_name]()
    resource = RESOURCES[resource_name](backend)
    resource.backend = backend
    yield resource


def _write_read(backend, pointer, data):
    span = backend.resolve(pointer, len(data), "test")
    source = np.frombuffer(data, dtype=np.uint8)
    backend.write(span, source.ctypes.data)
    out = np.zeros(len(data), dtype=np.uint8)
    backend.read(out.ctypes.data, span)
    return out.tobytes()


def test_allocations_hold_their_bytes_and_are_aligned(resource):
    pointers = {resource.allocate(n): n for n in (1, 100, 4096, 100_000, 3 * MiB)}
    for pointer, n in pointers.items():
        assert pointer % 64 == 0 and resource.owns(pointer)
        data = bytes([n % 251]) * n
        assert _write_read(resource.backend, pointer, data) == data
    spans = sorted((p, p + n) for p, n in pointers.items())
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:]))
    for pointer, n in pointers.items():
        resource.deallocate(pointer, n)
        assert not resource.owns(pointer)


def test_too_large_fails_cleanly(resource):
    keep = resource.allocate(1000)
    with pytest.raises(MemoryAllocationError):
        resource.allocate(1 << 40)
    assert resource.owns(keep)
    resource.deallocate(keep)


def test_unknown_and_double_frees_are_refused(resource):
    pointer = resource.allocate(256)
    resource.deallocate(pointer)
    with pytest.raises(MemoryFreeError):
        resource.deallocate(pointer)
    with pytest.raises((MemoryFreeError, InvalidParamError)):
        resource.deallocate(0x1234)


def test_reuse_after_free(resource):
    for _ in range(50):
        resource.deallocate(resource.allocate(10_000))


def test_threads_on_their_own_streams(resource):
    pointers, lock = [], threading.Lock()

    def worker(stream):
        rng = np.random.default_rng(stream)
        mine = []
        for _ in range(150):
            if mine and rng.random() < 0.4:
                resource.deallocate(mine.pop(int(rng.integers(len(mine)))))
            else:
                mine.append(resource.allocate(int(rng.integers(1, 64_000)), stream))
        with lock:
            pointers.extend(mine)

    assert run_threads(worker) == []
    assert len(set(pointers)) == len(pointers)
    assert all(resource.owns(p) for p in pointers)
    for pointer in pointers:
        resource.deallocate(pointer)
