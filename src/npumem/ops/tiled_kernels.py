"""The built-in ops as tiled kernels on the simulated AI cores (NPUMEM_SIM_KERNELS=tiled).

Phase 1 computes each op's tiling on the host from the device profile's buffer sizes, as a CANN
tiling function does: how many blocks, which elements each block owns, how large a tile is so
that every queue's double buffers fit the UB (or L1/L0 for MatMul). Phase 2 runs the kernel
through `npumem.kernel`, tile by tile through real on-chip bytes, and its launch leaves a
per-core timeline. Results equal the whole-array numpy kernels: Add, Mul and Softmax bit for bit;
MatMul sums K in chunks as the Cube does, so float sums agree to rounding (exactly on
integer-valued data).

A call the tiled kernels do not cover (broadcasting, mixed dtypes, strided views, Softmax over a
dimension other than the last, batched MatMul) keeps the whole-array kernel; its tiling says why
(`executor.call.attrs["tiling"]`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..aicore.profile import current_profile
from ..constants import DataType
from ..kernel import (
    TBuf, TPipe, TPosition, TQue, adds, data_copy, data_copy_pad, data_copy_rows, div, duplicate,
    exp, get_block_idx, kernel, mmad, mul, muls, reduce_max, reduce_sum,
)
from ..kernel import add as vadd
from ..units import align_up
from . import kernels as whole
from .registry import register_op

AICORE = ("sim:aicore",)
BLOCK = 32
MIN_BLOCK_BYTES = 4096          # below this a block's work is not worth another core
VECTOR_TYPES = (DataType.FLOAT16, DataType.FLOAT, DataType.INT32)


@dataclass(frozen=True)
class Fallback:
    """The call runs the whole-array kernel, because `reason`."""

    reason: str


@dataclass(frozen=True)
class Tiling:
    """Elements [block * per_block, ...) of `total` per block, `tile` elements per tile."""

    total: int
    block_dim: int
    per_block: int
    tile: int

    def block_range(self, block: int) -> tuple[int, int]:
        start = block * self.per_block
        return start, max(0, min(self.per_block, self.total - start))


def _split(total: int, unit_bytes: int, itemsize: int, cores: int, tile: int) -> Tiling:
    """Share `total` units (elements or rows) among up to `cores` blocks, whole 32-byte pieces
    per block where the units are elements."""
    blocks = max(1, min(cores, total * unit_bytes // MIN_BLOCK_BYTES))
    granule = max(1, BLOCK // itemsize) if unit_bytes == itemsize else 1
    per_block = align_up(-(-total // blocks), granule)
    return Tiling(total, -(-total // per_block), per_block, max(1, min(tile, per_block)))


def _dense(*tensors) -> bool:
    return all(t.is_contiguous() for t in tensors)


# --- Add and Mul ------------------------------------------------------------------------


def elementwise_tiling(call):
    x, y, out = call.inputs["self"], call.inputs["other"], call.outputs["out"]
    if not x.shape == y.shape == out.shape:
        return Fallback("broadcasting")
    if not x.dtype == y.dtype == out.dtype or x.dtype not in VECTOR_TYPES:
        return Fallback("mixed or unsupported dtypes")
    if not _dense(x, y, out):
        return Fallback("strided views")
    profile = current_profile()
    itemsize = x.itemsize
    tile = profile.buffers["UB"] // (3 * 2) // BLOCK * BLOCK // itemsize   # 3 queues x 2 buffers
    return _split(x.numel(), itemsize, itemsize, profile.vector_cores, tile)


@kernel
def elementwise(x, y, z, op, alpha, tiling):
    """z = x op alpha*y over this block's elements, double buffered (the tiled Add/Mul)."""
    start, count = tiling.block_range(get_block_idx())
    dtype, tile = x.dtype, tiling.tile
    pipe = TPipe()
    in_x, in_y = TQue(TPosition.VECIN, 2, "in_self"), TQue(TPosition.VECIN, 2, "in_other")
    out_z = TQue(TPosition.VECOUT, 2, "out")
    for queue in (in_x, in_y, out_z):
        pipe.init_buffer(queue, 2, tile * dtype.itemsize)
    for first in range(start, start + count, tile):
        n = min(tile, start + count - first)
        copy = data_copy if n * dtype.itemsize % BLOCK == 0 else data_copy_pad
        a, b = in_x.alloc_tensor(dtype), in_y.alloc_tensor(dtype)
        copy(a, x[first:first + n], n)
        copy(b, y[first:first + n], n)
        in_x.enque(a)
        in_y.enque(b)
        a, b, c = in_x.deque(), in_y.deque(), out_z.alloc_tensor(dtype)
        if op == "Mul":
            mul(c, a, b, n)
        else:
            if alpha != 1:
                muls(b, b, alpha, n)
            vadd(c, a, b, n)
        out_z.enque(c)
        in_x.free_tensor(a)
        in_y.free_tensor(b)
        c = out_z.deque()
        copy(z[first:first + n], c, n)
        out_z.free_tensor(c)


