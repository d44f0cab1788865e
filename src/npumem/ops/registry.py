"""The operator registry: implementations per op name, chosen by device type, dtype and priority.

An implementation is a kernel plus the scratch memory it needs beyond its inputs and outputs.
Several may serve one op (a faster one for float16, one per device type); the matching one with
the highest priority wins. Two implementations of one op that could both match the same call at
the same priority would make dispatch ambiguous, so registering the second is an error unless
`override=True` (which replaces the first).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

from ..constants import DataType
from ..errors import OpParamError
from ..dtypes import as_data_type

ANY = "*"


@dataclass(frozen=True)
class OpImpl:
    """One implementation of an op."""

    op: str
    kernel: Callable                   # kernel(args: KernelArgs) -> None, runs on the stream
    scratch: Callable | None = None    # scratch(call) -> {region name: bytes}
    tiling: Callable | None = None     # tiling(call) -> the kernel's tiling, computed in phase 1
    device_types: tuple[str, ...] = (ANY,)
    dtypes: frozenset[DataType] | None = None   # None: every dtype
    priority: int = 0
    name: str = ""

    def matches(self, device_type: str, dtype: DataType) -> bool:
        """A refined device type ("sim:aicore") also takes its base type's ("sim") kernels."""
        base = device_type.partition(":")[0]
        return (ANY in self.device_types or device_type in self.device_types or
                base in self.device_types) and (self.dtypes is None or dtype in self.dtypes)

    def overlaps(self, other: "OpImpl") -> bool:
        devices = ANY in self.device_types or ANY in other.device_types or \
            bool(set(self.device_types) & set(other.device_types))
        dtypes = self.dtypes is None or other.dtypes is None or bool(self.dtypes & other.dtypes)
        return devices and dtypes and self.priority == other.priority

    def describe(self) -> str:
        dtypes = "all dtypes" if self.dtypes is None else \
            ",".join(sorted(d.name.lower() for d in self.dtypes))
        return (f"{self.op}/{self.name} (devices {','.join(self.device_types)}; {dtypes}; "
                f"priority {self.priority})")


STABILITY_LEVELS = {
    "robust": "rounding errors stay per element (elementwise ops, copies): may compute in a "
              "16-bit type",
    "accumulating": "sums many products or elements (MatMul, reductions): stores 16-bit, "
                    "accumulates in float32",
    "sensitive": "amplifies input errors (Softmax's exponent, normalisations): computes in float32",
}


class OpRegistry:
    def __init__(self):
        self._impls: dict[str, list[OpImpl]] = {}
        self._stability: dict[str, str] = {}
        self._lock = threading.Lock()
        self.generation = 0     # bumped on every change: plans made before it are stale

    def set_stability(self, op: str, level: str) -> None:
        """How `op` tolerates reduced precision (STABILITY_LEVELS), for the mixed-precision
        scheduler."""
        if level not in STABILITY_LEVELS:
            raise OpParamError(f"stability of {op!r} must be one of {', '.join(STABILITY_LEVELS)}, "
                               f"got {level!r}")
        with self._lock:
            self._stability[op] = level

    def stability(self, op: str) -> str:
        with self._lock:
            level = self._stability.get(op)
        if level is None:
            known = ", ".join(sorted(self._stability))
            raise OpParamError(f"op {op!r} has no recorded numerical stability; ops with one: "
                               f"{known} (REGISTRY.set_stability({op!r}, 'robust' | "
                               "'accumulating' | 'sensitive') records it)")
        return level

    def register(self, op: str, kernel: Callable, *, scratch: Callable | None = None,
                 tiling: Callable | None = None, device_types=(ANY,), dtypes=None,
                 priority: int = 0, name: str = "", override: bool = False) -> OpImpl:
        if not op or not isinstance(op, str):
            raise OpParamError(f"op name must be a non-empty string, got {op!r}")
        if not callable(kernel):
            raise OpParamError(f"{op}: kernel must be callable, got {type(kernel).__name__}")
        device_types = (device_types,) if isinstance(device_types, str) else tuple(device_types)
        impl = OpImpl(op, kernel, scratch, tiling, device_types,
                      None if dtypes is None else frozenset(as_data_type(d) for d in dtypes),
                      int(priority), name or getattr(kernel, "__name__", "kernel"))
        with self._lock:
            impls = self._impls.setdefault(op, [])
            clashes = [other for other in impls if other.overlaps(impl)]
            if clashes and not override:
                raise OpParamError(
                    f"op {op!r} already has {clashes[0].describe()}, which would serve the same "
                    f"calls as {impl.describe()}; pass override=True to replace it or use "
                    "another priority")
            impls[:] = [other for other in impls if other not in clashes] + [impl]
            self.generation += 1
        return impl

    def lookup(self, op: str, device_type: str, dtype: DataType) -> OpImpl:
        with self._lock:
            impls = list(self._impls.get(op, ()))
        if not impls:
            raise OpParamError(f"no op named {op!r}; registered ops: {', '.join(self.ops())}")
        matching = [impl for impl in impls if impl.matches(device_type, dtype)]
        if not matching:
            have = "; ".join(impl.describe() for impl in impls)
            raise OpParamError(f"{op} has no implementation for {dtype.name.lower()} on "
                               f"device type {device_type!r}; it has: {have}")
        return max(matching, key=lambda impl: impl.priority)

    def ops(self) -> list[str]:
        with self._lock:
            return sorted(op for op, impls in self._impls.items() if impls)

    def implementations(self, op: str | None = None) -> list[OpImpl]:
        with self._lock:
            ops = [op] if op is not None else sorted(self._impls)
            return [impl for name in ops for impl in self._impls.get(name, ())]

    def unregister(self, op: str, name: str) -> None:
        with self._lock:
            impls = self._impls.get(op, [])
            kept = [impl for impl in impls if impl.name != name]
            if len(kept) == len(impls):
                raise OpParamError(f"op {op!r} has no implementation named {name!r}")
            self._impls[op] = kept
            self.generation += 1


REGISTRY = OpRegistry()
for _op, _level in {"Add": "robust", "Sub": "robust", "Mul": "robust", "Div": "robust",
                    "Cast": "robust", "Contiguous": "robust", "Transpose": "robust",
                    "Fill": "robust", "MatMul": "accumulating", "ReduceSum": "accumulating",
                    "Mean": "accumulating", "Softmax": "sensitive"}.items():
    REGISTRY.set_stability(_op, _level)


def register_op(op: str, **options) -> Callable:
    """Decorator: `@register_op("Add", device_types=("sim",), dtypes=[...], priority=1)`."""
    def decorate(kernel: Callable) -> Callable:
        REGISTRY.register(op, kernel, **options)
        return kernel
    return decorate


def list_ops() -> list[str]:
    return REGISTRY.ops()
