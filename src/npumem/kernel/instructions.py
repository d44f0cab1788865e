"""The instructions a kernel issues: data movement, vector and cube operations.

Each one does its work at once on the real bytes (global memory through the launch's argument
views, local tensors in the core's buffers) and charges its unit in the block's timeline with
the cost model. Operands are checked as the hardware would trip on them: a local tensor used
after free_tensor, an element count past a tensor's end, an operand in the wrong buffer, a
data_copy whose length is not a whole number of 32-byte blocks.
"""

from __future__ import annotations

import builtins        # max, min and abs are instructions here, as in Ascend C

import numpy as np

from ..aicore.cost import cube_cycles, transfer_cycles, vector_cycles
from .context import current
from .tensors import GlobalTensor, LocalTensor

BLOCK = 32           # DataCopy moves whole 32-byte data blocks
L0_BLOCK = 512       # L0A / L0B hold whole 512-byte fractals

_VECTOR_BUFFERS = ("UB",)


def _count(tensor, count) -> int:
    return len(tensor) if count is None else int(count)


def _check_blocks(context, nbytes: int, unit: int, what: str, tensor: LocalTensor) -> None:
    if nbytes % unit:
        raise context.fault(
            f"{what}: unaligned data_copy of {nbytes} bytes, not a whole number of {unit}-byte "
            f"blocks ({nbytes % unit} bytes over); copy {nbytes - nbytes % unit} or "
            f"{nbytes - nbytes % unit + unit} bytes, or use data_copy_pad for a tail",
            tensor.slot.describe(), tensor.tile)


def data_copy(dst, src, count: int | None = None) -> None:
    """Copy `count` elements from `src` to `dst` (Ascend C's DataCopy): global memory to UB/L1
    on MTE2, UB to global memory (and L0C out) on MTE3, L1 to L0A/L0B on MTE1, UB to UB on the
    Vector unit. The length must be whole 32-byte blocks (512-byte fractals into L0)."""
    _copy("data_copy", dst, src, count, pad=False)


def data_copy_pad(dst, src, count: int) -> None:
    """data_copy for a tail that is not whole 32-byte blocks (Ascend C's DataCopyPad): moves
    exactly `count` elements to or from global memory, charging the padded blocks."""
    _copy("data_copy_pad", dst, src, count, pad=True)


def _copy(what: str, dst, src, count, pad: bool) -> None:
    if isinstance(dst, LocalTensor) and isinstance(src, LocalTensor):
        return _local_copy(current(what), what, dst, src, _count(dst, count))
    count = _count(dst if isinstance(dst, LocalTensor) else src, count)
    _global_transfer(what, dst, src, 1, count, None, None, pad)       # one row of `count`


def data_copy_rows(dst, src, rows: int, row: int, src_stride: int | None = None,
                   dst_stride: int | None = None, pad: bool = False) -> None:
    """Copy `rows` rows of `row` elements from global memory into the UB or L1, or out of the
    UB or L0C (the fixpipe, converting float32 results to the output's dtype), the rows
    `src_stride` / `dst_stride` elements apart on each side (default: packed); Ascend C's
    DataCopy with DataCopyParams. Each row pays its own bursts. `pad=True` allows rows that
    are not whole 32-byte blocks (DataCopyPad)."""
    _global_transfer("data_copy_rows", dst, src, rows, row, src_stride, dst_stride, pad)


