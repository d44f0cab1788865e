"""Phase 1 remembered: a call repeated with arguments of the same geometry reuses the plan its
first call made, so a small op in a loop (c = a + b, a new c each time) pays the argument checks
once.

What phase 1 decides depends only on what the key holds: each tensor's shape, strides, storage
offset, dtype, format and device (fixed at creation), which arguments are the same tensor,
scalars' and plain arguments' exact values, the phase-1 function and its keywords; and, checked
by each hit, the registry generation, the backend and the device type (and the AI core profile
for tiled kernels). What can change between calls is the memory under the tensors: every hit
checks that each tensor's bytes are live and within bounds at its address now, and a failing
check falls back to a full phase 1, which raises the error it always raised.
"""

from __future__ import annotations

import collections
import functools
import os
import threading
import weakref

import numpy as np

from ..runtime.state import RUNTIME
from ..device.address_index import RELEASES
from ..device.backend import DeviceRange
from ..device.sanitizer import SANITIZER
from ..errors import AclError
from .executor import Executor, OpCall, op_device_type, still_valid
from .registry import REGISTRY
from .tensor import Scalar, Tensor

_PLAIN = (int, bool, str, type(None))
_TILING_ENV = ("NPUMEM_SIM_PROFILE", "NPUMEM_SIM_CORES")     # what tiling reads besides the call


def _tiling_env() -> tuple:
    return tuple(os.environ.get(name) for name in _TILING_ENV)


class _Entry:
    """A plan without its tensors: an entry must not keep tensors (and their pool blocks)
    alive, so it names them by their place in the arguments."""

    def __init__(self, executor: Executor, places: dict[int, int]):
        call = executor.call
        self.op, self.attrs, self.dense_inputs, self.views = \
            call.op, call.attrs, call.dense_inputs, call.views
        self.inputs = [(name, places[id(t)]) for name, t in call.inputs.items()]
        self.outputs = [(name, places[id(t)]) for name, t in call.outputs.items()]
        self.impl, self.plan = executor.impl, executor.plan
        self.last = _hints(executor.ranges)
        self.generation = REGISTRY.generation
        self.backend = RUNTIME.backend
        self.device_type = op_device_type()
        self.tiling_env = _tiling_env() if executor.impl.tiling is not None else None

    def executor(self, objects: list) -> Executor | None:
        """A new executor for these arguments, or None when the plan does not hold for them."""
        backend = RUNTIME.backend
        if self.generation != REGISTRY.generation or self.backend is not backend or \
                self.device_type != op_device_type() or \
                (self.tiling_env is not None and self.tiling_env != _tiling_env()):
            return None
        call = OpCall(self.op, {name: objects[i] for name, i in self.inputs},
                      {name: objects[i] for name, i in self.outputs}, self.attrs,
                      self.dense_inputs, self.views)
        epoch = RELEASES.value            # read first: a release during the checks shows later
        ranges = {}
        moved = False                     # a range outside the allocation hinted for its role
        for role, tensor in call.tensors():
            record = tensor.storage.record
            if record is not None and not record.live:
                return None
            hint = self.last.get(role)
            allocation = hint() if hint is not None else None
            rng = _checked_range(backend, allocation, *tensor.span(), self.op, role)
            if rng is None:
                return None
            ranges[role] = rng
            moved = moved or rng.allocation is not allocation
        if moved:
            self.last = _hints(ranges)
        return Executor(call, self.impl, self.plan, ranges, epoch)


def _hints(ranges: dict) -> dict:
    """role -> a weak reference to the allocation each range lay in: where to look first next
    time (a hint, not trusted), which must not keep the allocation, and a foreign buffer it
    maps (DLPack, create_tensor), alive."""
    return {role: weakref.ref(rng.allocation) for role, rng in ranges.items()}


def _checked_range(backend, allocation, address: int, nbytes: int, op: str, role: str):
    """The live range under [address, address + nbytes), or None where phase 1 would fail.
    Inside the allocation the last call used (a pool arena, say), liveness and mapped pages
    are all there is to check; elsewhere the backend's bounds check decides."""
    if allocation is not None and nbytes and not SANITIZER.on:
        start = allocation.start
        if start <= address and address + nbytes <= start + allocation.size:
            rng = DeviceRange(allocation, address - start, nbytes)
            if still_valid(rng, address, nbytes):
                return rng
    try:
        return backend.resolve(address, nbytes, f"{op} {role}")     # phase 1's check
    except AclError:
        return None


class Phase1Cache:
    """Remembers up to SIZE plans, keyed by the phase-1 function and its arguments' geometry
    and values (see the module docstring)."""

    SIZE = 256

    def __init__(self):
        self._entries: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def cached(self, phase1):
        """Wrap a `*_get_workspace_size` function whose result depends only on its arguments'
        geometry and values (not on the bytes in device memory, nor on their addresses)."""
        @functools.wraps(phase1)
        def remembered(*args, **kwargs):
            key, objects = _key(phase1, args, kwargs)
            if key is None:
                return phase1(*args, **kwargs)
            entry = self._entries.get(key)    # a dict read is atomic; writes take the lock
            executor = entry.executor(objects) if entry is not None else None
            if executor is not None:
                self.hits += 1
                return executor.plan.size, executor
            self.misses += 1
            size, executor = phase1(*args, **kwargs)
            self._remember(key, objects, executor)
            return size, executor
        return remembered

    def _remember(self, key, objects: list, executor: Executor) -> None:
        places = {id(obj): i for i, obj in enumerate(objects)}
        if any(id(t) not in places for _, t in executor.call.tensors()):
            return                        # phase 1 made tensors of its own: nothing to key
        entry = _Entry(executor, places)
        with self._lock:
            self._entries[key] = entry
            while len(self._entries) > self.SIZE:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


def _key(phase1, args, kwargs):
    """(key, the tensors in argument order), or (None, None) for arguments it cannot key."""
    parts, tensors = [phase1], []
    if kwargs:
        names = sorted(kwargs)
        parts.append(tuple(names))
        args = (*args, *(kwargs[name] for name in names))
    for value in args:
        kind = type(value)
        if kind is Tensor:
            parts.append(value._geometry)
            tensors.append(value)
        elif kind in _PLAIN:
            parts.append((kind, value))
        elif kind is float:               # exact bits: 0.0 and -0.0 are equal but plan apart
            parts.append((kind, value.hex()))
        elif kind is Scalar:
            parts.append((kind, value.dtype, value.value.tobytes()))
        elif isinstance(value, np.generic):
            parts.append((kind, value.tobytes()))
        elif kind in (tuple, list) and all(type(v) is int for v in value):
            parts.append((kind, tuple(value)))
        elif isinstance(value, Tensor):   # a subclass: plan it in full
            return None, None
        else:
            try:
                parts.append((kind, value, hash(value)))
            except TypeError:
                return None, None
    if len(tensors) > 1:                  # which arguments are one tensor: roles map to places
        ids = [id(t) for t in tensors]
        parts.append(tuple(map(ids.index, ids)))
    return tuple(parts), tensors


PHASE1 = Phase1Cache()
