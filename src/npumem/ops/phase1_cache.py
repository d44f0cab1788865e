"""Phase 1 remembered: a call repeated with the same tensor objects and scalars reuses the plan
its first call made, so a small op in a loop pays the argument checks once.

Tensors never change their geometry (shape, strides, offset and dtype are fixed at creation), so
the same objects mean the same checks would pass again. What can change is whether their memory
is still live: every hit checks that again, and a failing check falls back to a full phase 1,
which raises the error it always raised. A change to the operator registry or another backend
makes every remembered plan stale.
"""

from __future__ import annotations

import collections
import functools
import threading
import weakref

from ..runtime.state import RUNTIME
from ..device.address_index import RELEASES
from .executor import Executor, OpCall, op_device_type, still_valid, unchanged_since
from .registry import REGISTRY
from .tensor import Scalar, Tensor

_PLAIN = (int, float, bool, str, type(None))


class _Entry:
    """What a plan needs besides the tensors, which it never holds: an entry must not keep
    tensors (and their pool blocks) alive, so it names them by their place in the arguments
    and goes away with the first of them."""

    def __init__(self, executor: Executor, places: dict[int, int]):
        call = executor.call
        self.op, self.attrs, self.dense_inputs, self.views = \
            call.op, call.attrs, call.dense_inputs, call.views
        self.inputs = {name: places[id(t)] for name, t in call.inputs.items()}
        self.outputs = {name: places[id(t)] for name, t in call.outputs.items()}
        self.impl, self.plan, self.ranges = executor.impl, executor.plan, executor.ranges
        self.epoch = executor.epoch
        self.generation = REGISTRY.generation
        self.backend = RUNTIME.backend
        self.device_type = op_device_type()

    def executor(self, objects: list) -> Executor | None:
        """A new executor for the same arguments, or None when the plan no longer holds."""
        if self.generation != REGISTRY.generation or self.backend is not RUNTIME.backend or \
                self.device_type != op_device_type():
            return None
        call = OpCall(self.op, {name: objects[i] for name, i in self.inputs.items()},
                      {name: objects[i] for name, i in self.outputs.items()}, self.attrs,
                      self.dense_inputs, self.views)
        if not unchanged_since(self.epoch):
            epoch = RELEASES.value
            for role, tensor in call.tensors():
                record = tensor.storage.record
                rng = self.ranges.get(role)
                if (record is not None and not record.live) or rng is None or \
                        not still_valid(rng, *tensor.span()):
                    return None
            self.epoch = epoch
        return Executor(call, self.impl, self.plan, self.ranges, self.epoch)


class Phase1Cache:
    """Remembers up to SIZE plans, keyed by the phase-1 function and its arguments (tensors and
    Scalars by identity, plain values by type and value)."""

    SIZE = 256

    def __init__(self):
        self._entries: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def cached(self, phase1):
        """Wrap a `*_get_workspace_size` function whose result depends only on its arguments'
        geometry and values (not on the bytes in device memory)."""
        @functools.wraps(phase1)
        def remembered(*args, **kwargs):
            key, objects = _key(phase1, args, kwargs)
            if key is None:
                return phase1(*args, **kwargs)
            with self._lock:
                entry = self._entries.get(key)
            executor = entry.executor(objects) if entry is not None else None
            if executor is not None:
                self.hits += 1
                return executor.workspace_size, executor
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
        for obj in objects:               # ids are reused once an object dies
            weakref.finalize(obj, self._forget, key, entry)

    def _forget(self, key, entry) -> None:
        with self._lock:
            if self._entries.get(key) is entry:
                del self._entries[key]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


def _key(phase1, args, kwargs):
    """(key, objects compared by identity), or (None, None) for arguments it cannot key."""
    parts, by_identity = [phase1, tuple(sorted(kwargs))], []
    for value in (*args, *(kwargs[name] for name in sorted(kwargs))):
        if isinstance(value, (Tensor, Scalar)):
            parts.append(id(value))
            by_identity.append(value)
        elif isinstance(value, _PLAIN) or (isinstance(value, (tuple, list)) and
                                           all(isinstance(v, int) for v in value)):
            parts.append((type(value), tuple(value) if isinstance(value, list) else value))
        else:
            try:
                parts.append((type(value), value, hash(value)))
            except TypeError:
                return None, None
    return tuple(parts), by_identity


PHASE1 = Phase1Cache()
