"""Exact minima and maxima of many ranges of a long array, for zooming a timeline of millions
of entries: each request asks for the lowest and highest level in ~800 ranges, and must cost a
few milliseconds whatever the range covers.

The array is cut into blocks of BLOCK values whose minima and maxima are kept (1/32 of the
array's size, both together). A range is its whole blocks (a reduce over the block arrays, at
most n / BLOCK values for all the ranges together) plus at most BLOCK - 1 values at either end
(gathered, at most 2 * BLOCK per range). So an answer reads O(ranges * BLOCK + n / BLOCK) values,
about 0.3 M for 10 M entries and 800 ranges, and is exact.
"""

from __future__ import annotations

import numpy as np

BLOCK = 64


def _reduce_ranges(ufunc, values: np.ndarray, starts: np.ndarray, stops: np.ndarray,
                   empty) -> np.ndarray:
    """ufunc.reduce over values[starts[i]:stops[i]] for each i; `empty` where the range is
    empty. reduceat on the starts and stops interleaved reduces each [start, stop) at the even
    positions (the odd ones, between ranges, are dropped), ranges may overlap."""
    out = np.full(len(starts), empty, dtype=values.dtype)
    full = stops > starts
    if not full.any():
        return out
    padded = np.append(values, values[-1:])            # a stop equal to len is an index
    at = np.empty(2 * int(full.sum()), dtype=np.int64)
    at[0::2], at[1::2] = starts[full], stops[full]
    out[full] = ufunc.reduceat(padded, at)[0::2]
    return out


def _gathered(values: np.ndarray, starts: np.ndarray, stops: np.ndarray, width: int):
    """values[starts[i]:stops[i]] (each at most `width` long) as rows of a 2-D array, with a
    mask of the places that hold values."""
    index = starts[:, None] + np.arange(width)[None, :]
    inside = index < stops[:, None]
    return values[np.minimum(index, len(values) - 1)], inside


class Levels:
    """`values` (int64 or float64, never empty) with block minima and maxima kept."""

    def __init__(self, values: np.ndarray):
        self.values = values
        n = len(values)
        whole = n // BLOCK
        body = values[:whole * BLOCK].reshape(whole, BLOCK)
        self.block_min = body.min(axis=1) if whole else values[:0]
        self.block_max = body.max(axis=1) if whole else values[:0]
        info = np.iinfo(values.dtype) if values.dtype.kind in "iu" else np.finfo(values.dtype)
        self._high, self._low = info.max, info.min

    def __len__(self) -> int:
        return len(self.values)

    def min_max(self, starts, stops) -> tuple[np.ndarray, np.ndarray]:
        """(min, max) of values[starts[i]:stops[i]]; every range must hold a value."""
        starts = np.asarray(starts, dtype=np.int64)
        stops = np.asarray(stops, dtype=np.int64)
        first_block = -(-starts // BLOCK)
        end_block = np.maximum(stops // BLOCK, first_block)
        whole = end_block > first_block
        lows = _reduce_ranges(np.minimum, self.block_min, first_block, end_block, self._high)
        highs = _reduce_ranges(np.maximum, self.block_max, first_block, end_block, self._low)
        # the pieces outside whole blocks: the head up to the first whole block (or the whole
        # range where it has none, under 2 * BLOCK values), and the tail after the last
        head_stop = np.where(whole, np.minimum(first_block * BLOCK, stops), stops)
        tail_start = np.where(whole, end_block * BLOCK, stops)
        for begin, end, width in ((starts, head_stop, 2 * BLOCK), (tail_start, stops, BLOCK)):
            part, inside = _gathered(self.values, begin, end, width)
            lows = np.minimum(lows, np.where(inside, part, self._high).min(axis=1))
            highs = np.maximum(highs, np.where(inside, part, self._low).max(axis=1))
        return lows, highs
