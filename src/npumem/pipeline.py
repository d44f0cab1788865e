"""Copy/compute pipelining: host batches reach the device while the previous batch is computed.

    with npumem.pipeline.Prefetcher(batches, depth=2, compute_stream=stream) as device_batches:
        for x in device_batches:                    # npumem tensors, ready for `stream`
            aclnn.run_with_pool_workspace(aclnn.mul, aclnn.mul_get_workspace_size(x, x, out), stream)
    print(device_batches.stats())                   # copy, compute and stall time, hidden fraction

Each batch (a numpy array, or a tuple/list/dict of them) is staged into a pinned buffer from the
pinned host pool and copied to pool memory on a copy stream of its own, up to `depth` batches
ahead. The compute stream waits for a batch's copy event only when it reaches that batch, so
a copy runs while earlier batches are computed; the host thread never blocks on a copy. Pinned
buffers go back to their pool once their copy ran and device buffers are stream-ordered on the
compute stream, so both are reused batch after batch (the seeds' DMA pipeline).

Timing comes from events on the two streams: a batch's copy time is its copy stream span; the
exposed part is what was left of it when the compute stream became ready for the batch; the
hidden fraction is 1 - exposed / copy. `stall_ms` is how long the compute stream sat at the
wait, which also counts the wait task's own wake-up.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Iterable

import numpy as np

from . import memory as pool_api
from .constants import MemcpyKind
from .ops.tensor import Tensor, empty
from .dtypes import as_data_type
from .runtime import memory as rt_memory
from .runtime.state import RUNTIME
from .runtime.stream import Event


@dataclasses.dataclass(frozen=True)
class BatchTiming:
    copy_ms: float          # staging + host-to-device copy, on the copy stream
    exposed_ms: float       # copy time after the compute stream was ready for the batch
    stall_ms: float         # the compute stream idle at its wait (exposed copy + wake-up latency)
    compute_ms: float       # from the batch being ready to the compute stream asking for the next


@dataclasses.dataclass(frozen=True)
class PipelineStats:
    batches: int
    bytes: int
    copy_ms: float
    compute_ms: float
    exposed_ms: float
    stall_ms: float
    hidden_fraction: float           # 1 - exposed / copy over every batch
    steady_hidden_fraction: float    # the same after the first `depth` batches (pipeline fill)

    def format(self) -> str:
        return (f"{self.batches} batches, {self.bytes / 2**20:.1f} MiB: copy {self.copy_ms:.1f} ms, "
                f"compute {self.compute_ms:.1f} ms, {self.exposed_ms:.1f} ms of copy exposed; "
                f"{self.hidden_fraction:.1%} of copy time hidden "
                f"({self.steady_hidden_fraction:.1%} in steady state)")

    __str__ = format


def _hidden(timings: list[BatchTiming]) -> float:
    copy = sum(t.copy_ms for t in timings)
    exposed = sum(t.exposed_ms for t in timings)
    return 1.0 - exposed / copy if copy > 0 else 1.0


@dataclasses.dataclass
class _Staged:
    batch: object                     # the structure handed to the caller, tensors as leaves
    tensors: list[Tensor]
    copy_start: Event
    copy_done: Event
    ready: Event | None = None        # compute stream reached this batch (before the wait)
    started: Event | None = None      # compute stream got past the wait
    finished: Event | None = None     # compute stream asked for the next batch


class Prefetcher:
    """Iterate over host batches as device batches copied `depth` batches ahead."""

    def __init__(self, batches: Iterable, depth: int = 2, *, compute_stream=None,
                 copy_stream=None, device: int | None = None):
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be a positive integer (batches copied ahead), got {depth!r}")
        self.depth = depth
        self.device = device
        self.compute_stream = RUNTIME.stream(compute_stream, "Prefetcher compute stream")
        self._own_copy_stream = copy_stream is None
        self.copy_stream = (RUNTIME.create_stream() if copy_stream is None
                            else RUNTIME.stream(copy_stream, "Prefetcher copy stream"))
        self._source = iter(batches)
        self._exhausted = False
        self._ahead: collections.deque[_Staged] = collections.deque()
        self._current: _Staged | None = None
        self._unharvested: list[_Staged] = []
        self.timings: list[BatchTiming] = []
        self.bytes = 0                   # of the batches handed out
        self.closed = False

    # --- iteration -------------------------------------------------------------------------

    def __iter__(self) -> "Prefetcher":
        return self

    def __next__(self):
        if self.closed:
            raise StopIteration
        self._finish_current()
        self._fill()
        if not self._ahead:
            self.close()
            raise StopIteration
        staged = self._ahead.popleft()
        self.bytes += sum(t.nbytes for t in staged.tensors)
        compute = self.compute_stream
        staged.ready, staged.started = Event(), Event()
        staged.ready.record(compute)
        staged.copy_done.make_wait(compute)
        staged.started.record(compute)
        for tensor in staged.tensors:
            tensor.storage.used_on(compute)      # reuse only after the compute stream's work
        self._current = staged
        self._harvest()
        return staged.batch

    def _finish_current(self) -> None:
        if self._current is not None:
            self._current.finished = Event()
            self._current.finished.record(self.compute_stream)
            self._unharvested.append(self._current)
            self._current = None

    def _fill(self) -> None:
        while not self._exhausted and len(self._ahead) < self.depth:
            self._throttle()
            try:
                batch = next(self._source)
            except StopIteration:
                self._exhausted = True
                return
            self._ahead.append(self._stage(batch))

    def _throttle(self) -> None:
        """Keep the host at most one batch of compute ahead of the compute stream: without it a
        fast host would stage every batch at once and no buffer would ever be reused."""
        for staged in self._unharvested[:-1]:
            staged.finished.synchronize()
        self._harvest()

    def _stage(self, batch) -> _Staged:
        """Queue the copies of one host batch on the copy stream; returns at once."""
        stream, tensors = self.copy_stream, []
        start, done = Event(), Event()
        start.record(stream)
        device_batch = self._copy_leaves(batch, stream, tensors)
        done.record(stream)
        return _Staged(device_batch, tensors, start, done)

    def _copy_leaves(self, batch, stream, tensors: list):
        if isinstance(batch, dict):
            return {key: self._copy_leaves(value, stream, tensors) for key, value in batch.items()}
        if isinstance(batch, (tuple, list)):
            return type(batch)(self._copy_leaves(value, stream, tensors) for value in batch)
        if not isinstance(batch, np.ndarray):
            return batch                         # labels, ids and the like pass through
        array = np.ascontiguousarray(batch)
        tensor = empty(array.shape, as_data_type(array.dtype), stream=stream, device=self.device)
        tensors.append(tensor)
        if array.nbytes:
            pinned_pool = pool_api.host_pool()
            pinned = pinned_pool.allocate(array.nbytes)
            nbytes = array.nbytes
            stream.enqueue(lambda: rt_memory.memcpy(pinned, nbytes, array, nbytes,
                                                    MemcpyKind.HOST_TO_HOST),
                           f"stage {nbytes} bytes into pinned memory")
            rt_memory.memcpy_async(tensor.address, nbytes, pinned, nbytes,
                                   MemcpyKind.HOST_TO_DEVICE, stream)
            pinned_pool.free(pinned, stream)     # reusable once the copy ran
            tensor.storage.used_on(stream)
        return tensor

    # --- timing ----------------------------------------------------------------------------

    def _harvest(self) -> None:
        """Turn the events of batches whose work has run into timings (keeps memory bounded)."""
        keep = []
        for staged in self._unharvested:
            events = (staged.copy_start, staged.copy_done, staged.ready, staged.started,
                      staged.finished)
            if not all(event.query() for event in events):
                keep.append(staged)
                continue
            copy_ms = staged.copy_start.elapsed_ms(staged.copy_done)
            self.timings.append(BatchTiming(
                copy_ms=copy_ms,
                exposed_ms=min(max(staged.ready.elapsed_ms(staged.copy_done), 0.0), copy_ms),
                stall_ms=max(staged.ready.elapsed_ms(staged.started), 0.0),
                compute_ms=staged.started.elapsed_ms(staged.finished)))
            for event in events:
                event.destroy()
        self._unharvested = keep

    def stats(self) -> PipelineStats:
        """Timings of the batches handed out so far (waits for their work to finish)."""
        self._finish_current()
        for stream in (self.compute_stream, self.copy_stream):
            if not stream.destroyed:
                stream.synchronize()
        self._harvest()
        timings = self.timings
        return PipelineStats(
            batches=len(timings), bytes=self.bytes,
            copy_ms=sum(t.copy_ms for t in timings),
            compute_ms=sum(t.compute_ms for t in timings),
            exposed_ms=sum(t.exposed_ms for t in timings),
            stall_ms=sum(t.stall_ms for t in timings),
            hidden_fraction=_hidden(timings),
            steady_hidden_fraction=_hidden(timings[self.depth:]))

    # --- lifetime --------------------------------------------------------------------------

    def close(self) -> None:
        """Stop prefetching; batches copied ahead and not handed out are dropped."""
        if self.closed:
            return
        self._finish_current()
        self.copy_stream.synchronize()
        for staged in self._ahead:
            staged.copy_start.destroy()
            staged.copy_done.destroy()
        self._ahead.clear()
        self._harvest()
        if self._own_copy_stream:
            RUNTIME.destroy_stream(self.copy_stream)
        self.closed = True

    def __enter__(self) -> "Prefetcher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
