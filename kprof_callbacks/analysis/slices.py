"""One step of a trace as compact columns for a timeline: the kprof tab draws them on a canvas, the HTML report as SVG.

A trace is decoded once (reader, timeline) into a `TraceSlices`: every host event with its thread and nesting depth,
every GPU activity with its stream and row, and the link from each runtime call (cudaLaunchKernel, cudaMemcpyAsync)
to the GPU activity it started, matched by correlation id as the trace's "ac2g" flow events are. `step(n)` then cuts
out the events of one step window (`steps.windows`: the ProfilerStep#N range, extended to the end of the GPU work it
launched) without touching the rest, so a 50 MB trace is served a step at a time. Its collectives (`comm.transfers`)
are kept too, for the timeline of all ranks (`ranktimeline`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..layout import worker_of
from . import comm, steps
from .events import RUNTIME, build, is_step_name, match
from .reader import TraceFile, read_trace
from .tree import nest

KINDS = ("operator", "label", "python", "runtime", "step", "kernel", "memcpy", "memset", "communication")
"""Event kinds, by the code in `Slice.kind`: the host kinds of `timeline`, then ProfilerStep#N, then device kinds."""
STEP_KIND, DEVICE_KIND = 4, 5  # codes of ProfilerStep#N ranges and of the first device kind


@dataclasses.dataclass(frozen=True)
class Lane:
    """A row group of the timeline: a host thread or a GPU stream."""

    name: str
    kind: str  # "thread" or "stream"
    rows: int


@dataclasses.dataclass
class Slice:
    """The events of one step window, one array per field; times in ns from the window's start.

    `parent` (host events: the enclosing event, -1 at the top) and `link` (GPU activities: the runtime call that
    launched it, -1 when it was launched before the window) are indices into the same arrays.
    """

    file: str
    worker: str
    step: int
    start_ns: int  # the window's start on the trace's clock
    span_ns: int
    lanes: list[Lane]
    names: list[str]
    shapes: list[str]
    lane: np.ndarray
    row: np.ndarray
    start: np.ndarray
    dur: np.ndarray
    name: np.ndarray
    kind: np.ndarray
    shape: np.ndarray  # index into `shapes`, -1 when input shapes were not recorded
    parent: np.ndarray
    link: np.ndarray

    def __len__(self) -> int:
        return int(self.start.size)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: each field one list of numbers, strings once in `names` and `shapes`."""
        columns = ("lane", "row", "start", "dur", "name", "kind", "shape", "parent", "link")
        return {
            "file": self.file,
            "worker": self.worker,
            "step": self.step,
            "start_ns": self.start_ns,
            "span_ns": self.span_ns,
            "kinds": KINDS,
            "lanes": [dataclasses.asdict(lane) for lane in self.lanes],
            "names": self.names,
            "shapes": self.shapes,
            "events": {c: getattr(self, c).tolist() for c in columns},
        }


@dataclasses.dataclass(frozen=True)
class StepWindow:
    """A step of a trace file: its number and wall time."""

    step: int
    wall_us: float


class TraceSlices:
    """Every event of one trace file in columns, ready to be cut into steps; the decoded events are not kept."""

    def __init__(self, trace: TraceFile) -> None:
        tl = build(trace)
        host, dev = tl.host, tl.device
        # One lane per thread id: some containers record runtime calls under another pid than the ops around them.
        tids = list(dict.fromkeys(tid for _, tid in tl.threads))
        index = {tid: k for k, tid in enumerate(tids)}
        thread = np.array([index[tid] for _, tid in tl.threads], np.int32)[host.thread]
        tree = nest(thread, host.start, host.end, host.name, fold=False)
        self.file, self.worker = trace.path.name, trace.worker
        self.windows = steps.windows(tl)
        self.rank = trace.rank
        self.transfers = comm.transfers(tl, self.windows)  # the collectives, to match them across ranks
        self.names, self.shapes = tl.names, tl.shapes
        is_step = np.isin(host.name, [k for k, n in enumerate(tl.names) if is_step_name(n)])

        thread_names = _thread_names(trace.columns.thread_labels)
        thread_order = _lane_order(thread, host.start, len(tids), first=np.unique(thread[is_step]))
        stream_order = _lane_order(dev.stream, dev.start, len(tl.streams))
        self.lane_names = [(thread_names.get(tids[t], f"thread {tids[t]}"), "thread") for t in thread_order]
        self.lane_names += [(f"GPU {tl.streams[s][0]} stream {tl.streams[s][1]}", "stream") for s in stream_order]
        thread_lane, stream_lane = _rank(thread_order, len(tids)), _rank(stream_order, len(tl.streams))

        n_host = host.start.size
        runtime = np.flatnonzero((host.kind == RUNTIME) & (host.corr >= 0))
        self.lane = np.concatenate([thread_lane[thread], stream_lane[dev.stream] + len(thread_order)])
        self.row = np.concatenate([tree.depth, _stream_rows(dev.stream, dev.start, dev.end)]).astype(np.int32)
        self.start = np.concatenate([host.start, dev.start])
        self.end = np.concatenate([host.end, dev.end])
        self.name = np.concatenate([host.name, dev.name])
        self.kind = np.concatenate([np.where(is_step, STEP_KIND, host.kind), dev.kind + DEVICE_KIND]).astype(np.int8)
        self.shape = np.concatenate([host.shape, np.full(dev.start.size, -1, np.int32)])
        self.parent = np.concatenate([tree.parent, np.full(dev.start.size, -1)]).astype(np.int64)
        self.link = np.concatenate([np.full(n_host, -1), match(runtime, host.corr, dev.corr)]).astype(np.int64)

    @classmethod
    def read(cls, path: Path) -> TraceSlices:
        """Decode the trace file at `path` (TraceError: why it cannot be used)."""
        return cls(read_trace(path))

    def steps(self) -> list[StepWindow]:
        """The file's steps in time order."""
        return [
            StepWindow(n, (hi - lo) / 1000.0)
            for n, lo, hi in zip(self.windows.number.tolist(), self.windows.lo.tolist(), self.windows.hi.tolist())
        ]

    def step(self, number: int) -> Slice:
        """The events overlapping step `number`'s window (KeyError when the file has no such step)."""
        where = np.flatnonzero(self.windows.number == number)
        if where.size == 0:
            raise KeyError(f"{self.file} has no step {number}")
        lo, hi = int(self.windows.lo[where[0]]), int(self.windows.hi[where[0]])
        pick = np.flatnonzero((self.start < hi) & (np.maximum(self.end, self.start + 1) > lo))
        local = np.full(self.start.size, -1, np.int64)
        local[pick] = np.arange(pick.size)
        lanes, lane = np.unique(self.lane[pick], return_inverse=True)
        rows = np.zeros(lanes.size, np.int64)
        np.maximum.at(rows, lane, self.row[pick] + 1)
        names, name = np.unique(self.name[pick], return_inverse=True)
        shape_ids = self.shape[pick]
        shapes = np.unique(shape_ids[shape_ids >= 0])
        shape = np.where(shape_ids >= 0, np.searchsorted(shapes, shape_ids), -1)
        return Slice(
            file=self.file,
            worker=self.worker,
            step=number,
            start_ns=lo,
            span_ns=hi - lo,
            lanes=[Lane(*self.lane_names[k], int(r)) for k, r in zip(lanes.tolist(), rows.tolist())],
            names=[self.names[k] for k in names.tolist()],
            shapes=[self.shapes[k] for k in shapes.tolist()],
            lane=lane.astype(np.int32),
            row=self.row[pick],
            start=self.start[pick] - lo,
            dur=self.end[pick] - self.start[pick],
            name=name.astype(np.int32),
            kind=self.kind[pick],
            shape=shape.astype(np.int32),
            parent=_local(local, self.parent[pick]),
            link=_local(local, self.link[pick]),
        )


