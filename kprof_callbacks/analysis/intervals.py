"""Interval arithmetic on integer-nanosecond numpy arrays (unions, overlaps, time inside windows).

Busy time is a union of intervals (two overlapping kernels on two streams count once), so
the step breakdown is built from these helpers rather than from sums of durations.
"""

from __future__ import annotations

import numpy as np

Intervals = tuple[np.ndarray, np.ndarray]
"""(starts, ends): int64 arrays; after `union` sorted, disjoint, non-empty."""

EMPTY: Intervals = (np.zeros(0, np.int64), np.zeros(0, np.int64))


def union(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """Merge possibly overlapping intervals into sorted disjoint ones (zero-length ones dropped)."""
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if starts.size == 0:
        return EMPTY
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], np.maximum.accumulate(ends[order])
    new = np.empty(starts.size, bool)
    new[0] = True
    new[1:] = starts[1:] > ends[:-1]
    last = np.empty(starts.size, bool)
    last[-1] = True
    last[:-1] = new[1:]
    return starts[new], ends[last]


def merge(*sets: Intervals) -> Intervals:
    """Union of several interval sets."""
    return union(np.concatenate([s for s, _ in sets]), np.concatenate([e for _, e in sets]))


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """Intersection of two unions (time covered by both)."""
    if a[0].size == 0 or b[0].size == 0:
        return EMPTY
    times = np.concatenate([a[0], b[0], a[1], b[1]])
    delta = np.concatenate([np.ones(a[0].size + b[0].size, np.int8), -np.ones(a[1].size + b[1].size, np.int8)])
    order = np.lexsort((delta, times))  # at equal times, ends (-1) before starts: touching is not overlapping
    times, depth = times[order], np.cumsum(delta[order])
    opened = np.flatnonzero(depth == 2)
    return times[opened], times[opened + 1]


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """Time covered by `a` but not by `b` (both unions)."""
    if a[0].size == 0 or b[0].size == 0:
        return a
    times = np.concatenate([a[0], a[1], b[0], b[1]])
    delta = np.concatenate(
        [
            np.full(a[0].size, 1, np.int8),
            np.full(a[1].size, -1, np.int8),
            np.full(b[0].size, -2, np.int8),
            np.full(b[1].size, 2, np.int8),
        ]
    )
    order = np.lexsort((delta, times))
    times, level = times[order], np.cumsum(delta[order])
    inside = np.flatnonzero(level == 1)
    inside = inside[inside + 1 < times.size]
    starts, ends = times[inside], times[inside + 1]
    return union(starts, ends)


def length_in(spans: Intervals, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Covered time of the union `spans` inside each window [lo[i], hi[i]] (vectorized over windows)."""
    starts, ends = spans
    if starts.size == 0:
        return np.zeros(lo.shape, np.int64)
    before = np.concatenate([[0], np.cumsum(ends - starts)])

    def covered(t: np.ndarray) -> np.ndarray:  # covered time before t
        i = np.searchsorted(starts, t, side="right")  # intervals starting at or before t
        j = np.maximum(i - 1, 0)
        return np.where(i > 0, before[j] + np.clip(t - starts[j], 0, ends[j] - starts[j]), 0)

    return np.maximum(covered(hi) - covered(lo), 0)


def total(spans: Intervals) -> int:
    """Total covered time of a union."""
    return int((spans[1] - spans[0]).sum())
