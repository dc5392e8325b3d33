"""The owner of each host event of a trace: the innermost module range, autograd node, compiled graph call,
optimizer or data-loading range around it on its thread, and the target (a module, or a row that is no module) and
direction (forward, backward) that owner gives. ``attribution.py`` shares time out by them."""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from .eventcolumns import AUTOGRAD_NODE
from .events import MODULE_PREFIX, RUNTIME, Events, match
from .ops import Totals, launcher_of_device_events
from .steps import is_dataloader_name
from .tree import Tree

OPTIMIZER, OUTSIDE, DATA, UNATTRIBUTED = "(optimizer)", "(outside modules)", "(data loading)", "(unattributed)"
SPECIAL = (OPTIMIZER, DATA, OUTSIDE, UNATTRIBUTED)  # rows that are no module, in the order tables show them
FORWARD, BACKWARD, NEITHER = "forward", "backward", ""
DIRECTIONS = (FORWARD, BACKWARD, NEITHER)
NONE, MODULE, NODE, GRAPH, OPTIMIZER_RANGE, DATA_RANGE, FORWARD_LABEL, BACKWARD_LABEL = range(8)
NODE_PREFIX = AUTOGRAD_NODE
GRAPH_CALL = re.compile(r"^## Call CompiledFxGraph (.*) ##$")
REGION = re.compile(r"^Torch-Compiled Region: (?:.*?)(\d+)/(\d+)$")
_LIGHTNING_STEPS = ("training_step", "validation_step", "test_step", "predict_step")  # ProfilerCallback's labels
_SEQ_BITS = 40  # sequence numbers are per thread and count up from 0: below 2**40 in any run


def levels(tree: Tree) -> list[np.ndarray]:
    """Host event indices by depth, outermost first: a walk over them meets every parent before its children."""
    order = np.argsort(tree.depth.astype(np.int16), kind="stable")  # 16-bit keys: numpy's radix sort
    bounds = np.searchsorted(tree.depth[order], np.arange(int(tree.depth.max(initial=0)) + 2))
    return [order[lo:hi] for lo, hi in zip(bounds, bounds[1:])]


def nearest(tree: Tree, marked: np.ndarray, by_level: list[np.ndarray]) -> np.ndarray:
    """For each host event: itself when ``marked``, else its nearest marked ancestor; -1 when there is none."""
    out = np.where(marked, np.arange(marked.size), -1)
    for idx in by_level[1:]:
        idx = idx[~marked[idx]]
        out[idx] = out[tree.parent[idx]]
    return out


def classes(names: list[str]) -> np.ndarray:
    """Per name: which kind of owner an event of that name is (module range, autograd node, ...)."""

    def kind(n: str) -> int:
        if n.startswith(MODULE_PREFIX):
            return MODULE
        if n.startswith(NODE_PREFIX):
            return NODE
        if GRAPH_CALL.match(n):
            return GRAPH
        if n.startswith(("Optimizer.step#", "Optimizer.zero_grad#")) or n in ("optimizer_step", "zero_grad"):
            return OPTIMIZER_RANGE
        if is_dataloader_name(n):
            return DATA_RANGE
        if n in _LIGHTNING_STEPS:
            return FORWARD_LABEL
        return BACKWARD_LABEL if n == "backward" else NONE

    return np.array([kind(n) for n in names] or [NONE], np.int8)