def median_step(steps: Sequence[tuple[int, float]]) -> int:
    """The number of the median step by wall time (the lower middle of an even count): a typical step to show."""
    ordered = sorted(steps, key=lambda s: s[1])
    return ordered[(len(ordered) - 1) // 2][0]


def find_steps(files: Sequence[Path], worker: str, numbers: Sequence[int]) -> dict[int, Slice]:
    """Slices of steps `numbers` of `worker`, from whichever of `files` holds them (each file decoded at most once)."""
    found: dict[int, Slice] = {}
    for path in files:
        wanted = set(numbers) - set(found)
        if not wanted:
            break
        if worker_of(path) != worker:
            continue
        slices = TraceSlices.read(path)
        found.update((n, slices.step(n)) for n in wanted & {s.step for s in slices.steps()})
    return found


def _local(local: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Global event indices as indices into the slice; -1 where the event is not in it."""
    return np.where(index >= 0, local[np.maximum(index, 0)], -1).astype(np.int32)


def _rank(order: list[int], n: int) -> np.ndarray:
    """Position of each id in `order`."""
    out = np.zeros(max(n, 1), np.int32)
    out[order] = np.arange(len(order))
    return out


def _lane_order(lane: np.ndarray, start: np.ndarray, n: int, first: np.ndarray | None = None) -> list[int]:
    """Lane ids by their first event, the lanes in `first` (the threads that run the steps) before the others."""
    earliest = np.full(n, np.iinfo(np.int64).max)
    np.minimum.at(earliest, lane, start)
    leading = np.zeros(n, bool)
    if first is not None:
        leading[first] = True
    return np.lexsort((earliest, ~leading)).tolist()


def _stream_rows(stream: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Row of each GPU activity within its stream: 0, unless it overlaps an earlier one on the same stream.

    A stream runs its work in order, so overlaps are rare; when there are none (checked between neighbours in start
    order, which finds any overlap), no Python loop runs.
    """
    rows = np.zeros(stream.size, np.int32)
    order = np.lexsort((start, stream))
    s, e, lane = start[order], end[order], stream[order]
    if not ((s[1:] < e[:-1]) & (lane[1:] == lane[:-1])).any():
        return rows
    free: dict[int, list[int]] = {}
    for i in order.tolist():
        ends = free.setdefault(int(stream[i]), [])
        row = next((r for r, t in enumerate(ends) if t <= start[i]), len(ends))
        if row == len(ends):
            ends.append(0)
        ends[row] = int(end[i])
        rows[i] = row
    return rows


def _thread_names(labels: list[tuple[int | str, str]]) -> dict[int | str, str]:
    """Thread id -> the name the trace's `thread_name` metadata gives it, the most telling one when several do
    ("thread 451 (pt_autograd_0)" over "thread 451 (python3)")."""
    names: dict[int | str, str] = {}
    for tid, label in labels:
        if "(python" in names.get(tid, "(python"):
            names[tid] = label
    return names
