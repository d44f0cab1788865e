"""The aclnn two-phase API in snake case (REFERENCE.md section 3).

    size, executor = aclnn.add_get_workspace_size(a, b, 1.0, out)    # phase 1: check, plan
    workspace = mem.caching_allocator_alloc(size) if size else None
    aclnn.add(workspace, size, executor, stream)                      # phase 2: queued, async

Every op has the pair `<op>_get_workspace_size(...)` and `<op>(workspace, workspace_size,
executor, stream)`. Errors carry the aclnn codes: 161001 (a null argument), 161002 (shapes,
dtypes, a too-small workspace), 561103 (an executor that is null, destroyed or already run).
"""

from __future__ import annotations

import operator

import numpy as np

from .. import memory as pool_api
from ..constants import DataType
from ..errors import OpNullptrError, OpParamError
from ..observe import tagged
from . import kernels, sparse, tiled_kernels, torch_kernels  # noqa: F401 - register kernels
from ..dtypes import as_data_type, computable
from .executor import Executor, OpCall, destroy_executor, launch, plan, set_executor_repeatable
from .phase1_cache import PHASE1
from .tensor import Scalar, Tensor, as_scalar

__all__ = ["destroy_executor", "run_with_pool_workspace", "set_executor_repeatable"]


def run_with_pool_workspace(run, planned: tuple[int, Executor], stream=None) -> int:
    """Phase 2 with the workspace phase 1 asked for taken from the caching pool on `stream`
    and given back right after queueing (stream-ordered: reused only after the op ran).

        aclnn.run_with_pool_workspace(aclnn.add, aclnn.add_get_workspace_size(a, b, 1, out), s)

    Returns the workspace size."""
    size, executor = planned
    workspace = None
    if size:
        with tagged(executor.op):       # profilers attribute the workspace to the op
            workspace = pool_api.caching_allocator_alloc(size, stream=stream)
    try:
        run(workspace, size, executor, stream)
    finally:
        if workspace is not None:
            pool_api.caching_allocator_delete(workspace)
    return size


def _two_phase(op: str, name: str):
    """Define `name` (phase 2 of `op`) and export the pair."""
    def run(workspace: int | None, workspace_size: int, executor: Executor, stream=None) -> None:
        launch(op, workspace, workspace_size, executor, stream)
    run.__name__ = run.__qualname__ = name
    run.__doc__ = (f"Phase 2 of {op}: queue it on `stream` with the workspace phase 1 asked for "
                   f"(None when it asked for 0 bytes). Returns at once.")
    __all__.extend([f"{name}_get_workspace_size", name])
    return run


# --- argument checks ------------------------------------------------------------------------


def _tensor(op: str, value, role: str) -> Tensor:
    if value is None:
        raise OpNullptrError(f"{op}: {role} is null")
    if not isinstance(value, Tensor):
        raise OpParamError(f"{op}: {role} must be an npumem.Tensor, got {type(value).__name__}")
    return value


def _numeric(op: str, *tensors: Tensor) -> np.dtype:
    """The dtype the op computes in (numpy's promotion of the inputs)."""
    return np.result_type(*(computable(t.dtype, op) for t in tensors))


def _broadcast(op: str, *tensors: Tensor) -> tuple[int, ...]:
    try:
        return np.broadcast_shapes(*(t.shape for t in tensors))
    except ValueError:
        shapes = " and ".join(str(t.shape) for t in tensors)
        raise OpParamError(f"{op}: shapes {shapes} do not broadcast") from None


def _check_out(op: str, out: Tensor, shape, compute: np.dtype, role: str = "out") -> None:
    if tuple(out.shape) != tuple(shape):
        raise OpParamError(f"{op}: {role} has shape {out.shape}, the result has shape {tuple(shape)}")
    out_dtype = computable(out.dtype, op)
    if not np.can_cast(compute, out_dtype, "same_kind"):
        raise OpParamError(f"{op}: the result is {compute.name} and cannot be stored in a "
                           f"{out_dtype.name} {role}")


