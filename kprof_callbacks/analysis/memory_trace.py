"""Memory at each step's peak, from one trace's `[memory]` events (``profile_memory=True``): what was alive then,
of which kind and allocated where.

Each allocation is paired with its free by address, so every block's lifetime is known from the allocation to the
free (or to the end of the trace). At a step's peak (its highest total allocated) the blocks alive are sorted into
kinds as torch's memory profiler (torch/profiler/_memory_profiler.py) names them, here from the phases the block
was allocated and freed in (`memory_context`):

- activations: allocated in forward and alive past it (saved for backward, or outputs);
- temporaries: allocated and freed within the same forward, backward, optimizer step or other stretch;
- gradients: allocated in backward and alive past it (until ``zero_grad``), and blocks from before the trace freed
  by ``zero_grad``;
- optimizer state: allocated in the optimizer step and alive past it;
- inputs: allocated in forward by a copy from the host (the batch);
- parameters, optimizer state, gradients from before the trace: what the allocator held before the trace and still
  held at the peak is the total allocated less the blocks the trace saw; the session's note (the bytes of the
  optimizers' parameters, gradients and state when the window began) splits it, the rest is "persistent";
- other: allocated after the last backward, outside the optimizer (gradient clipping, logging), alive past it.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from . import memory_context as mc
from .events import Events
from .memory import BEFORE, KINDS, STEP_KINDS, MemoryBlock, MemoryStep, ModuleMemory, RepeatedModule
from .memory_detail import blocks, curve, module_kinds, phases, repeated
from .steps import Windows, memory_rows
from .tree import Tree

CURVE_POINTS = 400  # the allocated-memory curve of the shown step, at most this many points
TOP_BLOCKS = 20  # the largest blocks alive at the shown step's peak
TOP_MODULES = 12  # modules kept per step for kprof.diff
OPTIMIZER = "(optimizer)"
_K = {k: i for i, k in enumerate(KINDS)}
_NEVER = np.iinfo(np.int64).max


@dataclasses.dataclass
class FileMemory:
    """One trace's memory: a row per step, and the whole picture of its median step (by peak)."""

    device: str
    steps: list[MemoryStep]
    shown: MemoryStep | None = None
    curve: list[list[float]] = dataclasses.field(default_factory=list)
    phases: list[list] = dataclasses.field(default_factory=list)
    blocks: list[MemoryBlock] = dataclasses.field(default_factory=list)
    modules: list[ModuleMemory] = dataclasses.field(default_factory=list)
    repeated: list[RepeatedModule] = dataclasses.field(default_factory=list)
    note: dict | None = None


@dataclasses.dataclass
class _Blocks:
    """The trace's memory events in time order, with each one's partner and what the analysis made of it."""

    time: np.ndarray
    nbytes: np.ndarray
    total: np.ndarray
    reserved: np.ndarray
    partner: np.ndarray  # an allocation: the index of its free (n: never); a free: its allocation's (-1: before)
    kind: np.ndarray  # per event, index into KINDS (allocations, and frees of blocks from before the trace)
    sites: mc.Sites


