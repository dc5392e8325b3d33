"""Operator, label and kernel tables: per-event costs from the call tree, summed per name.

Self time is an event's duration minus its direct children's (same thread), GPU time of an
op is the time of the kernels whose `External id` is the op's (after folding same-name
children, see tree.py), and memory of an op is the sum of the `[memory]` records inside
its time range, all as in torch's key_averages().
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np

from .events import (
    ANNOTATION,
    CPU_MEMORY,
    CUDA_MEMORY,
    DEVICE_KINDS,
    MODULE_PREFIX,
    OP,
    RUNTIME,
    Events,
    is_collective_name,
    match,
    unique_ids,
)
from .tables import KernelStats, LabelStats, OpStats
from .tree import Tree

Totals = dict[tuple[str, ...], np.ndarray]
"""Row key -> summed statistics vector; merged across files by adding vectors."""


@dataclasses.dataclass
class HostCosts:
    """Per host event: time (us) and memory (bytes), total and self."""

    cpu: np.ndarray
    self_cpu: np.ndarray
    cuda: np.ndarray
    self_cuda: np.ndarray
    cpu_memory: np.ndarray
    self_cpu_memory: np.ndarray
    cuda_memory: np.ndarray
    self_cuda_memory: np.ndarray


def launcher_of_device_events(tl: Events) -> np.ndarray:
    """For each device event, the index of the host op or label that launched it (-1 if unknown)."""
    host = tl.host
    owners = np.flatnonzero((host.ext >= 0) & ((host.kind == OP) | (host.kind == ANNOTATION)))
    return match(owners, host.ext, tl.device.ext)


def _memory_inside(tl: Events, devices: tuple[int, ...]) -> np.ndarray:
    """Per host event: bytes allocated minus freed on `devices` during the event (any thread, as torch)."""
    mem = tl.memory
    pick = np.isin(mem.device, devices)
    times, nbytes = mem.time[pick], mem.nbytes[pick]
    if times.size == 0:
        return np.zeros(tl.host.start.size)
    order = np.argsort(times, kind="stable")
    times, running = times[order], np.concatenate([[0], np.cumsum(nbytes[order])])
    lo = np.searchsorted(times, tl.host.start, side="left")
    hi = np.searchsorted(times, tl.host.end, side="right")
    return (running[hi] - running[lo]).astype(np.float64)


def host_costs(tl: Events, tree: Tree) -> HostCosts:
    """Per-event totals and self values for the whole host tree of one trace."""
    host, dev = tl.host, tl.device
    cpu = (host.end - host.start) / 1000.0
    launcher = launcher_of_device_events(tl)
    linked = launcher >= 0
    launched = np.bincount(launcher[linked], weights=(dev.end - dev.start)[linked] / 1000.0, minlength=cpu.size)
    self_cuda = tree.lift_kernels(launched)
    cpu_mem, cuda_mem = _memory_inside(tl, CPU_MEMORY), _memory_inside(tl, CUDA_MEMORY)
    return HostCosts(
        cpu=cpu,
        self_cpu=cpu - tree.children_sum(cpu),
        cuda=tree.subtree_sum(self_cuda),
        self_cuda=self_cuda,
        cpu_memory=cpu_mem,
        self_cpu_memory=cpu_mem - tree.children_sum(cpu_mem),
        cuda_memory=cuda_mem,
        self_cuda_memory=cuda_mem - tree.children_sum(cuda_mem),
    )


def _group(keys: np.ndarray, columns: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Unique keys and, per key, the sum of each column (rows: keys, cols: columns)."""
    uniq, inverse = unique_ids(keys)
    sums = np.stack([np.bincount(inverse, weights=c, minlength=uniq.size) for c in columns], axis=1)
    return uniq, sums


def op_events(tl: Events, tree: Tree) -> np.ndarray:
    """Indices of the host events the operator table counts: kept aten ops and runtime calls."""
    host = tl.host
    return np.flatnonzero(tree.keep & ((host.kind == OP) | (host.kind == RUNTIME)))


def label_events(tl: Events, tree: Tree) -> np.ndarray:
    """Indices of the record_function labels (not ProfilerStep#N, not c10d's own collective ranges, not the module
    view's ranges)."""
    host, names = tl.host, tl.names
    labels = np.flatnonzero(tree.keep & (host.kind == ANNOTATION))
    if labels.size == 0:
        return labels
    is_label = np.array(
        [not (n.startswith(("ProfilerStep#", MODULE_PREFIX)) or is_collective_name(n)) for n in names], bool
    )
    return labels[is_label[host.name[labels]]]