def _fits(value, dtype: np.dtype) -> bool:
    """Whether a scalar can be held by `dtype` without changing its value."""
    if dtype.kind == "f":
        return isinstance(value, (int, float, np.integer, np.floating, np.bool_))
    if dtype.kind == "b":
        return value in (0, 1)
    if float(value) != int(value):
        return False
    info = np.iinfo(dtype)
    return info.min <= int(value) <= info.max


def _dims(op: str, dims, ndim: int) -> tuple[int, ...]:
    dims = tuple(range(ndim)) if dims is None else \
        (dims,) if isinstance(dims, int) else tuple(dims)
    normal = []
    for dim in dims:
        dim = operator.index(dim)
        if not -ndim <= dim < max(ndim, 1):
            raise OpParamError(f"{op}: dim {dim} is out of range for a {ndim}-d tensor")
        normal.append(dim % max(ndim, 1))
    if len(set(normal)) != len(normal):
        raise OpParamError(f"{op}: dims {dims} repeat a dimension")
    return tuple(sorted(normal))


# --- elementwise ----------------------------------------------------------------------------


def _binary(op: str, self, other, out, alpha=None) -> tuple[int, Executor]:
    self, other, out = (_tensor(op, v, r) for v, r in ((self, "self"), (other, "other"), (out, "out")))
    compute = _numeric(op, self, other)
    _check_out(op, out, _broadcast(op, self, other), np.dtype(np.float64) if op == "Div" and
               compute.kind in "iub" else compute)
    attrs = {"compute": compute}
    if alpha is not None:
        alpha = as_scalar(alpha)
        if not _fits(alpha.value, compute):
            raise OpParamError(f"{op}: alpha {alpha.value!r} does not fit the {compute.name} inputs")
        attrs["alpha"] = alpha.value
    return plan(OpCall(op, {"self": self, "other": other}, {"out": out}, attrs))


@PHASE1.cached
def add_get_workspace_size(self: Tensor, other: Tensor, alpha: Scalar | float, out: Tensor):
    """out = self + alpha * other (broadcasting); returns (workspace_size, executor)."""
    return _binary("Add", self, other, out, alpha)


@PHASE1.cached
def sub_get_workspace_size(self: Tensor, other: Tensor, alpha: Scalar | float, out: Tensor):
    """out = self - alpha * other (broadcasting)."""
    return _binary("Sub", self, other, out, alpha)


@PHASE1.cached
def mul_get_workspace_size(self: Tensor, other: Tensor, out: Tensor):
    """out = self * other (broadcasting)."""
    return _binary("Mul", self, other, out)


@PHASE1.cached
def div_get_workspace_size(self: Tensor, other: Tensor, out: Tensor):
    """out = self / other (true division; integers give a float result)."""
    return _binary("Div", self, other, out)


add = _two_phase("Add", "add")
sub = _two_phase("Sub", "sub")
mul = _two_phase("Mul", "mul")
div = _two_phase("Div", "div")


@PHASE1.cached
def fill_get_workspace_size(self: Tensor, value: Scalar | float):
    """Set every element of `self` to `value` (aclnnInplaceFillScalar)."""
    self = _tensor("Fill", self, "self")
    dtype = computable(self.dtype, "Fill")
    value = as_scalar(value).value
    if not _fits(value, dtype):
        raise OpParamError(f"Fill: value {value!r} does not fit a {dtype.name} tensor")
    return plan(OpCall("Fill", {}, {"self": self}, {"value": value}))


fill = _two_phase("Fill", "fill")


# --- layout ---------------------------------------------------------------------------------


def _same_storage_type(op: str, self: Tensor, out: Tensor) -> None:
    if self.dtype != out.dtype:
        raise OpParamError(f"{op}: out is {out.dtype.name.lower()}, self is "
                           f"{self.dtype.name.lower()}; use cast to convert")


