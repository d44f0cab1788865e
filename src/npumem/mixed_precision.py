"""Mixed precision, per operator: which dtype to store and to compute in, and what it costs.

    scheduler = MixedPrecisionScheduler(policy="auto", max_error=1e-2)
    decision = scheduler.decide("MatMul", activations, weights)
    result = scheduler.run("MatMul", activations, weights)    # on the device, checked

`decide` looks at the inputs (largest finite magnitude, outliers, the share of values float16
would make subnormal) and at the operator's stability in the op registry:

- robust ops (elementwise) compute in the memory dtype (bfloat16: widened, rounded when stored);
- accumulating ops (MatMul, reductions) store in it and accumulate in float32;
- sensitive ops (Softmax) compute in float32.

The candidates, by bytes per element:

- **int8**: MatMul weights (the second input) only, one scale per output column;
- **float16**: refused where values pass 65504;
- **bfloat16**: float32's range, 8 bits of precision;
- **float32**.

`auto` takes the smallest whose expected error is within `max_error`. The expected error is
the relative RMS rounding error of the stored inputs — 2^-9 for bfloat16 and 2^-12 for float16
(half a unit in the last place, averaged), the quantisation noise for int8 — times 1.5 for an
accumulating op and 2 for a sensitive one. It is an estimate. `run` measures the real error
against a float32 reference with `npumem.precision.compare`.

`run` executes through the two-phase API on the current device:
1. the inputs are stored in the memory dtype (casts on the device; bfloat16 through aclnn Cast);
2. they are widened to float32 where the op accumulates or is sensitive;
3. int8 weights are dequantised on the device (Cast, then Mul by their scales).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import precision
from .errors import OpParamError
from .ops import REGISTRY, aclnn, empty, from_numpy
from .dtypes import as_data_type

POLICIES = ("float32", "bfloat16", "float16", "int8", "auto")
FLOAT16_MAX = 65504.0
FLOAT16_TINY = 6.103515625e-05          # below this float16 is subnormal: precision drops
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1}
UNIT_ERROR = {"float32": 2.0 ** -25, "bfloat16": 2.0 ** -9, "float16": 2.0 ** -12}
AMPLIFY = {"robust": 1.0, "accumulating": 1.5, "sensitive": 2.0}
OPS = ("Add", "Sub", "Mul", "Div", "MatMul", "Softmax", "ReduceSum", "Mean")


@dataclass(frozen=True)
class InputStats:
    """What the decision needs to know about one input."""

    elements: int
    max_abs: float               # largest finite magnitude
    rms: float
    non_finite: int              # NaN and inf values
    subnormal_share: float       # share of nonzero values below float16's normal range
    outlier_ratio: float         # max_abs / rms: how far the largest value is from the typical

    @classmethod
    def of(cls, array: np.ndarray) -> "InputStats":
        values = np.asarray(array, dtype=np.float64).ravel()
        finite = values[np.isfinite(values)]
        if finite.size == 0:
            return cls(values.size, 0.0, 0.0, values.size - finite.size, 0.0, 1.0)
        magnitude = np.abs(finite)
        nonzero = magnitude[magnitude > 0]
        rms = float(np.sqrt(np.mean(magnitude ** 2)))
        return cls(values.size, float(magnitude.max()), rms, values.size - finite.size,
                   float(np.mean(nonzero < FLOAT16_TINY)) if nonzero.size else 0.0,
                   float(magnitude.max() / rms) if rms else 1.0)


@dataclass(frozen=True)
class Decision:
    op: str
    compute_dtype: str
    memory_dtype: str            # of the inputs (for int8: the weights; activations bfloat16)
    expected_error: float        # relative RMS error, estimated
    bytes_saved: int             # input bytes saved against float32
    reason: str


@dataclass(frozen=True)
class MixedResult:
    output: np.ndarray           # float32, read back from the device
    decision: Decision
    report: precision.PrecisionReport   # against the float32 reference
    input_bytes: tuple[int, ...]  # device bytes of each input, as stored
    output_bytes: int            # device bytes of the output, as stored

    @property
    def stored_bytes(self) -> int:
        return sum(self.input_bytes)


def _host(value) -> np.ndarray:
    """A float32 numpy array of a numpy array, npumem Tensor or torch tensor."""
    return np.asarray(precision.to_numpy(value), dtype=np.float32)


class MixedPrecisionScheduler:
    """Per-op precision decisions under `policy` (POLICIES); `max_error` bounds `auto`."""

    def __init__(self, policy: str = "auto", max_error: float = 1e-2):
        self.policy = self._check_policy(policy)
        if not (isinstance(max_error, (int, float)) and 0 < max_error < 1):
            raise OpParamError(f"max_error must be a number in (0, 1), got {max_error!r}")
        self.max_error = float(max_error)

    @staticmethod
    def _check_policy(policy: str) -> str:
        if policy not in POLICIES:
            raise OpParamError(f"unknown precision policy {policy!r}; choose from "
                               f"{', '.join(POLICIES)}")
        return policy

    # --- deciding -------------------------------------------------------------------------

    def decide(self, op: str, *inputs, policy: str | None = None) -> Decision:
        """The dtypes for `op` on these inputs (numpy arrays, npumem or torch tensors)."""
        policy = self._check_policy(policy or self.policy)
        stability = REGISTRY.stability(op)
        if not inputs:
            raise OpParamError(f"decide({op!r}): give the op's inputs")
        arrays = [_host(value) for value in inputs]
        stats = [InputStats.of(array) for array in arrays]
        if any(s.elements == 0 for s in stats):
            return Decision(op, "float32", "float32", 0.0, 0,
                            "an input is empty: nothing to store, float32 kept")
        if any(s.non_finite for s in stats):
            count = sum(s.non_finite for s in stats)
            return Decision(op, "float32", "float32", 0.0, 0,
                            f"the inputs hold {count} NaN or infinite values: float32 kept, so a "
                            "lower precision neither hides nor adds them")
        largest = max(s.max_abs for s in stats)
        fp16_fits = largest <= FLOAT16_MAX / 2      # margin: a sum of two must not overflow
        int8_error = self._int8_error(op, arrays)
        order = {"float32": ["float32"], "bfloat16": ["bfloat16"], "float16": ["float16"],
                 "int8": ["int8", "bfloat16"],
                 "auto": ["int8", "float16", "bfloat16", "float32"]}[policy]
        refused = []
        for memory in order:
            if memory == "int8" and int8_error is None:
                refused.append("int8 is for MatMul weights only")
                continue
            if memory == "float16" and not fp16_fits:
                refused.append(f"float16 refused: values reach {largest:.4g}, past "
                               f"{FLOAT16_MAX / 2:.0f} (half of float16's 65504)")
                continue
            error = self._expected_error(memory, stability, stats, int8_error)
            if policy == "auto" and error > self.max_error and memory != "float32":
                refused.append(f"{memory}: expected error {error:.2g} > {self.max_error:g}")
                continue
            break
        else:                                         # an explicit float16 that cannot be
            memory = "bfloat16"                       # stored: bfloat16 has float32's range
            error = self._expected_error(memory, stability, stats, None)
        # robust ops compute in the stored type; bfloat16 elementwise math runs widened (as
        # hardware does it) and rounds once, when the result is stored
        compute = memory if stability == "robust" and memory in ("float16", "float32") else "float32"
        saved = sum(a.size for a in arrays) * 4 - self._stored_bytes(memory, arrays)
        how = f"computes in {compute}" if compute == memory else \
            f"stores {memory}, computes in {compute}"
        reason = f"{op} is {stability}: {how}; policy {policy}; largest |x| {largest:.4g}"
        if refused:
            reason += "; " + "; ".join(refused)
        return Decision(op, compute, memory, error, int(saved), reason)

    def _int8_error(self, op: str, arrays) -> float | None:
        """Relative RMS error of per-column int8 weights (MatMul's second input), or None."""
        if op != "MatMul" or len(arrays) != 2 or arrays[1].ndim != 2:
            return None
        weights = arrays[1]
        scales = np.abs(weights).max(axis=0) / 127
        rms = np.sqrt(np.mean(weights.astype(np.float64) ** 2))
        if rms == 0:
            return 0.0
        noise = np.sqrt(np.mean(scales ** 2) / 12)     # uniform rounding noise, per column scale
        return float(math.hypot(noise / rms, UNIT_ERROR["bfloat16"]))  # + bfloat16 activations

    @staticmethod
    def _expected_error(memory: str, stability: str, stats, int8_error) -> float:
        if memory == "int8":
            return int8_error * AMPLIFY[stability]
        unit = UNIT_ERROR[memory]
        if memory == "float16":       # subnormals keep fewer bits: count them at 2^-4
            share = max(s.subnormal_share for s in stats)
            unit = math.hypot(unit, share * 2.0 ** -4)
        return unit * AMPLIFY[stability]

    @staticmethod
    def _stored_bytes(memory: str, arrays) -> int:
        if memory == "int8":          # weights int8 + one float32 scale per column; rest bf16
            weights = arrays[1]
            return weights.size + 4 * weights.shape[1] + 2 * arrays[0].size
        return BYTES[memory] * sum(a.size for a in arrays)

    # --- running --------------------------------------------------------------------------

    def run(self, op: str, *inputs, policy: str | None = None, dim: int = -1,
            stream=None) -> MixedResult:
        """Execute `op` on the device at the decided precision; the output comes back as float32
        with its error against a float32 reference. `dim`: Softmax / ReduceSum / Mean axis."""
        if op not in OPS:
            raise OpParamError(f"run: {op!r} is not supported; run supports {', '.join(OPS)}")
        decision = self.decide(op, *inputs, policy=policy)
        arrays = [_host(value) for value in inputs]
        try:
            reference = _reference(op, arrays, dim)
        except (ValueError, IndexError) as error:     # shapes that do not fit the op
            shapes = ", ".join(str(array.shape) for array in arrays)
            raise OpParamError(f"run({op!r}): inputs of shapes {shapes} do not fit: {error}") from None
        stored, input_bytes = self._store(decision, arrays, stream)
        compute = decision.compute_dtype
        operands = [_as(tensor, compute, stream) for tensor in stored]
        out = empty(reference.shape, dtype=compute, stream=stream)
        _launch(op, operands, out, dim, stream)
        out = _as(out, "bfloat16" if decision.memory_dtype == "int8" else decision.memory_dtype,
                  stream)
        output = _host(out)
        # tolerance: 8x the expected error, relative to each element and to the output's scale
        tolerance = max(decision.expected_error * 8, 1e-6)
        scale = float(np.sqrt(np.mean(np.square(reference, dtype=np.float64)))) \
            if reference.size else 0.0
        report = precision.compare(output, reference, rtol=tolerance, atol=tolerance * scale + 1e-12)
        return MixedResult(output, decision, report, input_bytes, out.nbytes)

    def _store(self, decision: Decision, arrays, stream):
        """The inputs on the device in the memory dtype; (tensors, bytes each stores)."""
        if decision.memory_dtype == "int8":
            weights, weight_bytes = _dequantised(arrays[1], stream)
            activations = _as(from_numpy(arrays[0], stream), "bfloat16", stream)
            return [activations, weights], (activations.nbytes, weight_bytes)
        tensors = [_as(from_numpy(array, stream), decision.memory_dtype, stream) for array in arrays]
        return tensors, tuple(t.nbytes for t in tensors)


def _dequantised(weights: np.ndarray, stream):
    """Per-column int8 weights stored on the device and dequantised there: (float32 tensor,
    stored bytes: int8 values + float32 scales)."""
    scales = (np.abs(weights).max(axis=0) / 127).astype(np.float32)
    scales[scales == 0] = 1.0
    quantised = np.clip(np.rint(weights / scales), -127, 127).astype(np.int8)
    codes, scale_row = from_numpy(quantised, stream), from_numpy(scales.reshape(1, -1), stream)
    widened = _as(codes, "float32", stream)
    out = empty(weights.shape, dtype="float32", stream=stream)
    aclnn.run_with_pool_workspace(aclnn.mul, aclnn.mul_get_workspace_size(widened, scale_row, out),
                                  stream)
    return out, codes.nbytes + scale_row.nbytes


def _as(tensor, dtype: str, stream):
    """`tensor` in `dtype` (a device Cast when it differs)."""
    if tensor.dtype == as_data_type(dtype):
        return tensor
    out = empty(tensor.shape, dtype=dtype, stream=stream)
    aclnn.run_with_pool_workspace(aclnn.cast, aclnn.cast_get_workspace_size(tensor, dtype, out),
                                  stream)
    return out


def _launch(op: str, operands, out, dim: int, stream) -> None:
    if op == "MatMul":
        planned, run = aclnn.matmul_get_workspace_size(operands[0], operands[1], out), aclnn.matmul
    elif op in ("Add", "Sub"):
        planned = getattr(aclnn, f"{op.lower()}_get_workspace_size")(operands[0], operands[1], 1, out)
        run = getattr(aclnn, op.lower())
    elif op in ("Mul", "Div"):
        planned = getattr(aclnn, f"{op.lower()}_get_workspace_size")(operands[0], operands[1], out)
        run = getattr(aclnn, op.lower())
    elif op == "Softmax":
        planned, run = aclnn.softmax_get_workspace_size(operands[0], dim, out), aclnn.softmax
    else:
        name = "reduce_sum" if op == "ReduceSum" else "mean"
        planned = getattr(aclnn, f"{name}_get_workspace_size")(operands[0], [dim], False, None, out)
        run = getattr(aclnn, name)
    aclnn.run_with_pool_workspace(run, planned, stream)


def _reference(op: str, arrays, dim: int) -> np.ndarray:
    """`op` in float64, returned as float32: what the decision is measured against."""
    values = [array.astype(np.float64) for array in arrays]
    if op == "MatMul":
        result = values[0] @ values[1]
    elif op in ("Add", "Sub", "Mul", "Div"):
        result = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply,
                  "Div": np.divide}[op](values[0], values[1])
    elif op == "Softmax":
        shifted = np.exp(values[0] - values[0].max(axis=dim, keepdims=True))
        result = shifted / shifted.sum(axis=dim, keepdims=True)
    else:
        result = (np.sum if op == "ReduceSum" else np.mean)(values[0], axis=dim)
    return np.asarray(result, dtype=np.float32)