def _global_transfer(what: str, dst, src, rows: int, row: int, src_stride, dst_stride,
                     pad: bool) -> None:
    """Rows between global memory and a local tensor: MTE2 in (UB, L1), MTE3 out (UB, L0C
    through the fixpipe). Strides are in elements of each side's own dtype."""
    context = current(what)
    inbound = isinstance(dst, LocalTensor) and isinstance(src, GlobalTensor)
    if not inbound and not (isinstance(dst, GlobalTensor) and isinstance(src, LocalTensor)):
        raise context.fault(f"{what} copies between a LocalTensor and a GlobalTensor (or two "
                            f"LocalTensors), got {type(dst).__name__} <- {type(src).__name__}")
    local, gm = (dst, src) if inbound else (src, dst)
    allowed = ("UB", "L1") if inbound else ("UB", "L0C")
    if local.buffer not in allowed:
        raise context.fault(f"{what}: global memory moves {'into' if inbound else 'out of'} "
                            f"the {' or '.join(allowed)}, not the {local.buffer}",
                            local.slot.describe(), local.tile)
    gm_stride = (src_stride if inbound else dst_stride) or row
    local_stride = (dst_stride if inbound else src_stride) or row
    size, gm_size = local.dtype.itemsize, gm.dtype.itemsize
    if not pad:
        _check_blocks(context, row * size, BLOCK, what, local)
    if rows <= 0 or row <= 0:
        return
    span = (rows - 1) * gm_stride + row
    device = np.lib.stride_tricks.as_strided(gm.elements(0, span, what), (rows, row),
                                             (gm_stride * gm_size, gm_size))
    values = np.lib.stride_tricks.as_strided(local.array(what, (rows - 1) * local_stride + row),
                                             (rows, row), (local_stride * size, size))
    lane = "MTE2" if inbound else "MTE3"
    cycles = transfer_cycles(context.profile.engines[lane], row * gm_size, gm.address, rows,
                             gm_stride * gm_size)
    nbytes = rows * row * gm_size                # what crosses to global memory
    if inbound:
        np.copyto(values, device, casting="unsafe")
        context.issue(lane, cycles, what, writes=[local.slot], nbytes=nbytes, tile=local.tile,
                      after=context.gm_written.get(gm.argument.name, 0.0))
    else:
        np.copyto(device, values, casting="unsafe")
        context.gm_written[gm.argument.name] = context.issue(
            lane, cycles, what, reads=[local.slot], nbytes=nbytes, tile=local.tile)


def _local_copy(context, what: str, dst: LocalTensor, src: LocalTensor, count: int) -> None:
    nbytes = count * src.dtype.itemsize
    if (src.buffer, dst.buffer) in (("L1", "L0A"), ("L1", "L0B")):
        _check_blocks(context, nbytes, L0_BLOCK, what, dst)
        lane, cycles = "MTE1", transfer_cycles(context.profile.engines["MTE1"], nbytes)
    elif src.buffer == dst.buffer == "UB":
        _check_blocks(context, nbytes, BLOCK, what, dst)
        lane, cycles = "Vector", vector_cycles(context.profile, nbytes)
    else:
        raise context.fault(f"{what}: no path from the {src.buffer} to the {dst.buffer} (L1 goes "
                            "to L0A/L0B, the UB to the UB or global memory)",
                            dst.slot.describe(), dst.tile)
    np.copyto(dst.array(what, count), src.array(what, count), casting="unsafe")
    context.issue(lane, cycles, what, reads=[src.slot], writes=[dst.slot], nbytes=nbytes,
                  tile=dst.tile)


# --- vector unit --------------------------------------------------------------------------


def _vector(what: str, dst: LocalTensor, sources, count, compute, dst_count=None) -> None:
    """One Vector instruction over `count` elements of each operand (`dst_count` of dst: 1 for
    a reduction)."""
    context = current(what)
    count = _count(dst if not sources else sources[0], count)
    for tensor in (dst, *sources):
        if not isinstance(tensor, LocalTensor):
            raise context.fault(f"{what}: vector operands are LocalTensors in the UB, got "
                                f"{type(tensor).__name__}")
        if tensor.buffer not in _VECTOR_BUFFERS:
            raise context.fault(f"{what}: the Vector unit works on the UB, not the "
                                f"{tensor.buffer}", tensor.slot.describe(), tensor.tile)
    arrays = [tensor.array(what, count) for tensor in sources]
    compute(dst.array(what, count if dst_count is None else dst_count), *arrays)
    nbytes = count * builtins.max(t.dtype.itemsize for t in (dst, *sources))
    context.issue("Vector", vector_cycles(context.profile, nbytes), what,
                  reads=[t.slot for t in sources], writes=[dst.slot], nbytes=nbytes,
                  tile=dst.tile)


def _binary(ufunc):
    name = ufunc.__name__

    def instruction(dst: LocalTensor, src0: LocalTensor, src1: LocalTensor,
                    count: int | None = None) -> None:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            _vector(name, dst, (src0, src1), count,
                    lambda out, a, b: ufunc(a, b, out=out, casting="unsafe"))
    instruction.__name__ = name
    instruction.__doc__ = f"dst = {name}(src0, src1) over `count` elements."
    return instruction


