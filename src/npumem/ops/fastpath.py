"""The lean route of `a + b`, `a - b`, `a * b` and `a / b` (ops/arithmetic.py) for the common
case, with what the full route would do and nothing it would not.

The full route is: the result allocated from the pool on the current stream, phase 1 (a
remembered plan, ops/phase1_cache.py), a new executor and `launch` (its checks, the stream's
inline task), the kernel over views of the device bytes, `used_on` for every storage. When the
full route runs an elementwise operator whose plan is simple, `remember` keeps what its phase 1
decided, keyed as the phase-1 cache keys it (each operand's shape, strides, offset, dtype, format
and device, and whether they are one tensor). The next call with operands of that geometry
does the same steps directly: the same pool allocation, the same kernel with the same
attributes on the same kind of views, run at once on the current stream when it is idle
(`Stream.run_if_idle`, as the full route's submit), the same `used_on`. Results are the
kernel's, bit for bit.

A plan is simple when: both operands are plain `Tensor`s of one shape and one dtype, contiguous,
not empty, on the current device; the op needs no workspace (no dense copies, no scratch: an
Add or Sub of alpha 1) and no tiling (the AI core kernels).

Anything else takes the full route, which raises the errors it always raised: a busy stream
(queued work, an error waiting for synchronize), a profiler or tracker listening
(`OBSERVERS.active`: they see the full route's events), the pool sanitizer on (at either level:
it checks every use), a storage with a sanitizer record, a changed op registry, backend or
kernel choice (NPUMEM_SIM_KERNELS), a thread with no current context, a device pool not made
yet, and operand memory whose check does not hold: the views a call lays over device bytes are
reused only while nothing was released since they were made (`RELEASES`, the count of frees and
unmaps), as `launch` trusts ranges checked while the count stood still; when the count has
moved, the range is resolved again (the backend's bounds check) and a failure there takes the
full route, whose phase 1 reports it.
"""

from __future__ import annotations

import functools
import threading

from .. import memory as pool_api
from ..device.address_index import RELEASES
from ..device.sanitizer import SANITIZER
from ..errors import AclError
from ..observe import OBSERVERS
from ..runtime.handles import forget, new_handle
from ..runtime.state import RUNTIME
from ..runtime.stream import Stream
from .executor import KernelArgs, op_device_type
from .phase1_cache import PHASE1
from .registry import REGISTRY
from .tensor import Storage, Tensor, fresh_result, result_template

OPS = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div"}


class _Label:
    """A stream task's label, "Add (executor 0x...)" as launch writes it, made only when
    something reads it (an error message, a report of pending work)."""

    __slots__ = ("op", "text")

    def __init__(self, op: str):
        self.op, self.text = op, None

    def __str__(self) -> str:
        if self.text is None:
            handle = new_handle(self)       # a number no other object has, as an executor's
            forget(handle)
            self.text = f"{self.op} (executor 0x{handle:x})"
        return self.text

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    def __repr__(self) -> str:
        return repr(str(self))


class FastPlan:
    """What phase 1 decided for one geometry of operands, and the result it makes."""

    __slots__ = ("op", "kernel", "attrs", "generation", "backend",
                 "device_type", "device", "nbytes", "template", "views")

    def __init__(self, executor, out: Tensor):
        self.op = executor.op
        self.kernel = executor.impl.kernel
        self.attrs = executor.call.attrs
        self.generation = REGISTRY.generation
        self.backend = RUNTIME.backend
        self.device_type = op_device_type()
        self.device = out.storage.device
        self.nbytes = out.span()[1]
        # the full route's result, less its storage: what each new result is made of
        self.template = result_template(out)
        self.views: dict = {}            # result pointer -> (release count, kernel view)

    def current(self) -> bool:
        """Whether phase 1 would still choose this kernel: the same op registry, backend and
        kernel choice (NPUMEM_SIM_KERNELS)."""
        return self.generation == REGISTRY.generation and self.backend is RUNTIME.backend \
            and self.device_type == op_device_type()


