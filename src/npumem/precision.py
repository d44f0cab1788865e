"""Precision checks: how far a result is from a reference, and where (seed 004's PrecisionDebugger).

    report = npumem.precision.compare(npu_out, cpu_reference)
    print(report)                         # max/mean abs and rel diff, the worst element, pass/fail
    npumem.precision.assert_close(npu_out, cpu_reference, rtol=1e-3)

Either side may be a numpy array (or anything `numpy.asarray` takes), an `npumem.Tensor` or a
torch tensor on any device. An element passes when |actual - expected| <= atol + rtol * |expected|
(torch.testing's rule); NaN equals NaN unless `equal_nan=False`, an infinity only itself. The
worst element is the one furthest outside its tolerance, not merely the largest difference, so a
report points at what actually failed. Default tolerances follow the less precise dtype.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .constants import DataType

# (rtol, atol) by dtype name, as torch.testing.assert_close uses them.
DEFAULT_TOLERANCES = {
    "float16": (1e-3, 1e-5), "bfloat16": (1.6e-2, 1e-5), "float32": (1.3e-6, 1e-5),
    "float64": (1e-7, 1e-7), "complex64": (1.3e-6, 1e-5), "complex128": (1e-7, 1e-7),
}


class PrecisionError(AssertionError):
    """`assert_close` failed; `.report` holds the numbers."""

    def __init__(self, report: "PrecisionReport"):
        super().__init__(report.format())
        self.report = report


@dataclasses.dataclass(frozen=True)
class PrecisionReport:
    shape: tuple[int, ...]
    actual_dtype: str
    expected_dtype: str
    rtol: float
    atol: float
    elements: int
    mismatched: int               # elements outside the tolerance (NaN/inf disagreements included)
    max_abs_diff: float
    mean_abs_diff: float
    max_rel_diff: float
    mean_rel_diff: float
    worst_index: tuple[int, ...] | None
    worst_actual: object
    worst_expected: object
    worst_ratio: float            # worst element's |diff| / its tolerance (> 1: fails)

    @property
    def passed(self) -> bool:
        return self.mismatched == 0

    def __bool__(self) -> bool:
        return self.passed

    def format(self) -> str:
        rule = f"|actual - expected| <= {self.atol:g} + {self.rtol:g} * |expected|"
        if self.passed:
            head = f"precision check passed: all {self.elements:,} elements within {rule}"
        else:
            share = 100.0 * self.mismatched / self.elements
            head = (f"precision check FAILED: {self.mismatched:,} of {self.elements:,} elements "
                    f"({share:.3g}%) outside {rule}")
        lines = [head,
                 f"  shape {self.shape}, actual {self.actual_dtype}, expected {self.expected_dtype}",
                 f"  max abs diff {self.max_abs_diff:.6g}   mean abs diff {self.mean_abs_diff:.6g}",
                 f"  max rel diff {self.max_rel_diff:.6g}   mean rel diff {self.mean_rel_diff:.6g}"]
        if self.worst_index is not None:
            where = "[" + ", ".join(map(str, self.worst_index)) + "]"
            how = (f"{self.worst_ratio:.3g}x its tolerance" if np.isfinite(self.worst_ratio)
                   else "no tolerance covers it")
            lines.append(f"  worst element {where}: actual {self.worst_actual!r}, expected "
                         f"{self.worst_expected!r} ({how})")
        return "\n".join(lines)

    __str__ = format


def to_numpy(value) -> np.ndarray:
    """A host numpy copy or view of an npumem tensor, a torch tensor or anything array-like."""
    from .dtypes import from_bf16_bits
    from .ops.tensor import Tensor

    if isinstance(value, Tensor):
        if value.dtype == DataType.BF16:          # its storage holds raw bf16 words
            return from_bf16_bits(value.numpy())
        return value.numpy()
    if hasattr(value, "detach") and hasattr(value, "cpu"):          # torch, without importing it
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":
            return value.float().numpy()
        return value.numpy()
    return np.asarray(value)


def _dtype_name(value, array: np.ndarray) -> str:
    """The input's own dtype name: bfloat16 (torch's or npumem's) stays bfloat16 though it
    compares as float32."""
    if getattr(value, "dtype", None) == DataType.BF16:      # an npumem bf16 tensor
        return "bfloat16"
    torch_name = str(getattr(value, "dtype", ""))
    return torch_name.removeprefix("torch.") if torch_name.startswith("torch.") else array.dtype.name


def default_tolerances(*dtype_names: str) -> tuple[float, float]:
    """The loosest (rtol, atol) among the dtypes; exact (0, 0) for integers and booleans."""
    known = [DEFAULT_TOLERANCES[name] for name in dtype_names if name in DEFAULT_TOLERANCES]
    if not known:
        return 0.0, 0.0
    return max(r for r, _ in known), max(a for _, a in known)


def compare(actual, expected, *, rtol: float | None = None, atol: float | None = None,
            equal_nan: bool = True) -> PrecisionReport:
    """Compare `actual` with the reference `expected` element by element."""
    a, e = to_numpy(actual), to_numpy(expected)
    if a.shape != e.shape:
        raise ValueError(f"cannot compare: actual has shape {a.shape}, expected {e.shape} "
                         f"({a.size} vs {e.size} elements)")
    names = _dtype_name(actual, a), _dtype_name(expected, e)
    default_rtol, default_atol = default_tolerances(*names)
    rtol = default_rtol if rtol is None else float(rtol)
    atol = default_atol if atol is None else float(atol)
    if rtol < 0 or atol < 0:
        raise ValueError(f"tolerances must be >= 0, got rtol={rtol}, atol={atol}")
    kind = np.complex128 if np.iscomplexobj(a) or np.iscomplexobj(e) else np.float64
    av, ev = a.astype(kind).ravel(), e.astype(kind).ravel()
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        diff = np.abs(av - ev)
        scale = np.abs(ev)
        same = (av == ev) | (np.isnan(av) & np.isnan(ev) if equal_nan else False)
        allowed = atol + rtol * scale
        ratio = np.where(same, 0.0, np.where(allowed > 0, diff / allowed, np.inf))
        ratio = np.where(np.isnan(ratio), np.inf, ratio)      # NaN vs a number, inf vs other inf
        rel = np.where(same, 0.0, np.where(scale > 0, diff / scale, np.inf))
    finite_diff = np.where(same, 0.0, diff)
    finite_diff = finite_diff[np.isfinite(finite_diff)]
    finite_rel = rel[np.isfinite(rel)]
    mismatched = int(np.count_nonzero(ratio > 1.0))
    worst = int(np.argmax(ratio)) if ratio.size else None
    return PrecisionReport(
        shape=tuple(a.shape), actual_dtype=names[0], expected_dtype=names[1], rtol=rtol,
        atol=atol, elements=int(a.size), mismatched=mismatched,
        max_abs_diff=float(finite_diff.max()) if finite_diff.size else 0.0,
        mean_abs_diff=float(finite_diff.mean()) if finite_diff.size else 0.0,
        max_rel_diff=float(finite_rel.max()) if finite_rel.size else 0.0,
        mean_rel_diff=float(finite_rel.mean()) if finite_rel.size else 0.0,
        worst_index=None if worst is None else tuple(int(i) for i in np.unravel_index(worst, a.shape)),
        worst_actual=None if worst is None else a.ravel()[worst].item(),
        worst_expected=None if worst is None else e.ravel()[worst].item(),
        worst_ratio=0.0 if worst is None else float(ratio[worst]),
    )


def assert_close(actual, expected, *, rtol: float | None = None, atol: float | None = None,
                 equal_nan: bool = True) -> PrecisionReport:
    """`compare`, raising PrecisionError (an AssertionError) with the report when it fails."""
    report = compare(actual, expected, rtol=rtol, atol=atol, equal_nan=equal_nan)
    if not report.passed:
        raise PrecisionError(report)
    return report
