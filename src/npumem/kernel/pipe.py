"""TPipe, TQue and TBuf: carving a core's on-chip buffers and passing tiles between stages.

The pipe hands each queue `num` buffers of `length` bytes from the physical buffer behind the
queue's position (VECIN/VECOUT/VECCALC: the UB; A1/B1: L1; A2: L0A; B2: L0B; CO1: L0C), aligned
as the hardware requires. A queue's buffers cycle through free -> allocated (alloc_tensor) ->
queued (enque) -> allocated (deque) -> free (free_tensor); the sanitizer faults on every step
out of that order, naming the core, the tile and the queue.
"""

from __future__ import annotations

import enum

from ..units import align_up
from .context import current
from .tensors import LocalTensor, Slot, as_numpy_dtype


class TPosition(str, enum.Enum):
    GM = "GM"
    VECIN = "VECIN"
    VECOUT = "VECOUT"
    VECCALC = "VECCALC"
    A1 = "A1"
    A2 = "A2"
    B1 = "B1"
    B2 = "B2"
    CO1 = "CO1"
    CO2 = "CO2"


PHYSICAL = {TPosition.VECIN: "UB", TPosition.VECOUT: "UB", TPosition.VECCALC: "UB",
            TPosition.CO2: "UB", TPosition.A1: "L1", TPosition.B1: "L1", TPosition.A2: "L0A",
            TPosition.B2: "L0B", TPosition.CO1: "L0C"}

LENGTH_ALIGN = 32        # InitBuffer rounds each buffer's length up to 32 bytes


class _Buffers:
    """What TQue and TBuf share: a position, a name, and slots carved by a pipe."""

    kind = "buffer"

    def __init__(self, position, name: str | None):
        try:
            self.position = TPosition(position)
        except ValueError:
            raise current(f"{type(self).__name__}()").fault(
                f"{position!r} is not a TPosition; use one of "
                f"{', '.join(p.value for p in PHYSICAL)}") from None
        if self.position not in PHYSICAL:
            raise current(f"{type(self).__name__}()").fault(
                f"{self.position.value} is global memory, not an on-chip position")
        self.physical = PHYSICAL[self.position]
        self.context = current(type(self).__name__)
        self.context.queues_made += 1
        self.name = name or f"{self.kind}{self.context.queues_made}"
        self.memory = self.context.memory
        self.slots: list[Slot] = []

    def describe(self, index: int | None = None) -> str:
        which = f"[{index}]" if index is not None and len(self.slots) > 1 else ""
        return f"{self.name}{which} ({self.position.value}, {self.physical})"

    def _fault(self, message: str, tile: int | None = None):
        return self.context.fault(message, self.describe(), tile)


class TQue(_Buffers):
    """A queue of `depth` tensors at `position` (Ascend C's TQue<position, depth>)."""

    kind = "queue"

    def __init__(self, position, depth: int = 1, name: str | None = None):
        super().__init__(position, name)
        self.depth = depth
        self.fifo: list[LocalTensor] = []
        self.allocations = 0

    def alloc_tensor(self, dtype) -> LocalTensor:
        """A free buffer of this queue as a tensor of `dtype` (starts a new tile)."""
        if not self.slots:
            raise self._fault("alloc_tensor before pipe.init_buffer gave this queue its buffers")
        count = len(self.slots)        # round robin, so a freed buffer rests while the other fills
        order = [self.slots[(self.allocations + i) % count] for i in range(count)]
        slot = next((s for s in order if s.state == "free"), None)
        if slot is None:
            raise self._fault(f"alloc_tensor with all {len(self.slots)} buffer(s) in use: "
                              "free_tensor one before allocating the next tile")
        slot.state = "allocated"
        slot.tile = self.allocations
        self.allocations += 1
        self.context.tiles = max(self.context.tiles, slot.tile)
        return LocalTensor(slot, as_numpy_dtype(dtype))

    def enque(self, tensor: LocalTensor) -> None:
        """Hand `tensor` to the next stage (the stage that deques it waits for its data)."""
        tensor = self._own(tensor, "enque")
        if tensor.slot.state == "queued":
            raise self._fault("enque of a tensor already in the queue (enqueued twice without "
                              "a deque)", tensor.tile)
        if len(self.fifo) >= self.depth:
            raise self._fault(f"enque into a full queue (depth {self.depth})", tensor.tile)
        tensor.slot.state = "queued"
        self.fifo.append(tensor)

    def deque(self, dtype=None) -> LocalTensor:
        """The oldest tensor enqueued."""
        if not self.fifo:
            raise self._fault("deque on an empty queue: nothing was enqueued (or it was "
                              "dequeued already)")
        tensor = self.fifo.pop(0)
        tensor.slot.state = "allocated"
        if dtype is not None and as_numpy_dtype(dtype) != tensor.dtype:
            tensor = tensor.reinterpret_cast(dtype)
        return tensor

    def free_tensor(self, tensor: LocalTensor) -> None:
        """Give the tensor's buffer back for the next tile; the tensor is dead from now on."""
        tensor = self._own(tensor, "free_tensor")
        if tensor.slot.state == "queued":
            raise self._fault("free_tensor of a tensor still in the queue (deque it first)",
                              tensor.tile)
        tensor.slot.state = "free"
        tensor.slot.generation += 1

    def _own(self, tensor, what: str) -> LocalTensor:
        if not isinstance(tensor, LocalTensor):
            raise self._fault(f"{what} needs a LocalTensor, got {type(tensor).__name__}")
        if tensor.slot.owner is not self:
            raise self._fault(f"{what} of a tensor from {tensor.slot.describe()}, not from this "
                              "queue", tensor.tile)
        return tensor.live(f"{what}")


