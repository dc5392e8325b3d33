"""Is variant B really faster than A? A seeded bootstrap interval on the ratio of median step times.

Medians, not means: a training step's time distribution has a long right tail (GC, a page fault, another
process), and one outlier should not decide a comparison. Step times are not independent: a burst of other
load slows several consecutive steps. So the bootstrap resamples whole rounds (one block of steps of each
variant, run back to back), the same rounds for both variants: a burst that hit one variant's block widens
the interval instead of passing for a speedup, and drift that hit both blocks of a round cancels.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

FASTER = "faster"
SLOWER = "slower"
SAME = "no significant difference"

_RESAMPLES = 2000
_CHUNK_ELEMENTS = 4_000_000  # resampled step times held in memory at once


def speedup_interval(
    base: Sequence[Sequence[float]],
    other: Sequence[Sequence[float]],
    *,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """``(speedup, low, high)``: median(base) / median(other) and its bootstrap ``confidence`` interval.

    ``base[r]`` and ``other[r]`` are the step times of round ``r`` (paired). A speedup above 1 means ``other``
    takes less time per step than ``base``.
    """
    if len(base) != len(other) or len(base) == 0:
        raise ValueError(f"need the same number (>= 1) of rounds for both variants, got {len(base)} and {len(other)}")
    a = [np.asarray(r, dtype=np.float64) for r in base]
    b = [np.asarray(r, dtype=np.float64) for r in other]
    if any(r.size == 0 for r in a + b):
        raise ValueError("every round needs at least one step time")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    picks = np.random.default_rng(seed).integers(0, len(a), size=(_RESAMPLES, len(a)))
    ratios = _resampled_medians(a, picks) / _resampled_medians(b, picks)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(ratios, [tail, 1.0 - tail])
    return float(np.median(np.concatenate(a)) / np.median(np.concatenate(b))), float(low), float(high)


def _resampled_medians(rounds: list[np.ndarray], picks: np.ndarray) -> np.ndarray:
    """The median of the steps in each row of picked rounds (rounds padded with NaN to one length)."""
    padded = np.full((len(rounds), max(r.size for r in rounds)), np.nan)
    for i, r in enumerate(rounds):
        padded[i, : r.size] = r
    rows = max(1, _CHUNK_ELEMENTS // (picks.shape[1] * padded.shape[1]))
    out = np.empty(len(picks))
    for start in range(0, len(picks), rows):
        chunk = picks[start : start + rows]
        out[start : start + len(chunk)] = np.nanmedian(padded[chunk].reshape(len(chunk), -1), axis=1)
    return out


def verdict(speedup: float, low: float, high: float, *, threshold: float = 0.02) -> str:
    """``faster``/``slower`` when the interval excludes 1.0 and the speedup is off 1.0 by more than ``threshold``.

    The threshold is criterion.rs's noise threshold: a shift of a percent or two between two runs of the same
    code is ordinary drift on a shared machine, so it is not reported as a difference even when it is
    statistically clear.
    """
    if low > 1.0 and speedup > 1.0 + threshold:
        return FASTER
    if high < 1.0 and speedup < 1.0 / (1.0 + threshold):
        return SLOWER
    return SAME