@PHASE1.cached
def contiguous_get_workspace_size(self: Tensor, out: Tensor):
    """Copy a (strided) view into the contiguous tensor `out`."""
    self, out = _tensor("Contiguous", self, "self"), _tensor("Contiguous", out, "out")
    _same_storage_type("Contiguous", self, out)
    if out.shape != self.shape:
        raise OpParamError(f"Contiguous: out has shape {out.shape}, self has {self.shape}")
    return plan(OpCall("Contiguous", {"self": self}, {"out": out}, dense_inputs=False))


@PHASE1.cached
def transpose_get_workspace_size(self: Tensor, perm, out: Tensor):
    """out = self with its dimensions reordered by `perm`, materialised."""
    self, out = _tensor("Transpose", self, "self"), _tensor("Transpose", out, "out")
    _same_storage_type("Transpose", self, out)
    perm = tuple(operator.index(p) % max(self.ndim, 1) for p in perm)
    if sorted(perm) != list(range(self.ndim)):
        raise OpParamError(f"Transpose: perm {perm} is not a permutation of {self.ndim} dims")
    expected = tuple(self.shape[p] for p in perm)
    if out.shape != expected:
        raise OpParamError(f"Transpose: out has shape {out.shape}, the result has {expected}")
    return plan(OpCall("Transpose", {"self": self}, {"out": out}, {"perm": perm},
                       dense_inputs=False))


contiguous = _two_phase("Contiguous", "contiguous")
transpose = _two_phase("Transpose", "transpose")


@PHASE1.cached
def cast_get_workspace_size(self: Tensor, dtype, out: Tensor):
    """out = self converted to `dtype` (bf16 included)."""
    self, out = _tensor("Cast", self, "self"), _tensor("Cast", out, "out")
    dtype = as_data_type(dtype)
    if out.dtype != dtype:
        raise OpParamError(f"Cast: out is {out.dtype.name.lower()} but dtype is {dtype.name.lower()}")
    if out.shape != self.shape:
        raise OpParamError(f"Cast: out has shape {out.shape}, self has {self.shape}")
    attrs = {"from_bf16": self.dtype == DataType.BF16, "to_bf16": dtype == DataType.BF16}
    return plan(OpCall("Cast", {"self": self}, {"out": out}, attrs))


cast = _two_phase("Cast", "cast")


# --- matmul ---------------------------------------------------------------------------------


@PHASE1.cached
def matmul_get_workspace_size(self: Tensor, mat2: Tensor, out: Tensor, cube_math_type: int = 0):
    """out = self @ mat2: 2-D, or batched over broadcast leading dims (..., n, k) @ (..., k, m)."""
    op = "MatMul"
    self, mat2, out = _tensor(op, self, "self"), _tensor(op, mat2, "mat2"), _tensor(op, out, "out")
    for role, t in (("self", self), ("mat2", mat2)):
        if t.ndim < 2:
            raise OpParamError(f"{op}: {role} has shape {t.shape}; matmul needs at least 2 dims "
                               "(reshape vectors to (1, k) or (k, 1))")
    if not self.dtype == mat2.dtype == out.dtype:
        raise OpParamError(f"{op}: self, mat2 and out must share a dtype, got "
                           f"{self.dtype.name.lower()}, {mat2.dtype.name.lower()}, "
                           f"{out.dtype.name.lower()}")
    compute = _numeric(op, self, mat2)
    (n, k), (k2, m) = self.shape[-2:], mat2.shape[-2:]
    if k != k2:
        raise OpParamError(f"{op}: self {self.shape} and mat2 {mat2.shape} have inner dims "
                           f"{k} and {k2}")
    try:
        batch = np.broadcast_shapes(self.shape[:-2], mat2.shape[:-2])
    except ValueError:
        raise OpParamError(f"{op}: batch dims of {self.shape} and {mat2.shape} do not "
                           "broadcast") from None
    _check_out(op, out, (*batch, n, m), compute)
    return plan(OpCall(op, {"self": self, "mat2": mat2}, {"out": out},
                       {"cube_math_type": cube_math_type}))


