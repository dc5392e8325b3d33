"""The host call tree: who is nested in whom, per thread, as torch's key_averages builds it.

One event is a child of another on the same thread if its [start, end) lies inside the
other's; partial overlaps make no relation (torch/autograd/profiler_util.py
`_populate_cpu_children`). As in torch, a child with its parent's name that is the
parent's only child is folded into the parent (`_remove_dup_nodes`), and the parent then
reports the folded child's kernels in place of its own.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class Tree:
    """parent[i]: index of the enclosing event or -1; keep[i]: False for folded duplicates;
    survivor[i]: the kept event that i was folded into (i itself when kept)."""

    parent: np.ndarray
    depth: np.ndarray
    keep: np.ndarray
    survivor: np.ndarray

    def children_sum(self, values: np.ndarray) -> np.ndarray:
        """For each event, the sum of `values` over its direct (kept) children."""
        child = np.flatnonzero(self.keep & (self.parent >= 0))
        return np.bincount(self.parent[child], weights=values[child], minlength=values.size)

    def kept(self, index: np.ndarray) -> np.ndarray:
        """The kept event each of `index` was folded into (itself when kept); -1 stays -1."""
        return np.where(index >= 0, self.survivor[np.maximum(index, 0)], -1)

    def lift_kernels(self, values: np.ndarray) -> np.ndarray:
        """Per-event kernel values (GPU time) as torch reports them after folding duplicates.

        torch's `_remove_dup_nodes` sets `parent.kernels = child.kernels` at each fold, so a kept
        event that absorbed a chain of same-name children reports the innermost one's kernels
        instead of its own; folded events report none.
        """
        out = np.where(self.keep, values, 0.0)
        folded = np.flatnonzero(~self.keep)
        if folded.size:
            folded = folded[np.lexsort((self.depth[folded], self.survivor[folded]))]
            host = self.survivor[folded]
            innermost = folded[np.append(host[1:] != host[:-1], True)]
            out[self.survivor[innermost]] = values[innermost]
        return out

    def subtree_sum(self, values: np.ndarray) -> np.ndarray:
        """For each event, `values` summed over itself and all its descendants."""
        out = values.astype(np.float64)
        for level in range(int(self.depth.max(initial=0)), 0, -1):
            child = np.flatnonzero(self.depth == level)
            np.add.at(out, self.parent[child], out[child])
        return out


def _nearest_previous_at_least(values: np.ndarray, threshold: np.ndarray, segment_start: np.ndarray) -> np.ndarray:
    """For each k: the largest j < k with j >= segment_start[k] and values[j] >= threshold[k], else -1.

    Binary lifting over a sparse table of running maxima: O(n log n) numpy work, no Python loop per element.
    """
    n = values.size
    maxima = [values]  # maxima[l][k] = max(values[k - 2**l + 1 .. k])
    while 2 ** len(maxima) <= n:
        w, prev = 2 ** (len(maxima) - 1), maxima[-1]
        maxima.append(np.concatenate([prev[:w], np.maximum(prev[w:], prev[:-w])]))
    pos = np.arange(n) - 1
    for level in range(len(maxima) - 1, -1, -1):
        w = 2**level
        skip = (pos - w + 1 >= segment_start) & (maxima[level][np.maximum(pos, 0)] < threshold)
        pos = np.where(skip, pos - w, pos)
    found = (pos >= segment_start) & (values[np.maximum(pos, 0)] >= threshold)
    return np.where(found, pos, -1)


def nest(thread: np.ndarray, start: np.ndarray, end: np.ndarray, name: np.ndarray, *, fold: bool = True) -> Tree:
    """Build the per-thread nesting of host events exactly as torch's stack pass does, vectorized; with `fold`,
    fold same-name chains as key_averages does (a timeline keeps them: `fold=False`).

    torch sorts a thread's events by (start, -end) and, for each event i, pops the stack while
    `start_i >= end_top or end_i > end_top`, i.e. while `end_top < max(end_i, start_i + 1)` in integer
    ns; the parent is the top left. A popped event is never needed later (a later event starts no
    earlier, and i itself ends no earlier and is nearer), so the parent of i is simply the nearest
    earlier event of its thread ending at or after max(end_i, start_i + 1).
    """
    n = start.size
    order = np.lexsort((-end, start, thread))
    th, s, e = thread[order], start[order], end[order]
    first = np.ones(n, bool)
    first[1:] = th[1:] != th[:-1]
    segment_start = np.maximum.accumulate(np.where(first, np.arange(n), 0))
    up = _nearest_previous_at_least(e, np.maximum(e, s + 1), segment_start)
    parent = np.full(n, -1, np.int64)
    parent[order] = np.where(up >= 0, order[np.maximum(up, 0)], -1)
    depth = np.zeros(n, np.int64)
    ancestor = parent.copy()
    active = np.flatnonzero(ancestor >= 0)
    while active.size:
        depth[active] += 1
        ancestor[active] = parent[ancestor[active]]
        active = active[ancestor[active] >= 0]
    tree = Tree(parent, depth, np.ones(n, bool), np.arange(n))
    if fold:
        _fold_duplicates(tree, name)
    return tree


def _fold_duplicates(tree: Tree, name: np.ndarray) -> None:
    """Fold `x -> x` chains where the inner x is the outer's only child (torch's _remove_dup_nodes)."""
    parent = tree.parent
    has_parent = parent >= 0
    candidates = np.flatnonzero(has_parent & (name == name[np.maximum(parent, 0)]))
    if candidates.size == 0:
        return
    n_children = np.bincount(parent[has_parent], minlength=parent.size)
    by_parent = np.flatnonzero(has_parent)[np.argsort(parent[has_parent], kind="stable")]
    bounds = np.concatenate([[0], np.cumsum(n_children)])
    moved: dict[int, np.ndarray] = {}  # the children of events that took over a folded child's children
    for i in sorted(candidates.tolist(), key=lambda k: tree.depth[k]):
        p = parent[i]  # always kept: children of folded events were re-pointed to the survivor
        if n_children[p] != 1 or name[p] != name[i]:
            continue
        tree.keep[i] = False
        tree.survivor[i] = p
        kids = moved.pop(i) if i in moved else by_parent[bounds[i] : bounds[i + 1]]
        parent[kids] = p
        moved[p] = kids
        n_children[p] = kids.size
