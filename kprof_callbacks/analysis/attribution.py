"""Who each operator and GPU activity of one trace file's steps belongs to: a module, forward or backward, a line.

The owner of a host event is the innermost of these around it on its thread:
- a module's range (``kprof.module:<name>``, written while a window records when the session has ``model=``): that
  module, forward;
- an autograd node (``autograd::engine::evaluate_function: XBackward0``): the owner of the forward operator that made
  it (the one with its ``Sequence number`` on the forward thread it names), backward;
- a compiled graph's call (``## Call CompiledFxGraph ... ##``): per GPU kernel, the modules of its recorded call
  (``graphs.py``), forward or backward as the graph is; what matches no recorded call is "(unattributed)";
- an optimizer's ``step``/``zero_grad`` range: "(optimizer)"; data loading: "(data loading)";
- none of these (or only Lightning's ``training_step``/``backward`` labels): "(outside modules)".
A GPU activity belongs to the owner of the host call that launched it (for CUDA graph replays: the
``cudaGraphLaunch``). By line: eager operators go to the innermost frame of the user's own code around them
(``with_stack=True``; library frames folded: torch, Lightning, kprof, the standard library, site-packages),
named with the call it made there (``train.py(12): step > cross_entropy``); a backward operator to its forward
operator's line; compiled kernels to the lines of their recorded call.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections import Counter

import numpy as np

from .. import layout
from . import graphs as recorded
from . import losshead
from .compiled_calls import CompiledCalls, short_path
from .events import OP, PYTHON, RUNTIME, Events, launch_times
from .modules import rollup_steps
from .ops import HostCosts, Totals
from .owners import (
    DATA_RANGE,
    GRAPH,
    MODULE,
    NODE,
    NONE,
    OPTIMIZER_RANGE,
    SPECIAL,
    UNATTRIBUTED,
    Owners,
    Shares,
    Table,
    classes,
    duration,
    launchers,
    nearest,
)
from .steps import StepTimes, Windows
from .tree import Tree

_FRAME = re.compile(r"^(?P<file>.+)\((?P<line>\d+)\): (?P<func>.+)$")  # with_stack's Python frames
_FOLDED = ("torch", "lightning", "pytorch_lightning", "lightning_fabric", "kprof_callbacks", "torchmetrics", "triton")


@dataclasses.dataclass
class FileAttribution:
    """One file's shares: (name, direction) -> [calls, CPU us, GPU us] of the module itself (its children are
    rows of their own), (line, direction) -> [CPU us, GPU us], per step the time of every module row (children
    included, ``blocks.*`` instances grouped: GPU time, or CPU time without a GPU) for kprof.diff, what ran
    compiled, and the loss head's evidence."""

    modules: Totals
    lines: Totals
    step_names: list[str]
    step_time: np.ndarray  # (len(step_names), steps)
    compiled: dict
    loss_head: losshead.Evidence


def _host_steps(tl: Events, times: StepTimes) -> Windows:
    """The steps' host ranges (``perstep``'s windows): what starts in one belongs to that step."""
    if tl.steps.shape[0] == 0:
        return times.windows
    return Windows(tl.steps[:, 0], tl.steps[:, 1], tl.steps[:, 2])


def _cpu_shares(tl: Events, owners: Owners, costs: HostCosts, step: np.ndarray, shares: Shares) -> None:
    """Host time: module ranges (forward), autograd nodes (backward), compiled graph calls (the module around them),
    optimizer, data-loading and Lightning's step ranges, each less the ones of these in it; and the self time of the
    operators outside all of them."""
    kind, parent = owners.kind, owners.tree.parent
    timed = kind != NONE
    rows = np.flatnonzero(timed)
    outer = np.where(parent[rows] >= 0, nearest(owners.tree, timed, owners.by_level)[np.maximum(parent[rows], 0)], -1)
    own = duration(tl, rows)
    target, direction = owners.cpu_target(rows)
    ranges = np.isin(kind[rows], (OPTIMIZER_RANGE, DATA_RANGE))  # one in another (Lightning's and torch's) is one call
    again = ranges & (outer >= 0) & (kind[np.maximum(outer, 0)] == kind[rows])
    calls = np.isin(kind[rows], (MODULE, NODE)) | (ranges & ~again)
    shares.add(target, direction, step[rows], cpu=own, calls=calls.astype(np.float64))
    nested = outer >= 0
    target, direction = owners.cpu_target(outer[nested])
    shares.add(target, direction, step[outer[nested]], cpu=-own[nested])
    loose = np.flatnonzero((owners.owner_kind == NONE) & np.isin(tl.host.kind, (OP, RUNTIME)))
    shares.add(owners.target[loose], owners.direction[loose], step[loose], cpu=costs.self_cpu[loose])


