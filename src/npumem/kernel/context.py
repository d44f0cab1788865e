"""The block being run: which core it is on, its on-chip memory, its clock, its faults.

A kernel's code calls `get_block_idx()` and the instructions the way Ascend C code does, with no
handle passed around; they find the running block here (one per thread, since streams run on
threads of their own).
"""

from __future__ import annotations

import threading

import numpy as np

from ..aicore.timeline import Slice
from ..errors import KernelFault

_CURRENT = threading.local()


class CoreMemory:
    """One core's on-chip buffers as real bytes, made on first use (zeroed pages cost nothing
    until written)."""

    def __init__(self, profile):
        self.profile = profile
        self._buffers: dict[str, np.ndarray] = {}

    def buffer(self, name: str) -> np.ndarray:
        array = self._buffers.get(name)
        if array is None:
            array = self._buffers[name] = np.zeros(self.profile.buffers[name], np.uint8)
        return array


class BlockContext:
    """One block's run on one core: clocks per lane, what its pipe has carved, its tiles."""

    def __init__(self, launch, block: int, core: int, memory: CoreMemory, start: float):
        self.launch, self.block, self.core, self.memory = launch, block, core, memory
        self.profile = launch.profile
        self.start = start
        self.lane_free: dict[str, float] = {}
        self.carved: dict[str, list] = {}          # physical buffer -> [(name, offset, bytes)]
        self.queues_made = 0
        self.tiles = -1                            # the highest tile any queue has reached
        self.gm_written: dict[str, float] = {}     # argument -> when this core last wrote it
        self.finish = start

    # --- time -------------------------------------------------------------------------------

    def issue(self, lane: str, cycles: int, name: str, *, reads=(), writes=(), nbytes: int = 0,
              tile: int | None = None, after: float = 0.0) -> float:
        """Run an instruction on `lane`: it starts when the lane is free and its operands are
        ready (data written before it is read, read before it is overwritten). Returns its end."""
        start = max(self.lane_free.get(lane, self.start), self.start, after)
        for slot in reads:
            start = max(start, slot.ready)
        for slot in writes:
            start = max(start, slot.ready, slot.last_read)
        end = start + cycles
        self.lane_free[lane] = end
        for slot in reads:
            slot.last_read = max(slot.last_read, end)
        for slot in writes:
            slot.ready = end
        self.finish = max(self.finish, end)
        self.launch.timeline.add(Slice(self.block, self.core, lane, name, start, end, nbytes,
                                       tile if tile is not None else max(self.tiles, 0)))
        return end

    # --- faults -----------------------------------------------------------------------------

    def where(self, buffer: str | None = None, tile: int | None = None) -> str:
        tile = self.tiles if tile is None else tile
        place = f"kernel {self.launch.name}: core {self.core} (block {self.block}), " + \
            (f"tile {tile}" if tile >= 0 else "setup, before the first tile")
        return place + (f", buffer {buffer}" if buffer else "")

    def fault(self, message: str, buffer: str | None = None, tile: int | None = None) -> KernelFault:
        return KernelFault(f"{self.where(buffer, tile)}: {message}")


def current(what: str) -> BlockContext:
    """The running block; outside a kernel, a clear error instead of a traceback."""
    context = getattr(_CURRENT, "block", None)
    if context is None:
        raise KernelFault(f"{what} can only be called inside a @kernel function while it runs "
                          "(launch it with kernel[block_dim, stream](...))")
    return context


def enter(context: BlockContext | None) -> BlockContext | None:
    previous = getattr(_CURRENT, "block", None)
    _CURRENT.block = context
    return previous


def get_block_idx() -> int:
    """This block's index, 0 .. block_dim - 1 (Ascend C's GetBlockIdx)."""
    return current("get_block_idx").block


def get_block_num() -> int:
    """How many blocks the launch runs (Ascend C's GetBlockNum)."""
    return current("get_block_num").launch.block_dim
