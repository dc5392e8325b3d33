"""The host call tree: who is nested in whom, per thread, as torch's key_averages builds it.

One event is a child of another on the same thread if its [start, end) lies inside the
other's; partial overlaps make no relation (torch/autograd/profiler_util.py
`_populate_cpu_children`). As in torch, a child with its parent's name that is the
parent's only child is folded into the parent (`_remove_dup_nodes`).
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class Tree:
    """parent[i]: index of the enclosing event or -1; keep[i]: False for folded duplicates."""

    parent: np.ndarray
    depth: np.ndarray
    keep: np.ndarray

    def children_sum(self, values: np.ndarray) -> np.ndarray:
        """For each event, the sum of `values` over its direct (kept) children."""
        child = np.flatnonzero(self.keep & (self.parent >= 0))
        return np.bincount(self.parent[child], weights=values[child], minlength=values.size)

    def subtree_sum(self, values: np.ndarray) -> np.ndarray:
        """For each event, `values` summed over itself and all its descendants."""
        out = values.astype(np.float64)
        for level in range(int(self.depth.max(initial=0)), 0, -1):
            child = np.flatnonzero(self.depth == level)
            np.add.at(out, self.parent[child], out[child])
        return out


def nest(thread: np.ndarray, start: np.ndarray, end: np.ndarray, name: np.ndarray) -> Tree:
    """Build the per-thread nesting of host events (O(n log n) sort, one stack pass)."""
    n = start.size
    order = np.lexsort((-end, start, thread))
    parent = np.full(n, -1, np.int64)
    depth = np.zeros(n, np.int64)
    parents, depths = [-1] * n, [0] * n
    stack_end: list[int] = []
    stack_idx: list[int] = []
    current = None
    for k, t, s, e, i in zip(range(n), thread[order].tolist(), start[order].tolist(), end[order].tolist(), order.tolist()):
        if t != current:
            current, stack_end, stack_idx = t, [], []
        while stack_end and (e > stack_end[-1] or s >= stack_end[-1]):
            stack_end.pop()
            stack_idx.pop()
        if stack_idx:
            parents[k] = stack_idx[-1]
            depths[k] = len(stack_idx)
        stack_end.append(e)
        stack_idx.append(i)
    parent[order] = parents
    depth[order] = depths
    tree = Tree(parent, depth, np.ones(n, bool))
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
    for i in sorted(candidates.tolist(), key=lambda k: tree.depth[k]):
        p = parent[i]  # always kept: children of folded events were re-pointed to the survivor
        if n_children[p] != 1 or name[p] != name[i]:
            continue
        tree.keep[i] = False
        kids = np.flatnonzero(parent == i)
        parent[kids] = p
        n_children[p] = kids.size
