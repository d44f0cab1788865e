"""Sparse MatMul: analyse the left operand's sparsity, pick a strategy, keep the compressed form
in the workspace (seed 004 §3.2).

Phase 1 reads the left matrix once and measures two densities: of its elements, and of its
`block` x `block` tiles (a tile with any non-zero counts). The strategy follows the seed's
bands, applied to the density that decides the cost:

- block-sparse when at most 30% of the tiles hold non-zeros: only those tiles are multiplied,
  each block row as one dense product of its packed tiles (pruned weights, masks and ragged
  batches cluster their non-zeros like this);
- direct sparse (compressed rows, CSR) when the non-zeros are scattered and very few: the seed
  says below 10% on the NPU's sparse units, but a gathered row costs numpy about a hundred times
  a BLAS multiply-add, and bench/sparse.py measures the break-even near 0.1% here;
- dense otherwise: a sparse kernel would do more work than the dense one saves.

The workspace holds the compressed form phase 2 builds and multiplies from: CSR values, column
indices and row pointers, or the packed tiles with their block columns and block-row pointers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import OpParamError
from .registry import register_op

DIRECT_BELOW = 0.001      # seed 004 §3.2 says 10% for hardware; numpy's gather breaks even here
BLOCK_UP_TO = 0.30        # seed 004 §3.2: block-sparse up to 30% (of tiles, here)
DENSE_FROM = 0.30         # seed 004 §3.2: dense above 30%
DEFAULT_BLOCK = 32


@dataclass(frozen=True)
class Sparsity:
    """What phase 1 measured and chose."""

    shape: tuple[int, int]
    block: int
    nonzeros: int
    tiles: int                # tiles holding a non-zero
    strategy: str             # "direct" | "block" | "dense"

    @property
    def density(self) -> float:
        rows, cols = self.shape
        return self.nonzeros / (rows * cols) if rows * cols else 0.0

    @property
    def tile_density(self) -> float:
        rows, cols = self.shape
        total = -(-rows // self.block) * -(-cols // self.block)
        return self.tiles / total if total else 0.0

    def describe(self) -> str:
        return (f"{self.strategy} ({self.density:.1%} of elements and {self.tile_density:.1%} of "
                f"{self.block}x{self.block} tiles non-zero)")


def tile_mask(matrix: np.ndarray, block: int) -> np.ndarray:
    """Which block x block tiles of float32 `matrix` hold a non-zero (edge tiles padded).

    One pass over the bits: OR the rows of each block row together, drop the sign bit (so -0.0
    counts as zero), then look at each tile's `block` words."""
    rows, cols = matrix.shape
    tall, wide = -(-rows // block), -(-cols // block)
    if rows % block or cols % block or not matrix.flags.c_contiguous:
        padded = np.zeros((tall * block, wide * block), np.float32)
        padded[:rows, :cols] = matrix
        matrix = padded
    ored = np.bitwise_or.reduce(matrix.view(np.uint32).reshape(tall, block, -1), axis=1)
    ored &= 0x7FFFFFFF
    return ored.reshape(tall, wide, block).any(axis=2)


def analyse(matrix: np.ndarray, block: int = DEFAULT_BLOCK) -> Sparsity:
    """Measure `matrix` (its tiles, then its elements) and choose a strategy."""
    rows, cols = matrix.shape
    tiles = int(np.count_nonzero(tile_mask(matrix, block))) if matrix.size else 0
    nonzeros = int(np.count_nonzero(matrix))
    total_tiles = -(-rows // block) * -(-cols // block)
    if total_tiles and tiles <= BLOCK_UP_TO * total_tiles and nonzeros < DENSE_FROM * matrix.size:
        strategy = "block"
    elif nonzeros < DIRECT_BELOW * matrix.size:
        strategy = "direct"
    else:
        strategy = "dense"
    return Sparsity((rows, cols), block, nonzeros, tiles, strategy)


def workspace_regions(sparsity: Sparsity) -> dict[str, int]:
    """The compressed form's regions (bytes) for `sparsity`'s strategy."""
    rows, _ = sparsity.shape
    block = sparsity.block
    if sparsity.strategy == "direct":
        return {"values": sparsity.nonzeros * 4, "columns": sparsity.nonzeros * 4,
                "row pointers": (rows + 1) * 8}
    if sparsity.strategy == "block":
        return {"tile values": sparsity.tiles * block * block * 4,
                "tile columns": sparsity.tiles * 4,
                "block-row pointers": (-(-rows // block) + 1) * 8}
    return {}


def read(tensor) -> np.ndarray:
    """`tensor`'s values once its queued writers finish: in place where the backend's bytes are
    host-visible (the simulator), a host copy elsewhere."""
    from ..runtime.state import RUNTIME

    tensor.storage.check_live("SparseMatMul self")
    tensor.storage.wait()
    rng = RUNTIME.backend.resolve(*tensor.span(), "SparseMatMul self")
    raw = RUNTIME.backend.kernel_view(rng, "SparseMatMul self")
    return tensor._strided(raw) if isinstance(raw, np.ndarray) else tensor.numpy()


def check_operands(a, b, out) -> None:
    from ..constants import DataType

    for role, tensor in (("self", a), ("mat2", b), ("out", out)):
        if tensor.dtype != DataType.FLOAT:
            raise OpParamError(f"SparseMatMul: {role} is {tensor.dtype.name.lower()}; the sparse "
                               "kernels take float32")
    if a.ndim != 2 or b.ndim != 2:
        raise OpParamError(f"SparseMatMul: self {a.shape} and mat2 {b.shape} must be 2-d")
    if a.shape[1] != b.shape[0]:
        raise OpParamError(f"SparseMatMul: self {a.shape} and mat2 {b.shape} have inner dims "
                           f"{a.shape[1]} and {b.shape[0]}")
    if tuple(out.shape) != (a.shape[0], b.shape[1]):
        raise OpParamError(f"SparseMatMul: out has shape {out.shape}, the result has shape "
                           f"{(a.shape[0], b.shape[1])}")


# --- phase 2 on the simulator --------------------------------------------------------------


def _direct(args, a: np.ndarray, b: np.ndarray, out: np.ndarray, sparsity: Sparsity) -> None:
    """CSR built in the workspace, then each run of rows as gathered rows of b, scaled by the
    non-zeros and summed per row."""
    rows_of, columns_of = np.nonzero(a)
    count = len(rows_of)
    values = args.buffer("values", (count,), np.float32)
    columns = args.buffer("columns", (count,), np.int32)
    pointers = args.buffer("row pointers", (a.shape[0] + 1,), np.int64)
    values[:] = a[rows_of, columns_of]
    columns[:] = columns_of
    pointers[0] = 0
    np.cumsum(np.bincount(rows_of, minlength=a.shape[0]), out=pointers[1:])
    out[...] = 0
    budget = max(1, (1 << 22) // max(1, b.shape[1]))       # ~16 MiB of gathered rows at a time
    first_row = 0
    while first_row < a.shape[0]:
        last_row = int(np.searchsorted(pointers, pointers[first_row] + budget, "right")) - 1
        last_row = min(a.shape[0], max(last_row, first_row + 1))
        start, stop = pointers[first_row], pointers[last_row]
        if stop > start:
            gathered = b[columns[start:stop]]
            gathered *= values[start:stop, None]
            starts = pointers[first_row:last_row] - start
            filled = pointers[first_row + 1:last_row + 1] > pointers[first_row:last_row]
            sums = np.add.reduceat(gathered, starts[filled], axis=0)
            out[first_row:last_row][filled] = sums
        first_row = last_row


def _block(args, a: np.ndarray, b: np.ndarray, out: np.ndarray, sparsity: Sparsity) -> None:
    """The non-empty tiles packed in the workspace, then each block row as one product of its
    packed tiles with the rows of b they meet."""
    block = sparsity.block
    rows, inner = a.shape
    mask = tile_mask(a, block)
    tile_rows, tile_cols = np.nonzero(mask)
    tiles = args.buffer("tile values", (len(tile_rows), block, block), np.float32)
    columns = args.buffer("tile columns", (len(tile_rows),), np.int32)
    pointers = args.buffer("block-row pointers", (mask.shape[0] + 1,), np.int64)
    columns[:] = tile_cols
    pointers[0] = 0
    np.cumsum(np.bincount(tile_rows, minlength=mask.shape[0]), out=pointers[1:])
    if rows % block or inner % block:
        padded = np.zeros((mask.shape[0] * block, mask.shape[1] * block), np.float32)
        padded[:rows, :inner] = a
        b = np.vstack([b, np.zeros((padded.shape[1] - inner, b.shape[1]), b.dtype)])
    else:
        padded = a
    tiles[...] = padded.reshape(mask.shape[0], block, mask.shape[1], block) \
        .transpose(0, 2, 1, 3)[tile_rows, tile_cols]
    offsets = np.arange(block)
    for r in range(mask.shape[0]):
        first, last = pointers[r], pointers[r + 1]
        height = min(block, rows - r * block)
        target = out[r * block:r * block + height]
        if first == last:
            target[...] = 0
            continue
        packed = tiles[first:last].transpose(1, 0, 2).reshape(block, -1)[:height]
        np.matmul(packed, b[(columns[first:last, None] * block + offsets).ravel()], out=target)


def _scratch(call) -> dict[str, int]:
    return workspace_regions(call.attrs["sparsity"])


@register_op("SparseMatMul", device_types=("sim",), scratch=_scratch, name="numpy_sparse_matmul")
def sparse_matmul_kernel(args) -> None:
    a, b, out = args.inputs["self"], args.inputs["mat2"], args.outputs["out"]
    sparsity = args.attrs["sparsity"]
    if sparsity.strategy == "direct":
        _direct(args, a, b, out, sparsity)
    elif sparsity.strategy == "block":
        _block(args, a, b, out, sparsity)
    else:
        np.matmul(a, b, out=out)
