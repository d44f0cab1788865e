"""Built-in kernels: numpy over views of host-visible device memory (the simulator).

Each kernel writes its outputs in place and uses only the scratch regions its `scratch` function
declared, so the workspace phase 1 reports is what the kernel really needs. Float16 inputs are
accumulated in float32 (matmul, reductions, softmax), as NPU cube/vector units do.
"""

from __future__ import annotations

import numpy as np

from ..constants import DataType
from ..dtypes import from_bf16_bits, to_bf16_bits
from .registry import register_op

HOST_VISIBLE = ("sim",)


def accumulator(dtype: np.dtype) -> np.dtype:
    """The dtype reductions accumulate in."""
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def _nbytes(shape, dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _is_half(call) -> bool:
    return call.inputs["self"].dtype == DataType.FLOAT16


# --- elementwise ----------------------------------------------------------------------------


def _scaled_other(call) -> dict[str, int]:
    """Add/Sub with alpha != 1 keep alpha * other as an intermediate (out may alias an input)."""
    if call.attrs["alpha"] == 1:
        return {}
    return {"alpha * other": _nbytes(call.inputs["other"].shape, call.attrs["compute"])}


def _alpha_other(args) -> np.ndarray:
    other = args.inputs["other"]
    if "alpha * other" not in args.scratch:
        return other
    scaled = args.buffer("alpha * other", other.shape, args.attrs["compute"])
    np.multiply(other, args.attrs["alpha"], out=scaled, casting="unsafe")
    return scaled


@register_op("Add", device_types=HOST_VISIBLE, scratch=_scaled_other, name="numpy_add")
def add_kernel(args) -> None:
    np.add(args.inputs["self"], _alpha_other(args), out=args.outputs["out"], casting="unsafe")


@register_op("Sub", device_types=HOST_VISIBLE, scratch=_scaled_other, name="numpy_sub")
def sub_kernel(args) -> None:
    np.subtract(args.inputs["self"], _alpha_other(args), out=args.outputs["out"], casting="unsafe")


@register_op("Mul", device_types=HOST_VISIBLE, name="numpy_mul")
def mul_kernel(args) -> None:
    np.multiply(args.inputs["self"], args.inputs["other"], out=args.outputs["out"], casting="unsafe")


@register_op("Div", device_types=HOST_VISIBLE, name="numpy_div")
def div_kernel(args) -> None:
    with np.errstate(divide="ignore", invalid="ignore"):   # inf / nan, as the hardware gives
        np.true_divide(args.inputs["self"], args.inputs["other"], out=args.outputs["out"],
                       casting="unsafe")


@register_op("Fill", device_types=HOST_VISIBLE, name="numpy_fill")
def fill_kernel(args) -> None:
    args.outputs["self"][...] = args.attrs["value"]


@register_op("Contiguous", device_types=HOST_VISIBLE, name="numpy_contiguous")
def contiguous_kernel(args) -> None:
    np.copyto(args.outputs["out"], args.inputs["self"])


@register_op("Transpose", device_types=HOST_VISIBLE, name="numpy_transpose")
def transpose_kernel(args) -> None:
    np.copyto(args.outputs["out"], args.inputs["self"].transpose(args.attrs["perm"]))


# --- cast (bf16 is converted bit by bit: numpy has no bfloat16) ----------------------------


@register_op("Cast", device_types=HOST_VISIBLE, name="numpy_cast")
def cast_kernel(args) -> None:
    source, out = args.inputs["self"], args.outputs["out"]
    if args.attrs["from_bf16"]:
        source = from_bf16_bits(source)
    if args.attrs["to_bf16"]:
        out[...] = to_bf16_bits(source)
    else:
        np.copyto(out, source, casting="unsafe")


# --- matmul ---------------------------------------------------------------------------------


def _matmul_scratch(call) -> dict[str, int]:
    if not _is_half(call):
        return {}
    return {"float32 accumulator": _nbytes(call.outputs["out"].shape, np.float32)}


@register_op("MatMul", device_types=HOST_VISIBLE, scratch=_matmul_scratch, name="numpy_matmul")
def matmul_kernel(args) -> None:
    left, right, out = args.inputs["self"], args.inputs["mat2"], args.outputs["out"]
    if "float32 accumulator" in args.scratch:
        acc = args.buffer("float32 accumulator", out.shape, np.float32)
        np.matmul(left, right, out=acc, dtype=np.float32)
        np.copyto(out, acc, casting="unsafe")
    else:
        np.matmul(left, right, out=out)


# --- reductions -----------------------------------------------------------------------------


def _reduce_scratch(call) -> dict[str, int]:
    if not _is_half(call):
        return {}
    return {"accumulator": _nbytes(call.outputs["out"].shape, np.float32)}


def _reduce(args, reduce) -> None:
    x, out = args.inputs["self"], args.outputs["out"]
    axes, keep = args.attrs["dims"], args.attrs["keep_dims"]
    if "accumulator" in args.scratch:
        acc = args.buffer("accumulator", out.shape, np.float32)
        reduce(x, axis=axes, keepdims=keep, dtype=np.float32, out=acc)
        np.copyto(out, acc, casting="unsafe")
    else:
        reduce(x, axis=axes, keepdims=keep, dtype=out.dtype, out=out)


@register_op("ReduceSum", device_types=HOST_VISIBLE, scratch=_reduce_scratch, name="numpy_sum")
def reduce_sum_kernel(args) -> None:
    _reduce(args, np.sum)


@register_op("Mean", device_types=HOST_VISIBLE, scratch=_reduce_scratch, name="numpy_mean")
def mean_kernel(args) -> None:
    _reduce(args, np.mean)


# --- softmax --------------------------------------------------------------------------------


def _softmax_scratch(call) -> dict[str, int]:
    x, dim = call.inputs["self"], call.attrs["dim"]
    rows = [1 if i == dim else d for i, d in enumerate(x.shape)]
    acc = accumulator(np.dtype(call.attrs["compute"]))
    return {"row max": _nbytes(rows, acc), "row sum": _nbytes(rows, acc)}


@register_op("Softmax", device_types=HOST_VISIBLE, scratch=_softmax_scratch, name="numpy_softmax")
def softmax_kernel(args) -> None:
    x, out, dim = args.inputs["self"], args.outputs["out"], args.attrs["dim"]
    acc = accumulator(x.dtype)
    rows = [1 if i == dim else d for i, d in enumerate(x.shape)]
    row_max = args.buffer("row max", rows, acc)
    row_sum = args.buffer("row sum", rows, acc)
    np.max(x, axis=dim, keepdims=True, out=row_max)
    np.subtract(x, row_max, out=out, casting="unsafe")
    np.exp(out, out=out)
    np.sum(out, axis=dim, keepdims=True, dtype=acc, out=row_sum)
    np.divide(out, row_sum, out=out, casting="unsafe")
