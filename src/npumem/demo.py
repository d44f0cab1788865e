"""`npumem demo`: the AscendCL memory flow end to end on the simulated NPU.

init -> device -> stream -> device and pinned memory -> async H2D -> on-device work (D2D copy,
memset) -> async D2H -> verify against numpy -> sync -> cleanup, printing each step and the
memory figures. (The two-phase operators join this flow with the operator API.)
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from . import runtime as rt
from .constants import MallocPolicy, MemAttr, MemcpyKind
from .units import carve, carve_size, format_size

STEPS = 9


def run_demo(size: int = 1 << 20, device: str = "sim", echo: Callable[[str], None] = print) -> bool:
    """Run the flow over `size` float32 elements; returns True when verification passes."""
    if device != "sim":
        raise ValueError(f"device backend {device!r} is not available; this build has: sim")
    step = iter(range(1, STEPS + 1))

    def say(text: str) -> None:
        echo(f"[{next(step)}/{STEPS}] {text}")

    nbytes = size * 4
    rt.init()
    try:
        say(f"init: simulated NPU, {rt.get_device_count()} device(s), run mode {rt.get_run_mode().name}")
        rt.set_device(0)
        free0, total = rt.get_mem_info(MemAttr.HBM_MEM)
        say(f"set_device(0): HBM {format_size(free0)} free of {format_size(total)}")
        stream = rt.create_stream()
        start, end = rt.create_event(), rt.create_event()
        say(f"create_stream: {stream!r}")

        host_in = np.random.default_rng(0).standard_normal(size).astype(np.float32)
        pinned_in, pinned_out = rt.malloc_host(nbytes), rt.malloc_host(nbytes)
        dev_a = rt.malloc(nbytes, MallocPolicy.HUGE_FIRST)
        dev_b = rt.malloc(nbytes, MallocPolicy.HUGE_FIRST)
        offsets, block_size = carve([nbytes // 4] * 4)
        block = rt.malloc_align32(block_size)
        pieces = [block + offset for offset in offsets]
        say(f"malloc: 2 x {format_size(nbytes)} (device pointers 0x{dev_a:x}, 0x{dev_b:x}), "
            f"2 pinned staging buffers, one block carved into 4 pieces of "
            f"ALIGN_UP(len, 32) + 32 = {carve_size(nbytes // 4)} bytes")

        rt.memcpy(pinned_in, nbytes, host_in, nbytes, MemcpyKind.HOST_TO_HOST)
        rt.record_event(start, stream)
        rt.memcpy_async(dev_a, nbytes, pinned_in, nbytes, MemcpyKind.HOST_TO_DEVICE, stream)
        say(f"memcpy_async H2D of {format_size(nbytes)} queued (returned before the copy ran)")

        rt.memcpy_async(dev_b, nbytes, dev_a, nbytes, MemcpyKind.DEVICE_TO_DEVICE, stream)
        for i, piece in enumerate(pieces):       # scatter the data into the carved pieces
            quarter = nbytes // 4
            rt.memcpy_async(piece, quarter, dev_b + i * quarter, quarter,
                            MemcpyKind.DEVICE_TO_DEVICE, stream)
        rt.memset_async(dev_a, nbytes, 0, nbytes, stream)
        say("device work queued: D2D copy, scatter into the carved pieces, memset of the source")

        for i, piece in enumerate(pieces):       # gather them back through the pinned buffer
            quarter = nbytes // 4
            rt.memcpy_async(pinned_out + i * quarter, quarter, piece, quarter,
                            MemcpyKind.DEVICE_TO_HOST, stream)
        rt.record_event(end, stream)
        rt.synchronize_stream(stream)
        elapsed = rt.event_elapsed_time(start, end)
        say(f"memcpy_async D2H + synchronize_stream: stream work took {elapsed:.2f} ms")

        result = np.empty_like(host_in)
        rt.memcpy(result, nbytes, pinned_out, nbytes, MemcpyKind.HOST_TO_HOST)
        zeros = np.ones(16, dtype=np.uint8)
        rt.memcpy(zeros, 16, dev_a, 16, MemcpyKind.DEVICE_TO_HOST)
        passed = bool(np.array_equal(result, host_in) and not zeros.any())
        free1, _ = rt.get_mem_info(MemAttr.HBM_MEM)
        say(f"Result verification: {'PASS' if passed else 'FAIL'} "
            f"({size} float32 values round-tripped, memset checked); "
            f"device memory in use {format_size(free0 - free1)}")

        t0 = time.perf_counter()
        for pointer in (dev_a, dev_b, block):
            rt.free(pointer)
        rt.free_host(pinned_in)
        rt.free_host(pinned_out)
        rt.destroy_event(start)
        rt.destroy_event(end)
        rt.destroy_stream(stream)
        leaked = rt.reset_device(0)
        say(f"cleanup in {(time.perf_counter() - t0) * 1e3:.2f} ms: live allocations left: {len(leaked)}")
        return passed and not leaked
    finally:
        if rt.is_initialized():
            rt.finalize()
