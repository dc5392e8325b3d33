"""Per-step breakdown: where each step's wall time went (GPU work by kind, host-only, idle).

A step is its `ProfilerStep#N` host range, extended to the end of the last GPU activity
launched inside it and starting no earlier than the previous step's end, as
torch-tb-profiler's overview does (kernels run after the host has moved on). A trace's first step
has no step before it in the trace: where its first GPU activity waited in the queue behind work
from before the trace (the host ran ahead), its wall time starts when that activity did, so a
window's first step is not charged the backlog of the unprofiled steps before it (what runs in it
still belongs to it). Traces without step ranges (no schedule / prof.step(), older torch) are one step covering all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from . import intervals as iv
from .events import (
    ANNOTATION,
    COMM,
    CPU_MEMORY,
    CUDA_MEMORY,
    KERNEL,
    MEMCPY,
    MEMSET,
    OP,
    RUNTIME,
    Events,
    is_collective_name,
    launch_times,
)
from .tables import StepStats
from .tree import Tree

QUEUED_NS = 100_000
"""A GPU activity that started this long after its launch waited behind earlier work (on an idle GPU one starts
within tens of microseconds)."""

WHOLE_TRACE = -1
"""Step number of the single pseudo-step of a trace without ProfilerStep ranges."""


def is_dataloader_name(name: str) -> bool:
    """DataLoader iteration ranges torch records, and our own `data_loading` label."""
    return (
        name.startswith(("enumerate(DataLoader)#", "enumerate(DataPipe)#"))
        or name.rpartition("::")[2] == "data_loading"
    )


@dataclasses.dataclass
class Windows:
    """Step numbers and their [lo, hi) time windows (ns), in time order: what happens in a window belongs to its step.
    ``start`` is where each step's wall time starts: ``lo``, except for a trace's first step when the GPU was still
    running work from before the trace (``windows``)."""

    number: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    start: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.start is None:
            self.start = self.lo

    def index_of(self, times: np.ndarray) -> np.ndarray:
        """Index of the window holding each time, -1 outside all windows."""
        i = np.searchsorted(self.lo, times, side="right") - 1
        ok = (i >= 0) & (times < self.hi[np.maximum(i, 0)])
        return np.where(ok, i, -1)


@dataclasses.dataclass
class StepTimes:
    """One file's steps: table rows plus compute/communication per step for the rank view."""

    windows: Windows
    rows: list[StepStats]
    compute_us: np.ndarray
    comm_us: np.ndarray
    overlap_us: np.ndarray
    compute: iv.Intervals = dataclasses.field(repr=False, default=iv.EMPTY)  # when anything computed, all steps
    stopped_between_steps: bool = False  # the window was cut after a whole step (``Events``): its last step is whole

    def without_last(self) -> StepTimes:
        """The same steps less the last (one a rank's death cut in mid-step)."""
        w = self.windows
        return dataclasses.replace(
            self,
            windows=Windows(w.number[:-1], w.lo[:-1], w.hi[:-1], w.start[:-1]),
            rows=self.rows[:-1],
            compute_us=self.compute_us[:-1],
            comm_us=self.comm_us[:-1],
            overlap_us=self.overlap_us[:-1],
        )


def windows(tl: Events) -> Windows:
    """The step windows of one trace."""
    host, dev = tl.host, tl.device
    if tl.steps.shape[0] == 0:
        lo = min(host.start.min(initial=np.iinfo(np.int64).max), dev.start.min(initial=np.iinfo(np.int64).max))
        hi = max(host.end.max(initial=0), dev.end.max(initial=0))
        return Windows(np.array([WHOLE_TRACE]), np.array([lo]), np.array([hi]))
    number, lo, hi = tl.steps[:, 0].copy(), tl.steps[:, 1].copy(), tl.steps[:, 2].copy()
    start = lo.copy()
    if dev.start.size:
        launch = launch_times(tl)
        owner = Windows(number, lo, hi).index_of(launch)
        launched = owner >= 0
        np.maximum.at(hi, owner[launched], dev.end[launched])
        first = np.flatnonzero(owner == 0)
        if first.size:  # the first step's work waited behind the steps before the trace: its time starts with it
            k = first[np.argmin(dev.start[first])]
            if dev.start[k] - launch[k] > QUEUED_NS:
                start[0] = min(max(lo[0], dev.start[k]), hi[0])
    for i in range(1, lo.size):
        lo[i] = max(lo[i], hi[i - 1])
        hi[i] = max(hi[i], lo[i])
    start[1:] = lo[1:]
    return Windows(number, lo, hi, start)


def _named(tl: Events, predicate: Callable[[str], bool]) -> np.ndarray:
    """Per host event: whether its name satisfies `predicate` (evaluated once per distinct name)."""
    return np.array([predicate(n) for n in tl.names], bool)[tl.host.name]