def _partners(addr: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    """Pair each allocation with the next event at its address when that is a free; a free with no allocation before
    it at its address is of a block from before the trace (-1)."""
    n = addr.size
    partner = np.where(nbytes > 0, n, -1)
    order = np.lexsort((np.arange(n), addr))
    same = addr[order][1:] == addr[order][:-1]
    first, second = order[:-1][same], order[1:][same]
    pair = (nbytes[first] > 0) & (nbytes[second] < 0)
    partner[first[pair]], partner[second[pair]] = second[pair], first[pair]
    reused = (nbytes[first] > 0) & (nbytes[second] > 0)  # a free the trace missed: the block ended at the reuse
    partner[first[reused]] = second[reused]
    return partner


def _kinds(b: _Blocks, n: int) -> np.ndarray:
    """Each allocation's kind from the phases it began and ended in (and the step windows of both)."""
    s = b.sites
    alloc = b.nbytes > 0
    end = np.minimum(b.partner, n - 1)
    freed = alloc & (b.partner < n)
    same = freed & (s.window[end] == s.window) & (s.window >= 0) & (s.phase[end] == s.phase)
    if s.window.size:  # within one phase stretch: no backward ends between the two ends of the block
        same &= ~((s.phase == mc.FORWARD) & (b.time[end] >= _next_backward(b, s)))
    kind = np.full(n, _K["other"], np.int8)
    kind[alloc & (s.phase == mc.FORWARD)] = _K["activations"]
    kind[alloc & (s.phase == mc.FORWARD) & s.from_host] = _K["inputs"]
    kind[alloc & (s.phase == mc.BACKWARD)] = _K["gradients"]
    kind[alloc & (s.phase == mc.OPTIMIZER)] = _K["optimizer_state"]
    kind[same] = _K["temporaries"]
    before = (b.nbytes < 0) & (b.partner < 0)
    kind[before] = np.where(s.phase[before] == mc.ZERO_GRAD, _K["gradients"], _K["persistent"])
    return kind


def _next_backward(b: _Blocks, s: mc.Sites) -> np.ndarray:
    """Per event: when the next backward event of the trace happens (never: the largest int64)."""
    times = np.append(b.time[s.phase == mc.BACKWARD], _NEVER)
    return times[np.searchsorted(times, b.time, side="right")]


def _blocks(tl: Events, tree: Tree, win: Windows) -> _Blocks | None:
    mem = tl.memory
    rows = np.flatnonzero(memory_rows(tl))
    if not rows.size:
        return None
    rows = rows[np.argsort(mem.time[rows], kind="stable")]
    time, nbytes = mem.time[rows], mem.nbytes[rows]
    sites = mc.sites(tl, tree, win, time, mem.thread[rows])
    b = _Blocks(time, nbytes, mem.allocated[rows], mem.reserved[rows], _partners(mem.addr[rows], nbytes), None, sites)
    b.kind = _kinds(b, rows.size)
    return b


def _alive(b: _Blocks, at: int) -> np.ndarray:
    """Indices of the events whose blocks are alive just after event ``at``: allocations at or before it not yet
    freed, and blocks from before the trace freed after it."""
    idx = np.arange(b.time.size)
    alloc = (b.nbytes > 0) & (idx <= at) & (b.partner > at)
    before = (b.nbytes < 0) & (b.partner < 0) & (idx > at)
    return np.flatnonzero(alloc | before)


def _residual(total: int, seen: int, note: dict | None) -> dict[str, int]:
    """What the allocator held at the peak that the trace never saw allocated: split by the session's note into
    parameters, optimizer state and gradients, the rest persistent."""
    left = max(total - seen, 0)
    out = {}
    for kind in ("parameters", "optimizer_state", "gradients"):
        out[kind] = min(left, int((note or {}).get(kind, 0)))
        left -= out[kind]
    out["persistent"] = left
    return out


def _step_row(b: _Blocks, tl: Events, win: Windows, i: int, note: dict | None) -> tuple[MemoryStep, np.ndarray] | None:
    """Step window ``i``'s peak: its row, and the events alive then."""
    mine = np.flatnonzero(b.sites.window == i)
    if not mine.size:
        return None
    at = int(mine[np.argmax(b.total[mine])])
    alive = _alive(b, at)
    size = np.abs(b.nbytes[alive])
    kinds = np.bincount(b.kind[alive], weights=size, minlength=len(KINDS)).astype(np.int64)
    by_kind = {k: int(v) for k, v in zip(KINDS, kinds.tolist())}
    for kind, value in _residual(int(b.total[at]), int(size.sum()), note).items():
        by_kind[kind] += value
    modules = _by_module(b, alive, size)
    top = dict(sorted(modules.items(), key=lambda kv: -kv[1])[:TOP_MODULES])
    s = b.sites
    made = np.isin(b.kind[alive], [_K[k] for k in STEP_KINDS])
    row = MemoryStep(
        step=int(win.number[i]),
        rank=tl.source.rank,
        worker=tl.source.worker,
        peak=int(b.total[at]),
        reserved=int(b.reserved[at]),
        at_us=float(b.time[at] - win.start[i]) / 1e3,
        phase=mc.PHASES[s.phase[at]],
        where=_where(s, at),
        kinds=by_kind,
        modules=top,
        largest=int(size[made].max(initial=0)),
    )
    return row, alive


def _where(s: mc.Sites, at: int) -> str:
    return s.names[s.where[at]] if s.where[at] >= 0 else (s.names[s.op[at]] if s.op[at] >= 0 else "")


def _site_names(b: _Blocks, alive: np.ndarray) -> list[str]:
    """The module (or site) each alive block was allocated in; optimizer state in the optimizer, blocks from before
    the trace under BEFORE."""
    s = b.sites
    out = []
    for i in alive.tolist():
        if b.nbytes[i] < 0:
            out.append(BEFORE)
        elif s.phase[i] in (mc.OPTIMIZER, mc.ZERO_GRAD):
            out.append(OPTIMIZER)
        else:
            out.append(_where(s, i) or "(no operator)")
    return out


def _by_module(b: _Blocks, alive: np.ndarray, size: np.ndarray) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, nbytes in zip(_site_names(b, alive), size.tolist()):
        out[name] = out.get(name, 0) + nbytes
    return out


def memory_of(tl: Events, tree: Tree, win: Windows) -> FileMemory | None:
    """The memory of one trace's steps, None when it recorded no memory events."""
    b = _blocks(tl, tree, win)
    if b is None:
        return None
    note = tl.source.memory_note
    note_dict = None if note is None else {f: getattr(note, f) for f in note.__struct_fields__}
    rows = [_step_row(b, tl, win, i, note_dict) for i in range(win.lo.size)]
    found = [r for r in rows if r is not None]
    device = "cuda" if np.isin(tl.memory.device, (1, 6)).any() else "cpu"
    out = FileMemory(device, [r for r, _ in found], note=note_dict)
    if found:
        order = sorted(range(len(found)), key=lambda k: (found[k][0].peak, k))
        shown, alive = found[order[(len(order) - 1) // 2]]
        _detail(out, b, tl, win, shown, alive)
    return out


def _detail(out: FileMemory, b: _Blocks, tl: Events, win: Windows, shown: MemoryStep, alive: np.ndarray) -> None:
    """The shown step's curve, phases, largest blocks, modules by kind and repeated modules."""
    i = int(np.flatnonzero(win.number == shown.step)[0])
    out.shown = shown
    out.curve = curve(b.time, b.total, b.sites.window == i, win.start[i], CURVE_POINTS)
    out.phases = phases(b.time, b.sites.phase, b.sites.window == i, win.start[i])
    names = _site_names(b, alive)
    out.blocks = blocks(b, tl, alive, names, win.start[i], TOP_BLOCKS)
    out.modules = module_kinds(b, alive, names, _residual(shown.peak, int(np.abs(b.nbytes[alive]).sum()), out.note))
    out.repeated = repeated(b, tl, alive, names, win, i)