def _folded(file: str) -> bool:
    """Whether a Python frame's file is library code: torch, Lightning, kprof, the standard library, installed
    packages, or no file at all (``<frozen ...>``)."""
    first = file.replace("\\", "/").split("/")[0]
    return (
        file.startswith("<")
        or "torchinductor_" in file  # the wrappers inductor generates
        or first in _FOLDED
        or first.removesuffix(".py") in sys.stdlib_module_names
        or "site-packages" in file
        or "dist-packages" in file
    )


def _callee(name: str) -> str:
    """What a frame called, shortly: ``cross_entropy``, ``square`` (a built-in method), ``Linear`` (a module)."""
    found = _FRAME.match(name)
    if found:
        return found["func"]
    if name.startswith("nn.Module: "):  # nn.Module: Linear_0
        return name[len("nn.Module: ") :].rpartition("_")[0] or name
    for head in ("<built-in method ", "<built-in function "):  # <built-in method square of Tensor object at 0x...>
        if name.startswith(head):
            return name[len(head) :].split(" ")[0].rstrip(">")
    return name[:40]


def eager_lines(tl: Events, owners: Owners, table: Table) -> np.ndarray:
    """Per host event: the line (table id) of the innermost frame of the user's code around it, with the call it
    made there; -1 without Python frames (``with_stack=False``)."""
    host, names = tl.host, tl.names
    python = host.kind == PYTHON
    out = np.full(host.name.size, -1, np.int64)
    if not python.any():
        return out
    frames = [_FRAME.match(n) for n in names]
    user_name = np.array([m is not None and not _folded(m["file"]) for m in frames], bool)
    is_user = python & user_name[host.name]
    user = np.where(is_user, np.arange(host.name.size), -1)
    callee = np.full(host.name.size, -1, np.int64)
    parent = owners.tree.parent
    for idx in owners.by_level[1:]:
        idx = idx[~is_user[idx]]
        p = parent[idx]
        user[idx] = user[p]
        first = python[idx] & (user[p] >= 0) & (callee[p] < 0)  # the outermost frame below the user's
        callee[idx] = np.where(first, idx, callee[p])
    has = user >= 0
    width = len(names) + 1
    pairs = host.name[user[has]].astype(np.int64) * width + np.where(callee >= 0, host.name[callee], -1)[has] + 1
    keys, inverse = np.unique(pairs, return_inverse=True)
    ids = []
    for frame, call in zip((keys // width).tolist(), (keys % width - 1).tolist()):
        m = frames[frame]
        text = f"{short_path(m['file'] + ':' + m['line'])} {m['func']}"
        text += f" > {_callee(names[call])}" if call >= 0 else ""
        ids.append(table[text])
    out[has] = np.array(ids, np.int64)[inverse.reshape(-1)] if ids else -1
    return out


def analyze(tl: Events, tree: Tree, costs: HostCosts, times: StepTimes) -> FileAttribution | None:
    """The module and line shares of one trace file; None when it holds nothing to attribute (no module ranges, no
    compiled graph calls, no Python frames)."""
    kinds = classes(tl.names)[tl.host.name]
    if not ((kinds == MODULE).any() or (kinds == GRAPH).any() or (tl.host.kind == PYTHON).any()):
        return None
    table, line_table = Table(), Table()
    for special in ("", *SPECIAL):
        table[special]  # noqa: B018 (numbered first: the root and the rows that are no module)
    owners = Owners(tl, tree, table)
    record = recorded.read(layout.graphs_path(tl.source.path.parent, tl.source.worker))
    steps = _host_steps(tl, times)
    host_step = steps.index_of(tl.host.start)
    shares, lines = Shares(), Shares()
    _cpu_shares(tl, owners, costs, host_step, shares)
    line_of = eager_lines(tl, owners, line_table)
    made = owners.forward[np.maximum(owners.owner, 0)]
    line_of = np.where((owners.owner_kind == NODE) & (made >= 0), line_of[np.maximum(made, 0)], line_of)
    ops = np.flatnonzero((tl.host.kind == OP) & (owners.owner_kind != GRAPH))  # compiled code: by the record
    lines.add(line_of[ops], owners.direction[ops], host_step[ops], cpu=costs.self_cpu[ops])
    compiled = CompiledCalls(tl, owners, table, record)
    launcher = launchers(tl)
    dev_step = steps.index_of(launch_times(tl))  # a GPU activity is the step's that launched it (perstep.py)
    matched = _gpu_shares(tl, owners, compiled, launcher, dev_step, shares, lines, line_of, line_table)
    n = steps.lo.size
    modules, grid = shares.totals(table.names, n)
    line_totals, _ = lines.totals(line_table.names, n)
    head = _loss_head(tl, owners, compiled, launcher, matched, dev_step, steps.number)
    step_names, step_time = rollup_steps(table.names, grid[1] if tl.device.start.size else grid[0])
    compiled.relabel()
    return FileAttribution(modules, line_totals, step_names, step_time, compiled.summary(steps), head)


def _gpu_shares(
    tl: Events,
    owners: Owners,
    compiled: CompiledCalls,
    launcher: np.ndarray,
    step: np.ndarray,
    shares: Shares,
    lines: Shares,
    line_of: np.ndarray,
    line_table: Table,
) -> np.ndarray:
    """Share each GPU activity's time (in ``step``, by ``launcher``) by its launcher's owner (compiled graph calls, and
    activities launched before the trace: by the record); returns each activity's matched recorded call
    (``CompiledCalls.kernels``; -1 elsewhere)."""
    dev = tl.device
    matched = np.full(dev.start.size, -1, np.int64)
    if not dev.start.size:
        return matched
    dur = (dev.end - dev.start) / 1000.0
    h = np.maximum(launcher, 0)
    in_graph = (launcher >= 0) & (owners.owner_kind[h] == GRAPH)
    eager = (launcher >= 0) & ~in_graph
    shares.add(owners.target[h[eager]], owners.direction[h[eager]], step[eager], gpu=dur[eager])
    lines.add(line_of[h[eager]], owners.direction[h[eager]], step[eager], gpu=dur[eager])
    lost = np.flatnonzero(launcher < 0)
    if lost.size:
        matched[lost] = compiled.unlaunched(lost, step[lost], shares, lines, line_table)
    graph = np.flatnonzero(in_graph)
    if graph.size:
        matched[graph] = compiled.kernels(graph, owners.owner[h[graph]], step[graph], shares, lines, line_table)
    return matched


def _loss_head(
    tl: Events,
    owners: Owners,
    compiled: CompiledCalls,
    launcher: np.ndarray,
    matched: np.ndarray,
    step: np.ndarray,
    numbers: np.ndarray,
) -> losshead.Evidence:
    """GPU time on the logits by step (``step``: each GPU activity's, ``numbers``: their step numbers; eager: from
    recorded shapes, compiled: from the record), and the rows it went to."""
    found, dev = losshead.Evidence(), tl.device
    if not dev.start.size:
        return found
    weight = np.zeros(dev.start.size)
    flagged, found.logits = losshead.eager_logits(tl)
    if flagged.any():
        inside = nearest(owners.tree, flagged, owners.by_level) >= 0
        weight = np.where(launcher >= 0, inside[np.maximum(launcher, 0)], 0.0)
    calls, logits = losshead.compiled_logits(compiled.record)
    for shape, sizes in logits.items():
        found.logits.setdefault(shape, Counter()).update(sizes)
    if calls:
        codes = np.array([g * 2**32 + c for g, c in calls], np.int64)
        weight = np.maximum(weight, np.isin(matched, codes))
    head = np.flatnonzero((weight > 0) & (step >= 0))
    if not head.size:
        return found
    dur = (dev.end - dev.start)[head] / 1000.0 * weight[head]
    who = (tl.source.rank, tl.source.worker)
    for k, us in zip(step[head].tolist(), dur.tolist()):
        if k >= 0:
            found.gpu_us[(*who, int(numbers[k]))] += us
    names = compiled.table.names
    for i, us in zip(head.tolist(), dur.tolist()):
        h = launcher[i]
        if matched[i] >= 0:
            target = compiled.targets_of(int(matched[i] >> 32), int(matched[i] & 0xFFFFFFFF), -1)[0][0]
        else:
            target = owners.target[h] if h >= 0 else compiled.table[UNATTRIBUTED]
        found.rows[names[target]] += us
    return found