def _run_elementwise(args, op: str, numpy_kernel) -> None:
    tiling = args.attrs["tiling"]
    if isinstance(tiling, Fallback):
        return numpy_kernel(args)
    flat = [a.reshape(-1) for a in (args.inputs["self"], args.inputs["other"],
                                    args.outputs["out"])]
    elementwise.run(tiling.block_dim, *flat, op, args.attrs.get("alpha", 1), tiling)


@register_op("Add", device_types=AICORE, tiling=elementwise_tiling,
             scratch=whole._scaled_other, priority=1, name="tiled_add")
def tiled_add(args) -> None:
    _run_elementwise(args, "Add", whole.add_kernel)


@register_op("Mul", device_types=AICORE, tiling=elementwise_tiling, priority=1,
             name="tiled_mul")
def tiled_mul(args) -> None:
    _run_elementwise(args, "Mul", whole.mul_kernel)


# --- Softmax ----------------------------------------------------------------------------


def softmax_tiling(call):
    x, out = call.inputs["self"], call.outputs["out"]
    if x.dtype != DataType.FLOAT or out.dtype != DataType.FLOAT:
        return Fallback("float32 only (float16 goes through float32 on the whole-array path)")
    if call.attrs["dim"] != x.ndim - 1 or not _dense(x, out):
        return Fallback("softmax over a dimension other than the last, or strided views")
    length = x.shape[-1] if x.ndim else 1
    row = align_up(length * 4, BLOCK)
    profile = current_profile()
    room = profile.buffers["UB"] - row - BLOCK          # the divisor row and one reduction slot
    rows = room // (2 * 2 * row)                        # in and out queues, double buffered
    if rows < 1 or not length:
        return Fallback(f"a row of {length} elements does not fit the UB twice over")
    return _split(x.numel() // length, length * 4, 4, profile.vector_cores, rows)


@kernel
def softmax_rows(x, z, length, tiling):
    """Softmax of each row of this block's rows: max, subtract, exp, sum, divide (whole rows
    in the UB)."""
    start, count = tiling.block_range(get_block_idx())
    dtype, tile, row = x.dtype, tiling.tile, align_up(length * 4, BLOCK) // 4
    pipe = TPipe()
    in_x, out_z = TQue(TPosition.VECIN, 2, "in_rows"), TQue(TPosition.VECOUT, 2, "out_rows")
    pipe.init_buffer(in_x, 2, tile * row * 4)
    pipe.init_buffer(out_z, 2, tile * row * 4)
    divisor, reduced = TBuf(TPosition.VECCALC, "divisor"), TBuf(TPosition.VECCALC, "reduced")
    pipe.init_buffer(divisor, row * 4)
    pipe.init_buffer(reduced, BLOCK)
    scalar, spread = reduced.get(dtype), divisor.get(dtype)
    padded = length * 4 % BLOCK != 0
    for first in range(start, start + count, tile):
        n = min(tile, start + count - first)
        a = in_x.alloc_tensor(dtype)
        data_copy_rows(a, x[first * length:(first + n) * length], n, length, length, row,
                       pad=padded)
        in_x.enque(a)
        a, c = in_x.deque(), out_z.alloc_tensor(dtype)
        for r in range(n):
            source, target = a[r * row:r * row + length], c[r * row:r * row + length]
            reduce_max(scalar, source, length)
            adds(target, source, -scalar.get_value(0), length)
            exp(target, target, length)
            reduce_sum(scalar, target, length)
            duplicate(spread, scalar.get_value(0), length)
            div(target, target, spread, length)
        out_z.enque(c)
        in_x.free_tensor(a)
        c = out_z.deque()
        data_copy_rows(z[first * length:(first + n) * length], c, n, length, row, length,
                       pad=padded)
        out_z.free_tensor(c)


@register_op("Softmax", device_types=AICORE, tiling=softmax_tiling,
             scratch=whole._softmax_scratch, priority=1, name="tiled_softmax")
def tiled_softmax(args) -> None:
    tiling = args.attrs["tiling"]
    if isinstance(tiling, Fallback):
        return whole.softmax_kernel(args)
    x, out = args.inputs["self"], args.outputs["out"]
    softmax_rows.run(tiling.block_dim, x.reshape(-1), out.reshape(-1), x.shape[-1], tiling)


# --- MatMul -----------------------------------------------------------------------------


@dataclass(frozen=True)
class MatmulTiling:
    m: int
    k: int
    n: int
    base_m: int
    base_k: int
    base_n: int
    block_dim: int

    @property
    def tiles(self) -> list[tuple[int, int]]:
        return [(i, j) for i in range(0, self.m, self.base_m) for j in range(0, self.n, self.base_n)]


def matmul_tiling(call):
    a, b, out = call.inputs["self"], call.inputs["mat2"], call.outputs["out"]
    if a.ndim != 2 or b.ndim != 2 or not _dense(a, b, out):
        return Fallback("batched or strided operands")
    if a.dtype not in (DataType.FLOAT, DataType.FLOAT16):
        return Fallback("the Cube takes float16 or float32 here")
    profile = current_profile()
    size = a.itemsize
    base_m = base_n = 128
    base_k = profile.buffers["L0A"] // (base_m * size)          # an A tile fills L0A
    (m, k), n = a.shape, b.shape[1]
    base_k = min(base_k, align_up(k, BLOCK // size))
    tiles = -(-m // base_m) * -(-n // base_n)
    return MatmulTiling(m, k, n, base_m, base_k, base_n, max(1, min(profile.cube_cores, tiles)))


@kernel(kind="cube")
def matmul_tiles(a, b, c, tiling):
    """C tiles of base_m x base_n: A and B through L1 (double buffered) and L0 into the Cube,
    K accumulated in L0C, the tile written out through the fixpipe."""
    t = tiling
    size = a.dtype.itemsize
    pipe = TPipe()
    a1, b1 = TQue(TPosition.A1, 2, "a_l1"), TQue(TPosition.B1, 2, "b_l1")
    a2, b2 = TQue(TPosition.A2, 1, "a_l0"), TQue(TPosition.B2, 1, "b_l0")
    c1 = TQue(TPosition.CO1, 1, "c_l0c")
    pipe.init_buffer(a1, 2, t.base_m * t.base_k * size)
    pipe.init_buffer(b1, 2, t.base_k * t.base_n * size)
    pipe.init_buffer(a2, 1, t.base_m * t.base_k * size)
    pipe.init_buffer(b2, 1, t.base_k * t.base_n * size)
    pipe.init_buffer(c1, 1, t.base_m * t.base_n * 4)
    fractal = 512 // size                                   # MTE1 moves whole 512-byte fractals
    for tile in t.tiles[get_block_idx()::t.block_dim]:
        i, j = tile
        rows, cols = min(t.base_m, t.m - i), min(t.base_n, t.n - j)
        acc = c1.alloc_tensor(np.float32)
        for p in range(0, t.k, t.base_k):
            depth = min(t.base_k, t.k - p)
            la, lb = a1.alloc_tensor(a.dtype), b1.alloc_tensor(b.dtype)
            data_copy_rows(la, a[i * t.k + p:], rows, depth, t.k, depth,
                           pad=depth * size % BLOCK != 0)
            data_copy_rows(lb, b[p * t.n + j:], depth, cols, t.n, cols,
                           pad=cols * size % BLOCK != 0)
            a1.enque(la)
            b1.enque(lb)
            la, lb = a1.deque(), b1.deque()
            za, zb = a2.alloc_tensor(a.dtype), b2.alloc_tensor(b.dtype)
            data_copy(za, la, min(align_up(rows * depth, fractal), len(za)))
            data_copy(zb, lb, min(align_up(depth * cols, fractal), len(zb)))
            a1.free_tensor(la)
            b1.free_tensor(lb)
            mmad(acc, za, zb, rows, depth, cols, accumulate=p > 0)
            a2.free_tensor(za)
            b2.free_tensor(zb)
        data_copy_rows(c[i * t.n + j:], acc, rows, cols, cols, t.n, pad=True)
        c1.free_tensor(acc)


@register_op("MatMul", device_types=AICORE, tiling=matmul_tiling, scratch=whole._matmul_scratch,
             priority=1, name="tiled_matmul")
def tiled_matmul(args) -> None:
    tiling = args.attrs["tiling"]
    if isinstance(tiling, Fallback):
        return whole.matmul_kernel(args)
    a, b, out = args.inputs["self"], args.inputs["mat2"], args.outputs["out"]
    matmul_tiles.run(tiling.block_dim, a.reshape(-1), b.reshape(-1), out.reshape(-1), tiling)