def _spans(start: np.ndarray, end: np.ndarray, pick: np.ndarray) -> iv.Intervals:
    return iv.union(start[pick], end[pick])


def comm_events(tl: Events) -> tuple[np.ndarray, np.ndarray]:
    """Which host and which device events are communication. With GPU activity: NCCL kernels, and gloo's host
    ranges (c10d's host ops only bracket launches); without: every collective host range (c10d ops, gloo ranges)."""
    collective = _named(tl, is_collective_name)
    host = _named(tl, lambda n: n.startswith("gloo:")) if tl.device.start.size else collective
    return host, tl.device.kind == COMM


def _host_work(tl: Events) -> np.ndarray:
    """Per host event: whether it is host-side work (an operator or runtime call, collectives excepted)."""
    return ((tl.host.kind == OP) | (tl.host.kind == RUNTIME)) & ~_named(tl, is_collective_name)


def _self_spans(tree: Tree, start: np.ndarray, end: np.ndarray, pick: np.ndarray) -> iv.Intervals:
    """When the events `pick` run their own code: each one's range less its children's (of any kind), so a thread
    that waits inside an operator (a hook's all-gather inside a backward node) is not computing."""
    child = np.flatnonzero(tree.parent >= 0)
    child = child[np.lexsort((start[child], tree.parent[child]))]
    parent = tree.parent[child]
    last = np.ones(child.size, bool)
    last[:-1] = parent[1:] != parent[:-1]
    next_start = end[parent].copy()
    next_start[~last] = start[child][1:][~last[:-1]]
    first_child = end.copy()
    first = np.ones(child.size, bool)
    first[1:] = last[:-1]
    first_child[parent[first]] = start[child[first]]
    mine = pick[parent]
    return iv.union(
        np.concatenate([start[pick], end[child[mine]]]), np.concatenate([first_child[pick], next_start[mine]])
    )


def step_times(tl: Events, rank: int | None, tree: Tree) -> StepTimes:
    """Breakdown of every step of one trace (`tree`: its host call tree)."""
    host, dev = tl.host, tl.device
    win = windows(tl)
    loader = _named(tl, is_dataloader_name) & ((host.kind == OP) | (host.kind == ANNOTATION))
    host_comm, dev_comm = comm_events(tl)

    gpu = _spans(dev.start, dev.end, np.ones(dev.start.size, bool))
    kernel, memcpy, memset = (_spans(dev.start, dev.end, dev.kind == k) for k in (KERNEL, MEMCPY, MEMSET))
    comm = iv.merge(_spans(dev.start, dev.end, dev_comm), _spans(host.start, host.end, host_comm))
    cpu = _spans(host.start, host.end, _host_work(tl))
    loader = _spans(host.start, host.end, loader)
    compute = (
        iv.merge(kernel, memcpy, memset) if dev.start.size else _self_spans(tree, host.start, host.end, _host_work(tl))
    )

    def inside(spans: iv.Intervals) -> np.ndarray:
        return iv.length_in(spans, win.start, win.hi) / 1000.0

    wall = (win.hi - win.start) / 1000.0
    busy = inside(gpu)
    columns = {
        "wall_us": wall,
        "gpu_busy_us": busy,
        "gpu_idle_us": wall - busy if dev.start.size else np.zeros(wall.size),
        "kernel_us": inside(kernel),
        "memcpy_us": inside(memcpy),
        "memset_us": inside(memset),
        "comm_us": inside(comm),
        "cpu_only_us": inside(iv.subtract(cpu, gpu)),
        "dataloader_us": inside(loader),
    }
    peak = _peak_memory(tl, win)
    worker = tl.source.worker
    rows = [
        StepStats(
            step=int(n), rank=rank, worker=worker, peak_memory=int(p), **{k: float(v[i]) for k, v in columns.items()}
        )
        for i, (n, p) in enumerate(zip(win.number.tolist(), peak.tolist()))
    ]
    overlap = inside(iv.intersect(compute, comm))
    return StepTimes(win, rows, inside(compute), columns["comm_us"], overlap, compute, tl.stopped_between_steps)


def memory_rows(tl: Events) -> np.ndarray:
    """The memory records the peaks are read from: CUDA memory when recorded, else host memory."""
    cuda = np.isin(tl.memory.device, CUDA_MEMORY)
    return cuda if cuda.any() else np.isin(tl.memory.device, CPU_MEMORY)


def _peak_memory(tl: Events, win: Windows) -> np.ndarray:
    """Highest total allocation per step (of `memory_rows`)."""
    mem = tl.memory
    pick = memory_rows(tl)
    times, allocated = mem.time[pick], mem.allocated[pick]
    peak = np.zeros(win.lo.size, np.int64)
    owner = win.index_of(times)
    inside = owner >= 0
    np.maximum.at(peak, owner[inside], allocated[inside])
    return peak
