"""Is a series rising? The statistics a leak claim rests on, for a site's live bytes sampled at
step boundaries.

A leak adds about the same bytes every step, so its series is a line that rises. Memory that
varies with the batch or the sequence (a bigger batch keeps a bigger tensor past the boundary)
scatters around a level, and memory made once (weights, optimizer state, cuDNN's autotuning in
the first step) is one jump. The tests tell these apart without a threshold fitted to any file:

- Mann-Kendall: the share of later-minus-earlier pairs that rise against those that fall, as a z
  score with the variance corrected for ties. A series that scatters has about as many of each.
- Theil-Sen: the slope is the median of every pair's slope, so one jump (a warm-up) or a few
  outliers (a big batch, the frees at an OOM) do not move it; Sen's interval around it comes from
  the same variance.
- The rise over the run against the scatter around the line (the residuals' median absolute
  deviation): a slope that the variation alone could draw is no growth.
- Still rising in the later half: a cache that fills and stops is no leak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

P_RISING = 0.01          # one-sided: few sites of hundreds rise this much by chance
RISE_OVER_SCATTER = 4.0  # the rise over the run, in robust standard deviations of the residuals
MIN_POINTS = 5           # the fewest where a perfectly rising series reaches P_RISING (1/120)
EXACT_UP_TO = 40         # series without ties this short get Mann-Kendall's exact p
MAX_PAIRS = 200_000      # pairs the slope is taken over, at most (a long series is thinned)


@dataclass
class Trend:
    """What a series of (step, value) points says about growth."""

    slope: float          # per step, Theil-Sen
    low: float            # Sen's 95% interval of the slope
    high: float
    z: float              # Mann-Kendall's z (positive: rising)
    p_value: float        # one-sided, that a series without trend rises this much
    rise: float           # slope times the steps spanned
    scatter: float        # robust standard deviation of the residuals around the line
    later_slope: float    # Theil-Sen slope over the later half

    @property
    def rising(self) -> bool:
        return (self.slope > 0 and self.p_value <= P_RISING and self.later_slope > 0
                and self.rise > RISE_OVER_SCATTER * self.scatter)

    @property
    def confidence(self) -> str:
        """"high" where the interval excludes half the slope, else "medium"."""
        return "high" if self.low > self.slope / 2 and self.p_value < 1e-3 else "medium"


def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    i, j = np.triu_indices(n, 1)
    if len(i) > MAX_PAIRS:                         # an even sample of the pairs
        keep = np.linspace(0, len(i) - 1, MAX_PAIRS).astype(np.int64)
        i, j = i[keep], j[keep]
    return i, j


def _slope(x: np.ndarray, y: np.ndarray) -> float:
    if len(x) < 2:
        return 0.0
    i, j = _pairs(len(x))
    return float(np.median((y[j] - y[i]) / (x[j] - x[i])))


def mann_kendall(y: np.ndarray) -> tuple[float, float]:
    """(S, its variance under no trend, ties corrected)."""
    n = len(y)
    i, j = np.triu_indices(n, 1)
    s = float(np.sign(y[j] - y[i]).sum())
    _, counts = np.unique(y, return_counts=True)
    ties = counts[counts > 1].astype(np.float64)
    var = (n * (n - 1) * (2 * n + 5) - float((ties * (ties - 1) * (2 * ties + 5)).sum())) / 18
    return s, var


def exact_p(n: int, s: int) -> float:
    """P(S >= s) for n values in random order: S = pairs - 2 * inversions, and the number of
    orders with k inversions is the Mahonian number, counted by adding one value at a time."""
    counts = np.ones(1, dtype=np.float64)
    for m in range(2, n + 1):              # the m-th value adds 0 .. m-1 inversions
        grown = np.zeros(len(counts) + m - 1)
        for extra in range(m):
            grown[extra:extra + len(counts)] += counts
        counts = grown
    pairs = n * (n - 1) // 2
    most = (pairs - s) // 2                # S >= s: at most this many inversions
    return float(counts[:most + 1].sum() / counts.sum()) if most >= 0 else 0.0


def trend(x, y) -> Trend:
    """The trend of `y` over the steps `x` (increasing step numbers)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    n = len(y)
    if n < 2:
        return Trend(0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0)
    if n > 2000:                 # Mann-Kendall's pairs: thin a very long series evenly
        keep = np.linspace(0, n - 1, 2000).astype(np.int64)
        x, y, n = x[keep], y[keep], 2000
    s, var = mann_kendall(y)
    z = 0.0 if var <= 0 else (s - math.copysign(1, s)) / math.sqrt(var) if s else 0.0
    p_value = 0.5 * math.erfc(z / math.sqrt(2))
    if n <= EXACT_UP_TO and len(np.unique(y)) == n:
        p_value = exact_p(n, int(s))
    i, j = _pairs(n)
    slopes = np.sort((y[j] - y[i]) / (x[j] - x[i]))
    slope = float(np.median(slopes))
    # Sen's interval: the ranks of the pairwise slopes that bound it
    c = 1.96 * math.sqrt(max(var, 0.0)) * len(slopes) / (n * (n - 1) / 2)
    lo = int(max(0, math.floor((len(slopes) - c) / 2)))
    hi = int(min(len(slopes) - 1, math.ceil((len(slopes) + c) / 2)))
    residuals = y - slope * x
    residuals -= np.median(residuals)
    scatter = 1.4826 * float(np.median(np.abs(residuals)))
    half = n // 2
    return Trend(slope, float(slopes[lo]), float(slopes[hi]), z, p_value,
                 slope * float(x[-1] - x[0]), scatter, _slope(x[half:], y[half:]))
