"""Is B really faster than A? Intervals and tests whose numbers are the ones the verdicts use.

``kprof.compare`` times variants in interleaved rounds: a seeded bootstrap interval on the ratio of median step
times. Medians, not means: a training step's time distribution has a long right tail (GC, a page fault, another
process), and one outlier should not decide a comparison. Step times are not independent: a burst of other
load slows several consecutive steps. So the bootstrap resamples whole rounds (one block of steps of each
variant, run back to back), the same rounds for both variants: a burst that hit one variant's block widens
the interval instead of passing for a speedup, and drift that hit both blocks of a round cancels.

``kprof.diff`` compares the steps of two runs: the step time by the rank test (``rank_ratio``: a typical step
against a typical step, with the interval that is the test), every per-step row by Welch's t-test with intervals
at the level the false-discovery control used (``welch_interval``).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np

FASTER = "faster"
SLOWER = "slower"
SAME = "no significant difference"
NOISY = "noisy measurement"
NOISY_SPREAD = 1.5  # p90 / median of a variant's step times above which its timing is called noisy
NOISY_CI = 1.25  # an interval whose high / low exceeds this is too wide for a verdict on its own


def check_confidence(confidence: object) -> None:
    """A ValueError naming ``confidence`` unless it is a number strictly between 0 and 1 (a bool is not)."""
    if isinstance(confidence, bool) or not isinstance(confidence, numbers.Real) or not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be a number between 0 and 1, got {confidence!r}")


def check_noise_threshold(noise_threshold: object) -> None:
    """A ValueError naming ``noise_threshold`` unless it is a number >= 0 (a fraction of A's value; a bool is not)."""
    if isinstance(noise_threshold, bool) or not isinstance(noise_threshold, numbers.Real) or not noise_threshold >= 0:
        raise ValueError(f"noise_threshold must be a number >= 0, got {noise_threshold!r}")


def spread(times: Sequence[float]) -> float:
    """p90 / median of step times: how far a variant's slow steps stray from its typical one (1.0: not at all)."""
    return float(np.percentile(times, 90) / np.median(times))


def drift(times: Sequence[float], rounds: int) -> float:
    """How far a variant's median could move, as a factor, if load hit it in ``2 / sqrt(rounds)`` more of its steps
    than the other variant: the (50 + 50 x that share)th percentile of ``times`` over their median. Interleaving in
    a random order per round leaves about that much imbalance, and less with more rounds."""
    share = min(1.0, 2.0 / math.sqrt(max(rounds, 1)))
    return float(np.percentile(times, 50.0 + 50.0 * share) / np.median(times))


def judge(
    speedup: float,
    low: float,
    high: float,
    base: Sequence[float],
    other: Sequence[float],
    *,
    rounds: int,
    threshold: float = 0.02,
    base_name: str = "the baseline",
) -> tuple[str, tuple[float, float] | None, str | None]:
    """``(verdict, widened interval or None, note or None)`` for ``other`` against ``base`` (their step times, from
    ``rounds`` interleaved rounds) on a machine that may be noisy. Noisy means either variant's steps vary a lot
    (``spread`` > NOISY_SPREAD) or the interval is wide (high / low > NOISY_CI). Then the interval is widened for
    load that hit one variant's steps more than the other's, which resampling rounds does not see (``drift``): load
    on the baseline makes ``other`` look faster, so the low end comes down by the baseline's drift; load on
    ``other`` makes it look slower, so the high end goes up by its own. The verdict is called on that interval:
    "faster"/"slower" when even it excludes no change, with a note that the machine was noisy; "noisy measurement"
    when the noise could change the answer. The note quotes ``other``'s own spread beside the baseline's
    (``base_name``). Calibrated in benchmarks/calibration.py ("compare under load")."""
    plain = verdict(speedup, low, high, threshold=threshold)
    own, theirs = spread(other), spread(base)
    if max(own, theirs) <= NOISY_SPREAD and high / low <= NOISY_CI:
        return plain, None, None
    wide = (low / max(drift(base, rounds), 1.0), high * max(drift(other, rounds), 1.0))
    why = f"p90/median of its step times is {own:.2f}, of {base_name}'s {theirs:.2f}"
    if max(own, theirs) <= NOISY_SPREAD:
        why = f"the {high / low:.2f}x-wide interval ({why})"
    shown = f"widened for that noise, the interval is [{wide[0]:.3f}, {wide[1]:.3f}]"
    decided = verdict(speedup, *wide, threshold=threshold)
    if decided != SAME:
        note = f"the machine was noisy ({why}), but {shown}: it excludes no change, the difference is larger than that"
        return decided, wide, note
    steps = len(other)
    note = (
        f"{why}: other load on the machine (other processes, a shared GPU, thermal throttling) or too few steps "
        f"({steps}); {shown}; rerun on a quiet machine with more steps (e.g. steps={4 * steps})"
    )
    return NOISY, wide, note


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
    check_confidence(confidence)
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


def regression_limit(pct: float) -> float:
    """``pct`` percent as a fraction, checked: the slowdown a regression gate allows (``--fail-if-slower PCT``)."""
    if isinstance(pct, bool) or not isinstance(pct, (int, float)) or not 0.0 <= pct < math.inf:
        raise ValueError(f"the allowed slowdown must be a percentage >= 0, got {pct!r}")
    return pct / 100.0


def regressed(speedup: float, low: float, high: float, limit: float, *, threshold: float = 0.02) -> bool:
    """The regression gate: ``other`` is slower than ``base`` by more than ``limit`` (a fraction) with significance.

    The verdict (``verdict``, at ``threshold``) is "slower", and the whole interval of the slowdown lies above
    ``limit``: its lower bound, ``1 / high - 1`` (``high`` bounds the speedup base / other), exceeds it. A change
    that large is real at the interval's confidence; a smaller one, or one the steps cannot pin down, passes, so
    the gate does not fail on noise (more steps narrow the interval and catch smaller regressions).
    """
    return verdict(speedup, low, high, threshold=threshold) == SLOWER and 1.0 / high - 1.0 > limit


TOO_FEW = "too few steps"
_EXACT_PAIRS = 2500  # up to this many pairs (n x m), the rank test's null distribution is counted exactly
_MAX_SIDE = 1000  # steps a side used by the rank interval: more are thinned to this many quantiles


def rank_min_steps(confidence: float) -> int:
    """The fewest steps a side (equal sides) for which ``rank_ratio`` gives an interval at ``confidence``."""
    n = 1
    while _rank_bound(n, n, 1.0 - confidence) == 0:
        n += 1
    return n


def rank_ratio(
    base: Sequence[float], other: Sequence[float], *, confidence: float = 0.95
) -> tuple[float, float | None, float | None]:
    """``(ratio, low, high)``: how many times longer a typical ``base`` step is than an ``other`` step, with its
    ``confidence`` interval (None, None when the sides are too small for any interval at that confidence).

    The ratio is the Hodges-Lehmann estimate: the median of ``base[i] / other[j]`` over every pair of steps, a
    typical step against a typical step that one outlier step cannot move. The interval is its distribution-free
    (Moses) interval, read off the same sorted pairwise ratios at the Mann-Whitney test's critical rank: it excludes
    1.0 exactly when the rank test rejects "no shift", so the interval shown is the test that decides. For unpaired
    steps (two runs, or two step selections of one run): each step is one sample.
    """
    a, b = (np.log(np.maximum(np.asarray(x, dtype=np.float64), 1e-12)) for x in (base, other))
    if a.size == 0 or b.size == 0:
        raise ValueError(f"need at least one step on each side, got {a.size} and {b.size}")
    check_confidence(confidence)
    a, b = (np.quantile(x, np.linspace(0, 1, _MAX_SIDE)) if x.size > _MAX_SIDE else x for x in (a, b))
    logs = np.sort((a[:, None] - b[None, :]).ravel())
    ratio = float(np.exp(np.median(logs)))
    k = _rank_bound(a.size, b.size, 1.0 - confidence)
    if k == 0:
        return ratio, None, None
    return ratio, float(np.exp(logs[k - 1])), float(np.exp(logs[logs.size - k]))


def _rank_bound(n: int, m: int, alpha: float) -> int:
    """The largest k with P(U <= k - 1) <= alpha / 2 for the Mann-Whitney U of sizes n and m under no shift (0: no
    interval is possible): the k-th smallest and k-th largest pairwise difference bound the interval."""
    if n * m <= _EXACT_PAIRS:
        counts, total = _u_counts(min(n, m), max(n, m)), math.comb(n + m, n)
        below, k = 0, 0
        while k < len(counts) and (below + counts[k]) <= alpha / 2 * total:
            below += counts[k]
            k += 1
        return k
    z = NormalDist().inv_cdf(1.0 - alpha / 2)
    return max(0, math.floor(n * m / 2 + 0.5 - z * math.sqrt(n * m * (n + m + 1) / 12)))


def _u_counts(n: int, m: int) -> list[int]:
    """How many of the C(n + m, n) orderings of two samples give U = 0, 1, ..., n*m: the coefficients of the
    Gaussian binomial [n + m choose n], as the product over i = 1..n of (1 - q^(m+i)) / (1 - q^i)."""
    size = n * m + 1
    c = [1] + [0] * (size - 1)
    for i in range(1, n + 1):
        for u in range(size - 1, m + i - 1, -1):  # times (1 - q^(m+i))
            c[u] -= c[u - m - i]
        for u in range(i, size):  # divided by (1 - q^i)
            c[u] += c[u - i]
    return c


def welch_interval(base: np.ndarray, other: np.ndarray, alpha: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the interval of mean(other) - mean(base) that Welch's t-test accepts at level ``alpha`` (two-sided):
    it excludes 0 exactly when ``welch_p`` < ``alpha``. NaN where a side has fewer than 2 steps; a row without
    variance on either side gets its change exactly."""
    n, m = base.shape[1], other.shape[1]
    if n < 2 or m < 2:
        nan = np.full(base.shape[0], np.nan)
        return nan, nan.copy()
    va, vb = base.var(axis=1, ddof=1) / n, other.var(axis=1, ddof=1) / m
    delta = other.mean(axis=1) - base.mean(axis=1)
    se = np.sqrt(va + vb)
    with np.errstate(divide="ignore", invalid="ignore"):
        df = (va + vb) ** 2 / (va**2 / (n - 1) + vb**2 / (m - 1))
    half = np.where(se > 0, se * _t_critical(np.where(se > 0, df, 1.0), alpha), 0.0)
    return delta - half, delta + half


def _t_critical(df: np.ndarray, alpha: np.ndarray | float) -> np.ndarray:
    """t with two-sided p-value ``alpha`` at ``df`` degrees of freedom: the root x of I_x(df/2, 1/2) = alpha (the
    p-value ``welch_p`` computes), by bisection on log x, then t = sqrt(df (1 - x) / x)."""
    df = np.asarray(df, dtype=np.float64)
    alpha = np.broadcast_to(np.asarray(alpha, dtype=np.float64), df.shape)
    lo, hi = np.full(df.shape, -700.0), np.zeros(df.shape)  # log x: I_x is increasing in x
    for _ in range(60):
        mid = (lo + hi) / 2
        below = _betainc(df / 2.0, 0.5, np.exp(mid)) < alpha
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    x = np.exp((lo + hi) / 2)
    return np.sqrt(df * (1.0 - x) / x)


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
            for num in (
                m * (bb - m) * xx / ((aa + 2 * m - 1) * (aa + 2 * m)),
                -(aa + m) * (aa + bb + m) * xx / ((aa + 2 * m) * (aa + 2 * m + 1)),
            ):
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