matmul = _two_phase("MatMul", "matmul")


# --- reductions -----------------------------------------------------------------------------


def _reduction(op: str, self, dims, keep_dims: bool, dtype, out) -> tuple[int, Executor]:
    self, out = _tensor(op, self, "self"), _tensor(op, out, "out")
    compute = _numeric(op, self)
    axes = _dims(op, dims, self.ndim)
    shape = tuple(1 if i in axes else d for i, d in enumerate(self.shape)) if keep_dims else \
        tuple(d for i, d in enumerate(self.shape) if i not in axes)
    if dtype is not None and as_data_type(dtype) != out.dtype:
        raise OpParamError(f"{op}: dtype {as_data_type(dtype).name.lower()} differs from out's "
                           f"{out.dtype.name.lower()}")
    if op == "Mean" and compute.kind in "iub":
        compute = np.dtype(np.float64)
    _check_out(op, out, shape, compute)
    return plan(OpCall(op, {"self": self}, {"out": out},
                       {"dims": axes, "keep_dims": bool(keep_dims), "compute": compute}))


@PHASE1.cached
def reduce_sum_get_workspace_size(self: Tensor, dims, keep_dims: bool, dtype, out: Tensor):
    """out = sum of self over `dims` (None: all); float16 accumulates in float32 scratch."""
    return _reduction("ReduceSum", self, dims, keep_dims, dtype, out)


@PHASE1.cached
def mean_get_workspace_size(self: Tensor, dims, keep_dims: bool, dtype, out: Tensor):
    """out = mean of self over `dims` (None: all)."""
    return _reduction("Mean", self, dims, keep_dims, dtype, out)


reduce_sum = _two_phase("ReduceSum", "reduce_sum")
mean = _two_phase("Mean", "mean")


@PHASE1.cached
def softmax_get_workspace_size(self: Tensor, dim: int, out: Tensor):
    """out = softmax of self along `dim`; needs scratch for the row maxima and sums."""
    op = "Softmax"
    self, out = _tensor(op, self, "self"), _tensor(op, out, "out")
    compute = _numeric(op, self)
    if compute.kind != "f":
        raise OpParamError(f"{op}: needs a floating-point tensor, got {compute.name}")
    (axis,) = _dims(op, dim, self.ndim)
    _check_out(op, out, self.shape, compute)
    return plan(OpCall(op, {"self": self}, {"out": out}, {"dim": axis, "compute": compute}))


softmax = _two_phase("Softmax", "softmax")


# --- sparse matmul (its phase 1 reads the data, so it is never remembered) -----------------


def sparse_matmul_get_workspace_size(self: Tensor, mat2: Tensor, out: Tensor,
                                     block_size: int = sparse.DEFAULT_BLOCK):
    """out = self @ mat2 for a sparse `self`: phase 1 reads self, measures its element and tile
    densities, picks direct sparse, block-sparse or dense (ops/sparse.py) and sizes the
    workspace for the compressed form. The choice is `executor.call.attrs["sparsity"]`."""
    op = "SparseMatMul"
    self, mat2, out = _tensor(op, self, "self"), _tensor(op, mat2, "mat2"), _tensor(op, out, "out")
    sparse.check_operands(self, mat2, out)
    try:
        block_size = operator.index(block_size)
    except TypeError:
        block_size = 0
    if block_size < 1:
        raise OpParamError(f"{op}: block_size must be a positive whole number, got {block_size!r}")
    attrs = {"sparsity": sparse.analyse(sparse.read(self), block_size)}
    return plan(OpCall(op, {"self": self, "mat2": mat2}, {"out": out}, attrs))


sparse_matmul = _two_phase("SparseMatMul", "sparse_matmul")