def op_totals(tl: Events, tree: Tree, costs: HostCosts, *, by_shape: bool) -> Totals:
    """Operators (aten ops and runtime calls) per name, or per (name, input shapes)."""
    host = tl.host
    rows = op_events(tl, tree)
    if rows.size == 0:
        return {}
    width = len(tl.shapes) + 1 if by_shape else 1  # key: name * width + (shape + 1), or the name alone
    keys = host.name[rows].astype(np.int64) * width + (host.shape[rows] + 1 if by_shape else 0)
    values = [np.ones(rows.size)] + [getattr(costs, f.name)[rows] for f in dataclasses.fields(costs)]
    uniq, sums = _group(keys, values)
    shapes = [""] + tl.shapes
    return {(tl.names[k // width], shapes[k % width]): s for k, s in zip(uniq.tolist(), sums)}


def label_totals(tl: Events, tree: Tree, costs: HostCosts) -> Totals:
    """record_function labels per name (see label_events)."""
    labels = label_events(tl, tree)
    if labels.size == 0:
        return {}
    uniq, sums = _group(tl.host.name[labels], [np.ones(labels.size), costs.cpu[labels], costs.cuda[labels]])
    return {(tl.names[k],): s for k, s in zip(uniq.tolist(), sums)}


def label_nesting(tl: Events, tree: Tree) -> set[tuple[str, str]]:
    """(outer, inner) label names where an `inner` label ran inside an `outer` one (its nearest enclosing label).

    Under Lightning, torch's `Optimizer.step#...` label holds the closure's forward and backward: a table that
    shows both counts that time twice, and says so with these pairs.
    """
    inner = label_events(tl, tree)
    is_label = np.zeros(tl.host.name.size, bool)
    is_label[inner] = True
    outer = np.full(inner.size, -1)
    node = tree.parent[inner]
    todo = np.flatnonzero(node >= 0)
    while todo.size:  # one pass per nesting level, up to each label's nearest enclosing label
        hit = is_label[node[todo]]
        outer[todo[hit]] = node[todo[hit]]
        todo = todo[~hit]
        node[todo] = tree.parent[node[todo]]
        todo = todo[node[todo] >= 0]
    found = outer >= 0
    pairs = np.unique(np.stack([tl.host.name[outer[found]], tl.host.name[inner[found]]], axis=1), axis=0)
    return {(tl.names[a], tl.names[b]) for a, b in pairs.tolist() if a != b}


def kernel_totals(tl: Events) -> Totals:
    """GPU activities per (name, kind): count, total and longest duration."""
    dev = tl.device
    if dev.name.size == 0:
        return {}
    keys = dev.name.astype(np.int64) * len(DEVICE_KINDS) + dev.kind
    uniq, inverse = unique_ids(keys)
    dur = (dev.end - dev.start) / 1000.0
    longest = np.zeros(uniq.size)
    np.maximum.at(longest, inverse, dur)
    count = np.bincount(inverse, minlength=uniq.size)
    total = np.bincount(inverse, weights=dur, minlength=uniq.size)
    return {
        (tl.names[k // len(DEVICE_KINDS)], DEVICE_KINDS[k % len(DEVICE_KINDS)]): np.array([c, t, m])
        for k, c, t, m in zip(uniq.tolist(), count, total, longest)
    }


def _merge(parts: Iterable[Totals], max_column: int | None = None) -> Totals:
    """Add statistics vectors of the same key across files (`max_column` takes the maximum instead)."""
    out: Totals = {}
    for part in parts:
        for key, vec in part.items():
            if key not in out:
                out[key] = vec.copy()
                continue
            merged = out[key] + vec
            if max_column is not None:
                merged[max_column] = max(out[key][max_column], vec[max_column])
            out[key] = merged
    return out


def op_rows(parts: Iterable[Totals]) -> list[OpStats]:
    """Operator rows over all files, by self CPU time."""
    rows = []
    for (name, shapes), v in _merge(parts).items():
        calls, cpu, self_cpu, cuda, self_cuda, *memory = v.tolist()
        rows.append(OpStats(name, shapes, int(calls), cpu, self_cpu, cuda, self_cuda, *(int(round(m)) for m in memory)))
    return sorted(rows, key=lambda r: -r.self_cpu_us)


def label_rows(parts: Iterable[Totals], step_total_us: float, nesting: set[tuple[str, str]]) -> list[LabelStats]:
    """Label rows over all files, by total time; `step_total_us` is the summed wall time of all steps, `nesting` the
    (outer, inner) pairs of `label_nesting` over all files."""
    rows = []
    for (name,), v in _merge(parts).items():
        count, total, cuda = v.tolist()
        inside = tuple(sorted(inner for outer, inner in nesting if outer == name))
        rows.append(
            LabelStats(
                name, int(count), total, total / count, cuda, total / step_total_us if step_total_us else 0.0, inside
            )
        )
    return sorted(rows, key=lambda r: -r.total_us)


def kernel_rows(parts: Iterable[Totals]) -> list[KernelStats]:
    """GPU activity rows over all files, by total time."""
    rows = []
    for (name, kind), v in _merge(parts, max_column=2).items():
        count, total, longest = v.tolist()
        rows.append(KernelStats(name, kind, int(count), total, total / count, longest))
    return sorted(rows, key=lambda r: -r.total_us)