class FastPlans:
    SIZE = 64          # plans kept (a plan holds no tensor: views of raw bytes only)
    VIEWS = 8          # result views kept per plan (the pool hands out a few blocks in turn)

    def __init__(self):
        self._plans: dict = {}
        self._lock = threading.Lock()
        self.runs = 0                    # calls the lean route served (for tests and reports)

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()

    def remember(self, op: str, left, right, out: Tensor, planned) -> None:
        """After the full route's phase 1 for `left op right` into `out`: keep its plan when it
        is simple (see the module docstring)."""
        size, executor = planned
        if size or type(left) is not Tensor or type(right) is not Tensor or \
                type(out) is not Tensor or executor.call is None or \
                executor.impl.tiling is not None or \
                left.shape != right.shape or left.dtype != right.dtype or \
                out.shape != left.shape or out.dtype != left.dtype or \
                not left._span[1] or not left.is_contiguous() or not right.is_contiguous() or \
                not left.storage.device == right.storage.device == out.storage.device:
            return
        key = (op, left._geometry, right._geometry, left is right)
        known = self._plans.get(key)
        if known is not None and known.current():
            return                        # the same plan (the full route ran for another reason)
        plan = FastPlan(executor, out)
        with self._lock:
            if len(self._plans) >= self.SIZE:
                self._plans.clear()
            self._plans[key] = plan

    def run(self, op: str, left: Tensor, right: Tensor):
        """`left op right` by the lean route: (the result, None); or (None, the result
        allocated already, or None) when the full route must do it (see the module
        docstring)."""
        plan = self._plans.get((op, left._geometry, right._geometry, left is right))
        if plan is None or OBSERVERS.active or SANITIZER.on or \
                left.storage.record is not None or right.storage.record is not None or \
                not plan.current():
            return None, None
        found = pool_api.current_pool_and_stream()
        if found is None:
            return None, None
        pool, stream = found
        if pool.device != plan.device or type(stream) is not Stream or stream.destroyed:
            return None, None
        # The result, as `result()` makes it (an allocation failure raises as there).
        nbytes = plan.nbytes
        pointer = pool.allocate(nbytes, stream)
        out = fresh_result(Storage(pointer, nbytes, pool.device, pool=pool), plan.template)
        # The views, after the allocation (which may release cached memory): reused while
        # nothing was released since they were made, else made again (resolve checks them).
        epoch = RELEASES.value
        backend = plan.backend
        x = _view(backend, left, epoch, plan.op)
        y = _view(backend, right, epoch, plan.op)
        cached = plan.views.get(pointer)
        if cached is not None and cached[0] == epoch:
            out._kernel_view = cached
            z = cached[1]
        else:
            z = _view(backend, out, epoch, plan.op)
            if z is not None:
                if len(plan.views) >= self.VIEWS:
                    plan.views = {}           # a new dict: another thread may read the old one
                plan.views[pointer] = out._kernel_view
        if x is None or y is None or z is None:
            return None, out
        # run at once on an idle stream, as the full route's submit would; else the full route
        # queues it (an idle stream has no kernel fault pending: nothing to skip)
        task = functools.partial(plan.kernel, KernelArgs({"self": x, "other": y}, {"out": z},
                                                         plan.attrs, {}))
        if not stream.run_if_idle(task, _Label(plan.op)):
            return None, out
        # as launch ends: the storages are used on the stream. The result's block was
        # allocated on it: the pool's record_stream of its own stream records nothing.
        storage = left.storage
        if stream not in storage.streams:
            storage.used_on(stream)
        storage = right.storage
        if stream not in storage.streams:
            storage.used_on(stream)
        out.storage.streams.add(stream)
        PHASE1.hits += 1                 # a remembered phase 1, as the full route's
        self.runs += 1
        return out, None


def _view(backend, tensor: Tensor, epoch: int, op: str):
    """The kernel's view of `tensor` (cached on it while no release happened since it was
    made), or None when its range does not resolve (the full route reports it)."""
    cached = tensor._kernel_view
    if cached is not None and cached[0] == epoch:
        return cached[1]
    try:
        rng = backend.resolve(*tensor._span, f"{op} operand")
        array = tensor._strided(backend.kernel_view(rng, f"{op} operand"))
    except AclError:
        return None
    tensor._kernel_view = (epoch, array)
    return array


FAST = FastPlans()
# A device's release (reset_device, finalize) drops the plans: their views must not keep the
# released memory, nor the plans its backend.
RUNTIME.device_release_hooks.append(lambda device: FAST.clear())
