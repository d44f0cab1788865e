"""Executors: what phase 1 (`*_get_workspace_size`) hands to phase 2 (`*(workspace, ...)`).

Phase 1 checks the arguments, picks the implementation and lays out the workspace: a contiguous
copy of every non-contiguous input the kernel needs dense, then the implementation's own scratch
regions (intermediates, reduction buffers), each starting on a 64-byte boundary, the total
rounded up to 64 bytes. Phase 2 checks the workspace and queues the kernel on the stream; the
kernel runs on the stream's worker over views of the device bytes.

An executor runs once and is then freed, unless `set_executor_repeatable` is called before its
first run; a repeatable one lives until `destroy_executor`.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import ExecutorError, OpNullptrError, OpParamError
from ..observe import OBSERVERS, emit_op
from ..runtime.handles import forget, new_handle
from ..constants import HUGE_PAGE_SIZE
from ..device.address_index import RELEASES
from ..device.sanitizer import SANITIZER
from ..runtime.state import RUNTIME
from ..runtime.stream import device_work
from ..units import align_up
from .registry import REGISTRY, OpImpl
from .tensor import Tensor, contiguous_strides
from .views import copy_into, region, typed_view

WORKSPACE_ALIGN = 64


@dataclass
class OpCall:
    """An op applied to tensors: what phase 1 validated."""

    op: str
    inputs: dict[str, Tensor]
    outputs: dict[str, Tensor]
    attrs: dict = field(default_factory=dict)
    dense_inputs: bool = True      # the kernel reads inputs as contiguous arrays
    # role -> (allocation, offset, array): the views the last run laid over device bytes,
    # reused by the next run over the same live allocation
    views: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        self._roles = [("input " + k, t) for k, t in self.inputs.items()] + \
            [("output " + k, t) for k, t in self.outputs.items()]

    def tensors(self) -> list[tuple[str, Tensor]]:
        """(role, tensor) for every input and output."""
        return self._roles


@dataclass
class WorkspacePlan:
    regions: dict[str, tuple[int, int]]    # name -> (offset, bytes)
    size: int

    @classmethod
    def build(cls, needs: dict[str, int]) -> "WorkspacePlan":
        regions, end = {}, 0
        for name, nbytes in needs.items():
            if nbytes > 0:
                offset = align_up(end, WORKSPACE_ALIGN)
                regions[name] = (offset, nbytes)
                end = offset + nbytes
        return cls(regions, align_up(end, WORKSPACE_ALIGN))


@dataclass
class KernelArgs:
    """What a kernel sees: views of device memory (numpy arrays, or torch tensors on the torch
    backend), attributes and scratch regions."""

    inputs: dict
    outputs: dict
    attrs: dict
    scratch: dict

    def buffer(self, name: str, shape, dtype):
        """Scratch region `name` typed as an array of `shape` and numpy `dtype`."""
        return region(self.scratch[name], shape, np.dtype(dtype))


class Executor:
    """aclOpExecutor: a planned op waiting for its workspace and stream."""

    def __init__(self, call: OpCall, impl: OpImpl, plan: WorkspacePlan, ranges: dict,
                 epoch: int):
        self.call, self.impl, self.plan = call, impl, plan
        self.ranges = ranges            # role -> the DeviceRange phase 1 resolved
        self.epoch = epoch              # RELEASES.value when they were checked
        self.op = call.op
        self.handle = new_handle(self)
        self.repeatable = False
        self.state = "planned"          # planned | launched | freed
        self.runs = 0
        self.touched: list[tuple] = []   # (role, address, bytes, allocation record) per range
        self._lock = threading.Lock()

    @property
    def workspace_size(self) -> int:
        return self.plan.size

    def __repr__(self) -> str:
        return (f"<npumem executor 0x{self.handle:x} {self.op} workspace {self.workspace_size} "
                f"bytes, {self.state}{', repeatable' if self.repeatable else ''}>")

    def check_usable(self, what: str) -> None:
        if self.state == "freed":
            reason = "was destroyed" if self.repeatable else \
                "already ran and single-use executors are freed by their run; call " \
                "set_executor_repeatable(executor) right after phase 1 to run it again"
            raise ExecutorError(f"{what}: {self!r} {reason}")

    def free(self) -> None:
        """Queued runs keep what they need; the executor stops pinning its tensors."""
        self.state = "freed"
        self.call = None
        forget(self.handle)


def plan(call: OpCall) -> tuple[int, Executor]:
    """Phase 1 common part: pick the implementation, lay out the workspace."""
    ranges = {}
    for role, tensor in call.tensors():
        if tensor is None:
            raise OpNullptrError(f"{call.op}: {role} is null")
        if not isinstance(tensor, Tensor):
            raise OpParamError(f"{call.op}: {role} must be an npumem.Tensor, got "
                               f"{type(tensor).__name__}")
        ranges[role] = RUNTIME.require().resolve(*tensor.span(), f"{call.op} {role}")  # live
    epoch = RELEASES.value
    first = next(iter(call.inputs.values()), None)     # (a tensor's truth is its len())
    if first is None:
        first = next(iter(call.outputs.values()))
    impl = REGISTRY.lookup(call.op, op_device_type(), first.dtype)
    if impl.tiling is not None:
        call.attrs["tiling"] = impl.tiling(call)
    needs = {}
    if call.dense_inputs:
        needs = {f"contiguous {name}": t.nbytes for name, t in call.inputs.items()
                 if not t.is_contiguous()}
    if impl.scratch is not None:
        needs.update(impl.scratch(call))
    layout = WorkspacePlan.build(needs)
    return layout.size, Executor(call, impl, layout, ranges, epoch)


SIM_KERNELS = ("numpy", "tiled")
# os.environ.get of a name that is not set raises and catches a KeyError inside (0.6 us, on
# every op): where CPython keeps the encoded mapping (os.environ._data) it is read there
_ENVIRON = getattr(os.environ, "_data", None)
_SIM_KERNELS_KEY = os.environ.encodekey("NPUMEM_SIM_KERNELS") if isinstance(_ENVIRON, dict) \
    else None


def op_device_type() -> str:
    """The device type kernels are chosen for: the backend's name, or "sim:aicore" on the
    simulator with NPUMEM_SIM_KERNELS=tiled (the built-in ops as tiled AI core kernels)."""
    backend = RUNTIME.backend.name
    if backend != "sim":
        return backend
    if _SIM_KERNELS_KEY is None:
        choice = os.environ.get("NPUMEM_SIM_KERNELS")
    else:
        choice = _ENVIRON.get(_SIM_KERNELS_KEY)
        choice = None if choice is None else os.environ.decodevalue(choice)
    if choice is None:
        return "sim"
    choice = choice.strip().lower() or "numpy"
    if choice not in SIM_KERNELS:
        raise OpParamError(f"NPUMEM_SIM_KERNELS={choice!r}: choose numpy (whole-array kernels, "
                           "the default) or tiled (the AI core model)")
    return "sim:aicore" if choice == "tiled" else "sim"


def set_executor_repeatable(executor: Executor) -> None:
    """Keep `executor` after it runs, so phase 2 can run it again (until destroy_executor)."""
    _check_executor(executor, "set_executor_repeatable")
    if executor.state != "planned":
        raise ExecutorError(f"set_executor_repeatable: {executor!r} already ran; call it right "
                            "after phase 1")
    executor.repeatable = True


def destroy_executor(executor: Executor) -> None:
    _check_executor(executor, "destroy_executor")
    executor.free()


def _check_executor(executor, what: str) -> None:
    if executor is None:
        raise ExecutorError(f"{what}: executor is null")
    if not isinstance(executor, Executor):
        raise ExecutorError(f"{what}: expected an executor from a *_get_workspace_size call, "
                            f"got {type(executor).__name__}")
    executor.check_usable(what)


def launch(op: str, workspace: int | None, workspace_size: int, executor: Executor,
           stream=None) -> None:
    """Phase 2 common part: check the workspace, queue the kernel on `stream`."""
    what = op
    _check_executor(executor, what)
    if executor.op != op:
        raise OpParamError(f"{what}: the executor was planned for {executor.op}")
    need = executor.workspace_size
    backend = RUNTIME.require()
    if unchanged_since(executor.epoch):       # nothing freed since phase 1 checked them
        ranges = executor.ranges
    else:
        ranges = {}
        for role, tensor in executor.call.tensors():     # freed since phase 1?
            tensor.storage.check_live(f"{op} {role}")
            span = tensor.span()
            rng = executor.ranges.get(role)
            ranges[role] = rng if rng is not None and still_valid(rng, *span) else \
                backend.resolve(*span, f"{op} {role}")
    if need:
        if not workspace:
            raise OpNullptrError(f"{what}: the op needs a {need}-byte workspace, got a null pointer")
        if workspace_size < need:
            raise OpParamError(f"{what}: workspace_size {workspace_size} is smaller than the "
                               f"{need} bytes phase 1 asked for")
        backend.resolve(workspace, need, f"{what} workspace")
    queue = RUNTIME.stream(stream, what)
    with executor._lock:
        executor.check_usable(what)
        call = executor.call
        executor.state = "launched"
        if not executor.repeatable:
            executor.free()
    launcher, epoch = threading.get_ident(), RELEASES.value

    def checked() -> dict | None:
        """The ranges just checked, while they still stand: run inline right after the
        checks, or nothing freed since."""
        return ranges if threading.get_ident() == launcher or unchanged_since(epoch) else None
    queue.submit(device_work(lambda: _run_observed(
                     executor, call, workspace if need else 0, queue, checked())),
                 f"{op} (executor 0x{executor.handle:x})")
    for _, tensor in call.tensors():
        tensor.storage.used_on(queue)


def _run_observed(executor: Executor, call: OpCall, workspace: int, stream, ranges) -> None:
    """`_run`, reported to profilers as an op slice on `stream` when one is listening."""
    if not OBSERVERS.active:
        return _run(executor, call, workspace, ranges)
    start = time.perf_counter_ns()
    try:
        _run(executor, call, workspace, ranges)
    finally:
        emit_op(call.op, stream.device, stream, start, time.perf_counter_ns())


def _run(executor: Executor, call: OpCall, workspace: int, checked: dict | None) -> None:
    """On the stream worker: views of the device bytes, dense copies, then the kernel.

    `checked` holds the tensors' ranges when they still stand as phase 2 checked them; without
    it each range is checked again, since memory may have been freed meanwhile."""
    backend = RUNTIME.backend
    touched = []

    known = executor.ranges if checked is None else checked

    def device_range(address: int, nbytes: int, role: str):
        rng = known.get(role)
        if rng is None or (checked is None and not still_valid(rng, address, nbytes)):
            rng = backend.resolve(address, nbytes, f"{call.op} {role}")
        touched.append((role, address, nbytes, rng.allocation))
        return rng

    def view(tensor: Tensor, role: str):
        tensor.storage.check_live(f"{call.op} {role}")
        address, nbytes = tensor.span()
        if not nbytes:                # nothing to touch: an empty view of the tensor's storage
            address, nbytes = tensor.storage.pointer, 0
        rng = device_range(address, nbytes, role)
        cached = call.views.get(role)
        if cached is not None and cached[0] is rng.allocation and cached[1] == rng.offset:
            return cached[2]
        array = tensor._strided(backend.kernel_view(rng, f"{call.op} {role}"))
        call.views[role] = (rng.allocation, rng.offset, array)
        return array

    scratch = {}
    if workspace:
        rng = device_range(workspace, executor.workspace_size, "workspace")
        raw = backend.kernel_view(rng, f"{call.op} workspace")
        scratch = {name: raw[offset:offset + nbytes]
                   for name, (offset, nbytes) in executor.plan.regions.items()}
    inputs = {}
    for name, tensor in call.inputs.items():
        array = view(tensor, "input " + name)
        dense_name = f"contiguous {name}"
        if dense_name in scratch:
            dense = typed_view(scratch[dense_name], tensor.dtype, tensor.shape,
                               contiguous_strides(tensor.shape))
            copy_into(dense, array)
            array = dense
        inputs[name] = array
    outputs = {name: view(tensor, "output " + name) for name, tensor in call.outputs.items()}
    executor.impl.kernel(KernelArgs(inputs, outputs, call.attrs, scratch))
    executor.touched = touched
    executor.runs += 1


def unchanged_since(epoch: int) -> bool:
    """No device bytes were released since `epoch` (and no sanitizer wants every use seen: at
    either level a launch checks its tensors' storages again, since a pool block's free
    releases no device bytes)."""
    return epoch == RELEASES.value and not SANITIZER.on


def still_valid(rng, address: int, nbytes: int) -> bool:
    """Whether a range resolved earlier still stands for `nbytes` at `address`: its allocation
    is live and, in a reservation, the pages under it are still mapped. Never with the full
    pool sanitizer, which checks each use against the pool's blocks (the free level relies on
    the storages' records instead, checked at each launch)."""
    if SANITIZER.on and SANITIZER.full:
        return False
    allocation, offset = rng.allocation, rng.offset
    if not (allocation.live and rng.nbytes == nbytes and allocation.start + offset == address):
        return False
    if allocation.api != "reserve":
        return True
    mapped = allocation.extra.get("mapped")
    if mapped is None or not nbytes:
        return mapped is not None
    first, last = offset // HUGE_PAGE_SIZE, (offset + nbytes - 1) // HUGE_PAGE_SIZE
    return mapped[first] == 1 if first == last else all(mapped[first:last + 1])
