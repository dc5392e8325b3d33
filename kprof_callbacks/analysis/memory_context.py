"""Where each memory event of a trace happened: its phase (forward, backward, optimizer), the module or site that
allocated, and the operator, read from the host call tree around it.

A `[memory]` instant is recorded on the thread that allocated, inside the operator that did; the ranges around that
operator say the rest:
- backward: inside ``autograd::engine::evaluate_function: <Node>`` (on the GPU, the autograd engine's own thread);
- optimizer: inside ``Optimizer.step#...`` (torch records it around every ``optimizer.step()``), and the
  ``Optimizer.zero_grad#...`` range that frees the gradients;
- forward: before the step's last backward, outside those ranges; anything after it is "other" (gradient
  clipping, logging), as is anything outside the profiled steps;
- module: the innermost ``kprof.module:<qualified name>`` range (recorded around each module's forward while a
  window records); a backward node belongs to the module of the forward operator with its sequence number. Without
  those ranges the site is a backward node, else the program's own Python line (``with_stack=True``), else the
  innermost label, else the outermost operator.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..layout import MODULE_PREFIX
from .events import ANNOTATION, OP, PYTHON, Events
from .steps import Windows
from .tree import Tree

PHASES = ("forward", "backward", "optimizer", "zero_grad", "other")
FORWARD, BACKWARD, OPTIMIZER, ZERO_GRAD, OTHER = range(len(PHASES))
BACKWARD_PREFIX = "autograd::engine::evaluate_function: "
_OPTIMIZER_PREFIX, _ZERO_GRAD_PREFIX = "Optimizer.step#", "Optimizer.zero_grad#"
_NOT_LABELS = ("ProfilerStep#", _OPTIMIZER_PREFIX, _ZERO_GRAD_PREFIX, MODULE_PREFIX, "kprof.")
_LIBRARY = ("site-packages", "dist-packages", "torch/", "<built-in", "nn.Module:", "lib/python", "threading.py")


@dataclasses.dataclass
class Sites:
    """Per memory event (in the order given): phase (index into PHASES), the names of its module-or-site and of its
    operators (ids into ``names``), the step window it lies in (-1: none) and whether its operator copied from the
    host (an input batch moved to the GPU)."""

    phase: np.ndarray
    where: np.ndarray
    op: np.ndarray  # the outermost operator (what the program called), -1 when none
    inner: np.ndarray  # the innermost operator (what allocated), -1 when none
    shapes: np.ndarray  # input-shape id (Events.shapes) of the outermost operator, -1 when not recorded
    window: np.ndarray
    from_host: np.ndarray
    names: list[str]
    modules: bool  # the trace has kprof.module ranges


def _inherit(tree: Tree, own: np.ndarray) -> np.ndarray:
    """Each host event's own value, else its nearest ancestor's (-1 means none): parents are done before children."""
    out = own.copy()
    order = np.argsort(tree.depth, kind="stable")
    bounds = np.searchsorted(tree.depth[order], np.arange(1, int(tree.depth.max(initial=0)) + 2))
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        level = order[lo:hi]
        take = level[(out[level] < 0) & (tree.parent[level] >= 0)]
        out[take] = out[tree.parent[take]]
    return out


def _outermost(tree: Tree, mine: np.ndarray) -> np.ndarray:
    """Per host event: the outermost of its ancestors (itself included) where ``mine`` holds, -1 if none."""
    out = np.where(mine, np.arange(mine.size), -1)
    order = np.argsort(tree.depth, kind="stable")
    bounds = np.searchsorted(tree.depth[order], np.arange(1, int(tree.depth.max(initial=0)) + 2))
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        level = order[lo:hi]
        level = level[tree.parent[level] >= 0]
        above = out[tree.parent[level]]
        out[level[above >= 0]] = above[above >= 0]
    return out


def enclosing(tl: Events, tree: Tree, time: np.ndarray, thread: np.ndarray) -> np.ndarray:
    """Per (time, thread): the innermost host event of that thread whose [start, end] holds the time, -1 if none."""
    host = tl.host
    out = np.full(time.size, -1, np.int64)
    for th in np.unique(thread[thread >= 0]).tolist():
        mine = np.flatnonzero(host.thread == th)
        mine = mine[np.lexsort((-host.end[mine], host.start[mine]))]
        at = np.flatnonzero(thread == th)
        pos = np.searchsorted(host.start[mine], time[at], side="right") - 1
        cand = np.where(pos >= 0, mine[np.maximum(pos, 0)], -1)
        for _ in range(int(tree.depth.max(initial=0)) + 1):  # climb to an event that has not ended yet
            out_of = (cand >= 0) & (host.end[np.maximum(cand, 0)] < time[at])
            if not out_of.any():
                break
            cand[out_of] = tree.parent[cand[out_of]]
        out[at] = cand
    return out


def _name_flags(names: list[str], prefix: str | tuple[str, ...]) -> np.ndarray:
    return np.array([n.startswith(prefix) for n in names] or [False], bool)


def _own_phase(tl: Events) -> np.ndarray:
    """Per host event: the phase its own name opens (BACKWARD, OPTIMIZER, ZERO_GRAD), else -1."""
    own = np.full(tl.host.name.size, -1, np.int64)
    for code, prefix in ((BACKWARD, BACKWARD_PREFIX), (OPTIMIZER, _OPTIMIZER_PREFIX), (ZERO_GRAD, _ZERO_GRAD_PREFIX)):
        own[_name_flags(tl.names, prefix)[tl.host.name]] = code
    return own


def _modules(tl: Events, tree: Tree, backward_node: np.ndarray) -> np.ndarray:
    """Per host event: the name id of its module (``kprof.module:`` ranges), a backward node's through the forward
    operator with its sequence number; -1 where none is known."""
    host = tl.host
    is_module = _name_flags(tl.names, MODULE_PREFIX)[host.name] & (host.kind == ANNOTATION)
    module = _inherit(tree, np.where(is_module, host.name, -1))
    forward = np.flatnonzero((host.seq >= 0) & (backward_node < 0) & (module >= 0))
    node = backward_node >= 0
    if forward.size and node.any():
        first = forward[np.unique(host.seq[forward], return_index=True)[1]]
        seq = host.seq[backward_node[node]]
        pos = np.minimum(np.searchsorted(host.seq[first], seq), first.size - 1)
        found = host.seq[first][pos] == seq
        module[np.flatnonzero(node)[found]] = module[first[pos[found]]]
    return module


def _fallback_site(tl: Events, tree: Tree, backward_node: np.ndarray) -> np.ndarray:
    """Per host event, a site name id when no module is known: a backward node (the Python line there is the
    ``backward()`` call), else the program's own Python line, else the innermost label, else the outermost
    operator."""
    host, names = tl.host, tl.names
    user_py = np.array([not any(part in n for part in _LIBRARY) for n in names] or [False], bool)
    line = _inherit(tree, np.where((host.kind == PYTHON) & user_py[host.name], host.name, -1))
    user_label = (host.kind == ANNOTATION) & ~_name_flags(names, _NOT_LABELS)[host.name]
    label = _inherit(tree, np.where(user_label, host.name, -1))
    top = _outermost(tree, host.kind == OP)
    node = np.where(backward_node >= 0, host.name[np.maximum(backward_node, 0)], -1)
    op = np.where(top >= 0, host.name[np.maximum(top, 0)], -1)
    return np.where(node >= 0, node, np.where(line >= 0, line, np.where(label >= 0, label, op)))


def _phases(tl: Events, win: Windows, own: np.ndarray, ctx: np.ndarray, time: np.ndarray) -> np.ndarray:
    """Per memory event: its phase, from the range it is in (``own`` inherited, at ``ctx``), else by time: forward
    before the last backward of its step (or in a step without backward), other after it and outside the steps."""
    window = win.index_of(time)
    last_backward = np.full(win.lo.size, np.iinfo(np.int64).min)
    rows = np.flatnonzero(own == BACKWARD)
    owner = win.index_of(tl.host.start[rows])
    np.maximum.at(last_backward, owner[owner >= 0], tl.host.end[rows][owner >= 0])
    has_backward = last_backward[np.maximum(window, 0)] > np.iinfo(np.int64).min
    by_time = np.where((window >= 0) & (~has_backward | (time < last_backward[np.maximum(window, 0)])), FORWARD, OTHER)
    ranged = np.where(ctx >= 0, own[np.maximum(ctx, 0)], -1)
    return np.where(ranged >= 0, ranged, by_time).astype(np.int8)


def _from_host(tl: Events, tree: Tree) -> np.ndarray:
    """Per host event: whether it runs inside a copy from the host to the GPU (``.to("cuda")``): the operator that
    launched a host-to-device copy and the operators up to two levels above it (``aten::_to_copy``, ``aten::to``),
    with everything they called."""
    from .ops import launcher_of_device_events

    host = tl.host
    htod = np.array(["HtoD" in n for n in tl.names] or [False], bool)[tl.device.name]
    launcher = launcher_of_device_events(tl)[htod]
    marked = np.zeros(host.name.size, bool)
    for _ in range(3):
        launcher = launcher[launcher >= 0]
        launcher = launcher[host.kind[launcher] == OP]
        marked[launcher] = True
        launcher = tree.parent[launcher]
    return _inherit(tree, np.where(marked, 1, -1)) > 0


def sites(tl: Events, tree: Tree, win: Windows, time: np.ndarray, thread: np.ndarray) -> Sites:
    """Phase, module-or-site and operators of memory events at ``time`` on host ``thread``."""
    host = tl.host
    ctx = enclosing(tl, tree, time, thread)
    own = _inherit(tree, _own_phase(tl))
    backward_node = _inherit(tree, np.where(_name_flags(tl.names, BACKWARD_PREFIX)[host.name], np.arange(own.size), -1))
    module = _modules(tl, tree, backward_node)
    site = np.where(module >= 0, module, _fallback_site(tl, tree, backward_node))
    top = _outermost(tree, host.kind == OP)
    inner = _inherit(tree, np.where(host.kind == OP, np.arange(own.size), -1))
    at = np.maximum(ctx, 0)
    found = ctx >= 0

    def pick(values: np.ndarray) -> np.ndarray:
        return np.where(found, values[at], -1)

    names = [n.removeprefix(MODULE_PREFIX).removeprefix(BACKWARD_PREFIX) for n in tl.names]
    return Sites(
        phase=_phases(tl, win, own, ctx, time),
        where=pick(site),
        op=pick(np.where(top >= 0, host.name[np.maximum(top, 0)], -1)),
        inner=pick(np.where(inner >= 0, host.name[np.maximum(inner, 0)], -1)),
        shapes=pick(np.where(top >= 0, host.shape[np.maximum(top, 0)], -1)),
        window=win.index_of(time),
        from_host=pick(_from_host(tl, tree)) > 0,
        names=names,
        modules=bool((module >= 0).any()),
    )