def forward_ops(tl: Events, node: np.ndarray, forward: np.ndarray) -> np.ndarray:
    """For each autograd node event in ``node``: the forward operator that made it (of the events ``forward`` allows:
    none inside a node), -1 where none is found.

    A node carries the sequence number its forward operator had and that operator's thread in torch's own
    numbering (``Fwd thread id``); the trace names threads otherwise, so each such number is taken to be the trace
    thread whose forward operators hold most of its nodes' sequence numbers. Of the operators of a thread with one
    sequence number (a composite operator and those in it see it too), the node's maker is the last to start."""
    host = tl.host
    fwd = np.flatnonzero((host.seq >= 0) & forward)
    out = np.full(node.size, -1, np.int64)
    if fwd.size == 0 or node.size == 0:
        return out
    fwd = fwd[np.argsort(host.start[fwd], kind="stable")]
    key = host.thread[fwd].astype(np.int64) << _SEQ_BITS | host.seq[fwd]
    rev = key[::-1]
    _, last = np.unique(rev, return_index=True)
    makers = fwd[::-1][last]
    threads = np.unique(host.thread[makers])
    made = np.full(node.size, -1, np.int64)
    for tid in np.unique(host.fwd_tid[node]).tolist():
        mine = host.fwd_tid[node] == tid
        counts = [np.isin(host.seq[node[mine]], host.seq[makers[host.thread[makers] == t]]).sum() for t in threads]
        if max(counts) > 0:
            made[mine] = threads[int(np.argmax(counts))]
    query = made << _SEQ_BITS | host.seq[node]
    return match(makers, host.thread.astype(np.int64) << _SEQ_BITS | host.seq, np.where(made >= 0, query, -1))


