"""Does memory grow across steps? A robust trend that a leak shows and warm-up, plateaus and noise do not.

A leak (a tensor kept in a list every step, a graph held through a logged loss) grows memory by about the same
amount every step, for as long as training runs. What must not fire: growth during warm-up (allocator and
optimizer state settling), the caching allocator's plateaus (a jump, then flat for good) and noise. So the test is:

- the samples of the first ``WARMUP_SHARE`` of the steps are left out;
- the rest of the steps is cut into ``CHUNKS`` equal spans whose medians must rise span after span, each rise at
  least ``EVEN_RISE`` of the average one (a plateau gives equal medians, so a jump rises once; noise rises at
  random); spans of steps, not of samples, since a session samples every step at first and sparser later;
- the Theil-Sen slope (the median of all pairwise slopes) has a confidence interval (Sen's, from Kendall's S
  statistic) above zero, and the growth it predicts over the window is at least ``MIN_GROWTH_MB``.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

WARMUP_SHARE = 0.2
CHUNKS = 6
EVEN_RISE = 0.25
MIN_GROWTH_MB = 8.0
MIN_SAMPLES = 18


@dataclasses.dataclass(frozen=True)
class Growth:
    """A trend: MB per step (Theil-Sen) with its confidence interval, over steps ``first``..``last``."""

    mb_per_step: float
    low: float
    high: float
    first: int
    last: int

    @property
    def total_mb(self) -> float:
        return self.mb_per_step * (self.last - self.first)


def theil_sen(x: np.ndarray, y: np.ndarray, z: float = 1.96) -> tuple[float, float, float]:
    """``(slope, low, high)``: the median pairwise slope and Sen's interval (normal approximation, no ties)."""
    i, j = np.triu_indices(x.size, k=1)
    dx = x[j] - x[i]
    slopes = np.sort((y[j] - y[i])[dx != 0] / dx[dx != 0])
    n, count = x.size, slopes.size
    spread = z * math.sqrt(n * (n - 1) * (2 * n + 5) / 18)  # sd of Kendall's S under no trend
    lo = int(max(0, math.floor((count - spread) / 2)))
    hi = int(min(count - 1, math.ceil((count + spread) / 2)))
    return float(np.median(slopes)), float(slopes[lo]), float(slopes[hi])


def growth(steps: np.ndarray, mb: np.ndarray) -> Growth | None:
    """The steady growth of ``mb`` (memory at ``steps``), or None when there is none worth naming."""
    if steps.size == 0:
        return None
    keep = steps >= steps[0] + WARMUP_SHARE * (steps[-1] - steps[0])
    x, y = steps[keep].astype(np.float64), mb[keep]
    if x.size < MIN_SAMPLES:
        return None
    span = np.minimum(((x - x[0]) * CHUNKS / max(x[-1] - x[0], 1.0)).astype(np.int64), CHUNKS - 1)
    if np.unique(span).size < CHUNKS:  # a span without samples: too few to tell a trend from a jump
        return None
    medians = np.array([np.median(y[span == k]) for k in range(CHUNKS)])
    rises = np.diff(medians)
    if not (rises > 0).all() or rises.min() < EVEN_RISE * rises.mean():
        return None
    if x.size > 400:  # the pairwise slopes are quadratic in the samples: thin evenly
        pick = np.linspace(0, x.size - 1, 400).astype(np.int64)
        x, y = x[pick], y[pick]
    slope, low, high = theil_sen(x, y)
    found = Growth(slope, low, high, int(x[0]), int(x[-1]))
    return found if low > 0 and found.total_mb >= MIN_GROWTH_MB else None