def _with_scalar(ufunc, name: str):
    def instruction(dst: LocalTensor, src: LocalTensor, scalar, count: int | None = None) -> None:
        with np.errstate(over="ignore", invalid="ignore"):
            _vector(name, dst, (src,), count,
                    lambda out, a: ufunc(a, scalar, out=out, casting="unsafe"))
    instruction.__name__ = name
    instruction.__doc__ = (f"dst = {ufunc.__name__}(src, scalar) over `count` elements; the "
                           "scalar keeps its own type and the result is rounded into dst, as "
                           "numpy does (so results match the whole-array kernels).")
    return instruction


def _unary(ufunc, name: str):
    def instruction(dst: LocalTensor, src: LocalTensor, count: int | None = None) -> None:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            _vector(name, dst, (src,), count, lambda out, a: ufunc(a, out=out, casting="unsafe"))
    instruction.__name__ = name
    instruction.__doc__ = f"dst = {ufunc.__name__}(src) over `count` elements."
    return instruction


add, sub, mul, div = (_binary(f) for f in (np.add, np.subtract, np.multiply, np.divide))
max, min = _binary(np.maximum), _binary(np.minimum)   # noqa: A001 - Ascend C's names
max.__name__, min.__name__ = "max", "min"
adds, muls = _with_scalar(np.add, "adds"), _with_scalar(np.multiply, "muls")
maxs, mins = _with_scalar(np.maximum, "maxs"), _with_scalar(np.minimum, "mins")
exp, ln, abs, sqrt = (_unary(f, n) for f, n in ((np.exp, "exp"), (np.log, "ln"),   # noqa: A001
                                                 (np.abs, "abs"), (np.sqrt, "sqrt")))


def relu(dst: LocalTensor, src: LocalTensor, count: int | None = None) -> None:
    _vector("relu", dst, (src,), count, lambda out, a: np.maximum(a, 0, out=out, casting="unsafe"))


def duplicate(dst: LocalTensor, scalar, count: int | None = None) -> None:
    """Fill `count` elements of dst with `scalar`."""
    _vector("duplicate", dst, (), count, lambda out: out.fill(scalar))


def cast(dst: LocalTensor, src: LocalTensor, count: int | None = None) -> None:
    """dst = src converted to dst's dtype."""
    _vector("cast", dst, (src,), count, lambda out, a: np.copyto(out, a, casting="unsafe"))


def reduce_max(dst: LocalTensor, src: LocalTensor, count: int | None = None) -> None:
    """dst[0] = the largest of `count` elements of src."""
    _vector("reduce_max", dst, (src,), count,
            lambda out, a: out.__setitem__(0, np.max(a)), dst_count=1)


def reduce_sum(dst: LocalTensor, src: LocalTensor, count: int | None = None) -> None:
    """dst[0] = the sum of `count` elements of src (accumulated in dst's dtype)."""
    _vector("reduce_sum", dst, (src,), count,
            lambda out, a: out.__setitem__(0, np.sum(a, dtype=out.dtype)), dst_count=1)


# --- cube unit ----------------------------------------------------------------------------


def mmad(dst: LocalTensor, a: LocalTensor, b: LocalTensor, m: int, k: int, n: int,
         accumulate: bool = False) -> None:
    """dst (m x n, in L0C) = a (m x k, in L0A) @ b (k x n, in L0B), plus dst when accumulate.
    Operands are row-major here; the hardware's fractal layout is the cost model's concern."""
    context = current("mmad")
    for tensor, buffer, role in ((a, "L0A", "a"), (b, "L0B", "b"), (dst, "L0C", "dst")):
        if not isinstance(tensor, LocalTensor) or tensor.buffer != buffer:
            where = tensor.buffer if isinstance(tensor, LocalTensor) else type(tensor).__name__
            raise context.fault(f"mmad: {role} must be a LocalTensor in the {buffer}, got "
                                f"{where}")
    left = a.array("mmad", m * k).reshape(m, k)
    right = b.array("mmad", k * n).reshape(k, n)
    out = dst.array("mmad", m * n).reshape(m, n)
    if accumulate:
        out += np.matmul(left, right, dtype=out.dtype)
    else:
        np.matmul(left, right, out=out, dtype=out.dtype)
    context.issue("Cube", cube_cycles(context.profile, m, k, n, a.dtype.itemsize), "mmad",
                  reads=[a.slot, b.slot] + ([dst.slot] if accumulate else []),
                  writes=[dst.slot], nbytes=(m * k + k * n) * a.dtype.itemsize, tile=dst.tile)