@dataclasses.dataclass
class Shares:
    """Contributions: each a target, a direction, a step, CPU us, GPU us and calls."""

    target: list[np.ndarray] = dataclasses.field(default_factory=list)
    direction: list[np.ndarray] = dataclasses.field(default_factory=list)
    step: list[np.ndarray] = dataclasses.field(default_factory=list)
    cpu: list[np.ndarray] = dataclasses.field(default_factory=list)
    gpu: list[np.ndarray] = dataclasses.field(default_factory=list)
    calls: list[np.ndarray] = dataclasses.field(default_factory=list)

    def add(self, target, direction, step, cpu=0.0, gpu=0.0, calls=0.0) -> None:
        n = np.broadcast(target, direction, step, cpu, gpu, calls).size
        for field, value in zip(
            (self.target, self.direction, self.step, self.cpu, self.gpu, self.calls),
            (target, direction, step, cpu, gpu, calls),
        ):
            field.append(np.broadcast_to(np.asarray(value), (n,)))

    def totals(self, table: list[str], n_steps: int) -> tuple[Totals, np.ndarray]:
        """(name, direction) -> [calls, CPU, GPU] over the steps, and per target and step (CPU, GPU): an array
        (2, targets, steps)."""
        grid = np.zeros((2, len(table), n_steps))
        if not self.target:
            return {}, grid
        target, direction, step = (np.concatenate(a).astype(np.int64) for a in (self.target, self.direction, self.step))
        cpu, gpu, calls = (np.concatenate(a).astype(np.float64) for a in (self.cpu, self.gpu, self.calls))
        keep = (target >= 0) & (step >= 0)
        target, direction, step, cpu, gpu, calls = (a[keep] for a in (target, direction, step, cpu, gpu, calls))
        key = target * len(DIRECTIONS) + direction
        uniq, inverse = np.unique(key, return_inverse=True)
        sums = [np.bincount(inverse, weights=v, minlength=uniq.size) for v in (calls, cpu, gpu)]
        totals = {
            (table[k // len(DIRECTIONS)], DIRECTIONS[k % len(DIRECTIONS)]): np.array([c, p, g])
            for k, c, p, g in zip(uniq.tolist(), *sums)
        }
        cell = target * n_steps + step
        for row, values in enumerate((cpu, gpu)):
            grid[row] = np.bincount(cell, weights=values, minlength=grid[row].size).reshape(grid[row].shape)
        return totals, grid


class Table(dict):
    """Name -> dense id, in order of first use; ``names`` lists them by id."""

    def __missing__(self, key: str) -> int:
        self[key] = len(self)
        return self[key]

    @property
    def names(self) -> list[str]:
        return list(self)


class Owners:
    """Per host event: its owner event (-1: none), the owner's kind, and the target and direction it gives."""

    def __init__(self, tl: Events, tree: Tree, table: Table) -> None:
        host = tl.host
        self.tree, self.by_level = tree, levels(tree)
        self.kind = classes(tl.names)[host.name]
        self.owner = nearest(tree, self.kind != NONE, self.by_level)
        self.owner_kind = np.where(self.owner >= 0, self.kind[np.maximum(self.owner, 0)], NONE)
        module_of = np.array([table[n[len(MODULE_PREFIX) :]] if n.startswith(MODULE_PREFIX) else -1 for n in tl.names])
        outside, optimizer, data = table[OUTSIDE], table[OPTIMIZER], table[DATA]
        self.root, self.outside, self.ranges = table[""], outside, [optimizer, data]
        eager = np.where(self.owner_kind == MODULE, module_of[host.name[np.maximum(self.owner, 0)]], outside)
        nodes = np.flatnonzero(self.kind == NODE)
        self.forward = np.full(host.name.size, -1, np.int64)  # an autograd node's forward operator
        self.forward[nodes] = forward_ops(tl, nodes, self.owner_kind != NODE)
        made = self.forward[np.maximum(self.owner, 0)]
        by_kind = {
            MODULE: (eager, FORWARD),
            NODE: (np.where(made >= 0, eager[np.maximum(made, 0)], outside), BACKWARD),
            OPTIMIZER_RANGE: (optimizer, NEITHER),
            DATA_RANGE: (data, NEITHER),
            BACKWARD_LABEL: (outside, BACKWARD),
        }
        self.target = np.full(host.name.size, outside, np.int64)
        self.direction = np.full(host.name.size, DIRECTIONS.index(FORWARD), np.int64)
        for kind, (target, direction) in by_kind.items():
            mine = self.owner_kind == kind
            self.target[mine] = target[mine] if isinstance(target, np.ndarray) else target
            self.direction[mine] = DIRECTIONS.index(direction)
        self.target[self.owner_kind == GRAPH] = -1  # per kernel, from the record

    def context(self, event: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For compiled graph calls: the target of what encloses them (a module, or the node of their backward; -1
        for none) and whether they run in a backward."""
        parent = self.tree.parent[event]
        above = np.where(parent >= 0, self.owner[np.maximum(parent, 0)], -1)
        kind = np.where(above >= 0, self.kind[np.maximum(above, 0)], NONE)
        target = np.where(parent >= 0, self.target[np.maximum(parent, 0)], -1)
        return target, (kind == NODE) | (kind == BACKWARD_LABEL)

    def cpu_target(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The target and direction host time of ``rows`` goes to: their own, but for compiled graph calls what is
        around them (a module, an optimizer's step; the model where nothing is), forward or backward as where they
        run."""
        target, direction = self.target[rows].copy(), self.direction[rows].copy()
        graph = self.kind[rows] == GRAPH
        around, backward = self.context(rows[graph])
        model = (around < 0) | (around == self.outside)  # a compiled model's call: the model's
        target[graph] = np.where(model, self.root, around)
        ranged = np.isin(target[graph], self.ranges)
        pass_of = np.where(backward, DIRECTIONS.index(BACKWARD), DIRECTIONS.index(FORWARD))
        direction[graph] = np.where(ranged, DIRECTIONS.index(NEITHER), pass_of)
        return target, direction


def launchers(tl: Events) -> np.ndarray:
    """For each device event, the host event that launched it: its runtime call (a ``cudaGraphLaunch`` for a CUDA
    graph's kernels), else the operator of its external id; -1 when neither is in the trace."""
    host = tl.host
    runtime = match(np.flatnonzero((host.kind == RUNTIME) & (host.corr >= 0)), host.corr, tl.device.corr)
    return np.where(runtime >= 0, runtime, launcher_of_device_events(tl))


def duration(tl: Events, rows: np.ndarray) -> np.ndarray:
    """Host events' durations in microseconds."""
    return (tl.host.end[rows] - tl.host.start[rows]) / 1000.0
