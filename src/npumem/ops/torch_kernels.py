"""Built-in kernels for the torch backend: torch ops over views of device memory.

They compute what the numpy kernels compute (inputs converted to the op's compute dtype, results
cast into `out`), on whatever device the memory is on, and ask for the same scratch: phase 1
reports the same workspace on every backend, and the intermediates live in it. Converted inputs
and elementwise results are torch temporaries (as a vendor library keeps its own).
"""

from __future__ import annotations

from .kernels import _matmul_scratch, _reduce_scratch, _scaled_other, _softmax_scratch, accumulator
from .registry import register_op
from .views import torch_dtype

TORCH_DEVICES = ("torch:cpu", "torch:cuda", "torch:npu")


def _torch():
    import torch
    return torch


def _python(value):
    """A numpy scalar as the Python number torch wants for alpha and fill values."""
    return value.item() if hasattr(value, "item") else value


def _inputs(args, *names):
    compute = torch_dtype(args.attrs["compute"])
    return [args.inputs[name].to(compute) for name in names]


def _register(op: str, name: str, scratch=None):
    return register_op(op, device_types=TORCH_DEVICES, scratch=scratch, name=name)


def _alpha_other(args, other):
    """alpha * other in its scratch region (out may alias an input), or other when alpha is 1."""
    if "alpha * other" not in args.scratch:
        return other
    scaled = args.buffer("alpha * other", other.shape, args.attrs["compute"])
    _torch().mul(other, _python(args.attrs["alpha"]), out=scaled)
    return scaled


def _store(out, op, *operands) -> None:
    """op(*operands) written to `out`: straight into it when the dtypes match, else cast."""
    if out.dtype == operands[0].dtype:
        try:
            op(*operands, out=out)
            return
        except RuntimeError:          # out partly overlaps an input: through a temporary
            pass
    out.copy_(op(*operands))


@_register("Add", "torch_add", _scaled_other)
def add_kernel(args) -> None:
    x, y = _inputs(args, "self", "other")
    _store(args.outputs["out"], _torch().add, x, _alpha_other(args, y))


@_register("Sub", "torch_sub", _scaled_other)
def sub_kernel(args) -> None:
    x, y = _inputs(args, "self", "other")
    _store(args.outputs["out"], _torch().sub, x, _alpha_other(args, y))


@_register("Mul", "torch_mul")
def mul_kernel(args) -> None:
    _store(args.outputs["out"], _torch().mul, *_inputs(args, "self", "other"))


@_register("Div", "torch_div")
def div_kernel(args) -> None:
    x, y = _inputs(args, "self", "other")
    if not x.is_floating_point():           # true division of integers is float64, as in numpy
        x, y = x.double(), y.double()
    _store(args.outputs["out"], _torch().div, x, y)


@_register("Fill", "torch_fill")
def fill_kernel(args) -> None:
    args.outputs["self"].fill_(_python(args.attrs["value"]))


@_register("Contiguous", "torch_contiguous")
def contiguous_kernel(args) -> None:
    args.outputs["out"].copy_(args.inputs["self"])


@_register("Transpose", "torch_transpose")
def transpose_kernel(args) -> None:
    args.outputs["out"].copy_(args.inputs["self"].permute(args.attrs["perm"]))


@_register("Cast", "torch_cast")
def cast_kernel(args) -> None:
    args.outputs["out"].copy_(args.inputs["self"])        # bf16 views are real bfloat16 here


@_register("MatMul", "torch_matmul", _matmul_scratch)
def matmul_kernel(args) -> None:
    left, right, out = args.inputs["self"], args.inputs["mat2"], args.outputs["out"]
    if "float32 accumulator" in args.scratch:
        acc = args.buffer("float32 accumulator", out.shape, "float32")
        _torch().matmul(left.float(), right.float(), out=acc)
        out.copy_(acc)
    else:
        _torch().matmul(left, right, out=out)


def _reduce(args, reduce) -> None:
    x, out = args.inputs["self"], args.outputs["out"]
    dims, keep = list(args.attrs["dims"]), args.attrs["keep_dims"]
    if not dims:                                          # a 0-d tensor reduces to itself
        out.copy_(x)
    elif "accumulator" in args.scratch:                   # float16 accumulates in float32
        acc = args.buffer("accumulator", out.shape, "float32")
        reduce(x, dim=dims, keepdim=keep, dtype=_torch().float32, out=acc)
        out.copy_(acc)
    else:
        out.copy_(reduce(x.to(torch_dtype(args.attrs["compute"])), dim=dims, keepdim=keep))


@_register("ReduceSum", "torch_sum", _reduce_scratch)
def reduce_sum_kernel(args) -> None:
    _reduce(args, _torch().sum)


@_register("Mean", "torch_mean", _reduce_scratch)
def mean_kernel(args) -> None:
    _reduce(args, _torch().mean)


@_register("Softmax", "torch_softmax", _softmax_scratch)
def softmax_kernel(args) -> None:
    torch = _torch()
    x, out, dim = args.inputs["self"], args.outputs["out"], args.attrs["dim"]
    acc = accumulator(args.attrs["compute"])
    rows = [1 if i == dim else d for i, d in enumerate(x.shape)]
    row_max, row_sum = args.buffer("row max", rows, acc), args.buffer("row sum", rows, acc)
    wide = x.to(torch_dtype(acc))
    torch.amax(wide, dim=dim, keepdim=True, out=row_max)
    work = out if out.dtype == wide.dtype else torch.empty_like(wide)    # in place, as numpy's
    torch.sub(wide, row_max, out=work)
    work.exp_()
    torch.sum(work, dim=dim, keepdim=True, out=row_sum)
    work.div_(row_sum)
    if work is not out:
        out.copy_(work)