class TBuf(_Buffers):
    """Scratch space at `position` that never moves between stages (Ascend C's TBuf)."""

    kind = "tbuf"

    def get(self, dtype, size: int | None = None) -> LocalTensor:
        """The buffer as `size` elements of `dtype` (all of it by default)."""
        if not self.slots:
            raise self._fault("get before pipe.init_buffer gave this TBuf its bytes")
        return LocalTensor(self.slots[0], as_numpy_dtype(dtype), 0, size)

    def get_with_offset(self, size: int, offset_bytes: int, dtype) -> LocalTensor:
        dtype = as_numpy_dtype(dtype)
        if offset_bytes % dtype.itemsize:
            raise self._fault(f"get_with_offset: offset {offset_bytes} is not a multiple of the "
                              f"{dtype.itemsize}-byte element")
        return self.get(dtype)[offset_bytes // dtype.itemsize:offset_bytes // dtype.itemsize + size]


class TPipe:
    """A block's on-chip memory manager: gives queues and TBufs their buffers."""

    def __init__(self):
        self.context = current("TPipe")
        self.used: dict[str, int] = {}

    def init_buffer(self, target, num: int, length: int | None = None) -> None:
        """Give a TQue `num` buffers of `length` bytes, or a TBuf `num` bytes
        (init_buffer(tbuf, length))."""
        if isinstance(target, TBuf):
            num, length = 1, num if length is None else length
        elif not isinstance(target, TQue):
            raise self.context.fault(f"init_buffer needs a TQue or TBuf, got "
                                     f"{type(target).__name__}")
        if target.slots:
            raise self.context.fault("init_buffer called twice for one queue", target.describe())
        if num < 1 or length is None or length < 1:
            raise self.context.fault(f"init_buffer needs at least one buffer of at least one "
                                     f"byte, got {num} x {length}", target.describe())
        profile = self.context.profile
        physical = target.physical
        align = profile.alignment[physical]
        slot_bytes = align_up(length, max(LENGTH_ALIGN, align))
        start = align_up(self.used.get(physical, 0), align)
        end = start + num * slot_bytes
        capacity = profile.buffers[physical]
        if end > capacity:
            carved = self.context.carved.get(physical, [])
            held = "; already carved: " + ", ".join(f"{n} {b} bytes" for n, _, b in carved) \
                if carved else ""
            raise self.context.fault(
                f"init_buffer({num} x {length} bytes) needs {end - start} bytes of the "
                f"{physical}, but the {physical} holds {capacity} bytes on {profile.name} and "
                f"{capacity - start} are left{held}: the buffer does not fit; tile smaller",
                target.describe())
        target.slots = [Slot(target, i, start + i * slot_bytes, slot_bytes) for i in range(num)]
        if isinstance(target, TBuf):
            target.slots[0].state = "allocated"
        self.used[physical] = end
        self.context.carved.setdefault(physical, []).append((target.name, start, end - start))
