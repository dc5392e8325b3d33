"""Is variant B really faster than A? A seeded bootstrap interval on the ratio of median step times.

Medians, not means: a training step's time distribution has a long right tail (GC, a page fault, another
process), and one outlier should not decide a comparison. Step times are not independent: a burst of other
load slows several consecutive steps. So the bootstrap resamples whole rounds (one block of steps of each
variant, run back to back), the same rounds for both variants: a burst that hit one variant's block widens
the interval instead of passing for a speedup, and drift that hit both blocks of a round cancels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

FASTER = "faster"
SLOWER = "slower"
SAME = "no significant difference"
NOISY = "noisy measurement"
NOISY_SPREAD = 1.5  # p90 / median of a variant's step times above which its timing is called noisy
NOISY_CI = 1.25  # an interval whose high / low exceeds this is too wide for a verdict


def noise(base: Sequence[float], other: Sequence[float], low: float, high: float, steps: int) -> str | None:
    """Why a comparison is too noisy for a verdict (None when it is not): steps that vary a lot, or a wide
    interval; with what to do about it."""
    spread = max(_p90(base) / float(np.median(base)), _p90(other) / float(np.median(other)))
    if spread <= NOISY_SPREAD and high / low <= NOISY_CI:
        return None
    why = (f"p90/median of the step times is {spread:.2f}" if spread > NOISY_SPREAD else
           f"the {high / low:.2f}x-wide interval")
    return (f"{why}: other load on the machine (other processes, a shared GPU, thermal throttling) or too few "
            f"steps ({steps}); rerun on a quiet machine with more steps (e.g. steps={4 * steps})")


def _p90(times: Sequence[float]) -> float:
    return float(np.percentile(times, 90))

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


def ratio_interval(
    base: Sequence[float], other: Sequence[float], *, confidence: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """``(ratio, low, high)``: median(base) / median(other) for two unpaired samples, bootstrap interval.

    For steps of two separate runs (or two step selections of one run): each side's steps are resampled on their
    own, since no step of one side belongs with a step of the other.
    """
    a, b = np.asarray(base, dtype=np.float64), np.asarray(other, dtype=np.float64)
    if a.size == 0 or b.size == 0:
        raise ValueError(f"need at least one step on each side, got {a.size} and {b.size}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    rng = np.random.default_rng(seed)
    medians = [np.median(x[rng.integers(0, x.size, (_RESAMPLES, x.size))], axis=1) for x in (a, b)]
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(medians[0] / medians[1], [tail, 1.0 - tail])
    return float(np.median(a) / np.median(b)), float(low), float(high)


def mean_change_interval(
    base: np.ndarray, other: np.ndarray, *, confidence: float = 0.95, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Per row, a bootstrap interval of mean(other) - mean(base); ``base`` (rows, n) and ``other`` (rows, m).

    Each side's columns (steps) are resampled on their own, the same picks for every row, so the rows of one
    step stay together; each resample is a matrix product, so thousands of rows cost one BLAS call per side.
    """
    rng = np.random.default_rng(seed)
    means = []
    for x in (base, other):
        n = x.shape[1]
        picks = rng.integers(0, n, (_RESAMPLES, n)) + n * np.arange(_RESAMPLES)[:, None]
        weights = np.bincount(picks.ravel(), minlength=_RESAMPLES * n).reshape(_RESAMPLES, n) / n  # times picked / n
        means.append(x @ weights.T)  # (rows, resamples)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means[1] - means[0], [tail, 1.0 - tail], axis=1)
    return low, high


def welch_p(base: np.ndarray, other: np.ndarray) -> np.ndarray:
    """Per row, the two-sided p-value of Welch's t-test on the means of ``base`` (rows, n) and ``other`` (rows, m).

    A t-test rather than resampling: with the 3 to 5 steps a profiling window holds, a permutation or bootstrap
    test cannot reach small p-values at all (3 against 3 steps have 20 splits), while a t-test on per-step
    totals (sums of many calls) can. Rows without variance on either side get 0 when the means differ, else 1;
    fewer than 2 steps on a side give 1 (nothing can be told).
    """
    n, m = base.shape[1], other.shape[1]
    if n < 2 or m < 2:
        return np.ones(base.shape[0])
    va, vb = base.var(axis=1, ddof=1) / n, other.var(axis=1, ddof=1) / m
    delta = other.mean(axis=1) - base.mean(axis=1)
    se2 = va + vb
    with np.errstate(divide="ignore", invalid="ignore"):
        df = se2**2 / (va**2 / (n - 1) + vb**2 / (m - 1))
        p = _betainc(df / 2.0, 0.5, df / (df + delta**2 / se2))
    same = np.isclose(delta, 0.0, rtol=0.0, atol=1e-9 * np.maximum(np.abs(base).max(axis=1, initial=0.0), 1.0))
    return np.where(se2 > 0, p, np.where(same, 1.0, 0.0))


def fdr_reject(p: np.ndarray, q: float = 0.05) -> np.ndarray:
    """Benjamini-Hochberg: which of the p-values are discoveries, keeping the expected false-discovery share <= q."""
    p = np.asarray(p, dtype=np.float64)
    order = np.argsort(p, kind="stable")
    below = p[order] <= q * np.arange(1, p.size + 1) / max(p.size, 1)
    k = int(np.flatnonzero(below).max(initial=-1)) + 1
    out = np.zeros(p.size, bool)
    out[order[:k]] = True
    return out


def _betainc(a: np.ndarray, b: float, x: np.ndarray) -> np.ndarray:
    """Regularized incomplete beta I_x(a, b), elementwise (modified Lentz continued fraction, Numerical Recipes 6.4)."""
    a, x = np.broadcast_arrays(np.asarray(a, dtype=np.float64), np.asarray(x, dtype=np.float64))
    flip = x > (a + 1.0) / (a + b + 2.0)  # the fraction converges fast below this point; use I_x(a,b) = 1 - I_1-x(b,a)
    aa, bb, xx = np.where(flip, b, a), np.where(flip, a, b), np.where(flip, 1.0 - x, x)
    lgamma = np.vectorize(math.lgamma, otypes=[np.float64])
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        front = np.exp(lgamma(aa + bb) - lgamma(aa) - lgamma(bb) + aa * np.log(xx) + bb * np.log1p(-xx)) / aa
        tiny = 1e-300
        c, d = np.ones_like(xx), 1.0 - (aa + bb) * xx / (aa + 1.0)
        d = 1.0 / np.where(np.abs(d) < tiny, tiny, d)
        f = d.copy()
        for m in range(1, 201):
            for num in (m * (bb - m) * xx / ((aa + 2 * m - 1) * (aa + 2 * m)),
                        -(aa + m) * (aa + bb + m) * xx / ((aa + 2 * m) * (aa + 2 * m + 1))):
                d = 1.0 + num * d
                d = 1.0 / np.where(np.abs(d) < tiny, tiny, d)
                c = 1.0 + num / c
                c = np.where(np.abs(c) < tiny, tiny, c)
                f = f * c * d
            if np.all(np.abs(c * d - 1.0) < 1e-12):
                break
        out = front * f
    out = np.where(xx <= 0.0, 0.0, np.where(xx >= 1.0, 1.0, out))
    return np.clip(np.where(flip, 1.0 - out, out), 0.0, 1.0)
