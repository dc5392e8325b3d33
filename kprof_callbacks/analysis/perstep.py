"""Per-step totals: every operator, label and GPU activity summed per profiled step.

`kprof.diff` resamples steps and the slow-step finding holds one step against the others, so both need a
row per name and a column per step, not one total per name. A host event belongs to the step whose
`ProfilerStep#N` host range holds its start; a GPU activity to the step whose host range launched it (the
step breakdown's windows before they are stretched to the end of the GPU work, which would hand a kernel
launched early in step N to step N-1 when the GPU lags). Events outside every step are left out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import outside
from .events import DEVICE_KINDS, Events, launch_times, unique_ids
from .ops import HostCosts, label_events, op_events
from .steps import StepTimes, Windows
from .tables import StepStats
from .tree import Tree

ROW_KINDS = ("op", "label", *DEVICE_KINDS, "module", outside.KIND)
"""What a row measures: op = self CPU time, label = wall time of the range, device kinds = GPU time, module = the GPU
time of a module (forward and backward, its children included; without a GPU its host time), ``blocks.*`` for
repeated instances summed, step = the step's time outside operators (``outside``: host time between them, GPU idle,
data loading)."""


@dataclasses.dataclass
class PerStep:
    """Rows (kind, name) by columns (steps): summed time in microseconds and number of calls."""

    kind: list[str]
    name: list[str]
    time_us: np.ndarray  # (rows, steps)
    calls: np.ndarray  # (rows, steps)
    steps: list[StepStats]  # the step of each column

    def take(self, columns: Sequence[int]) -> PerStep:
        """The same rows over a subset of the steps (rows absent from all of them are kept, as zeros)."""
        cols = np.asarray(columns, dtype=np.int64)
        return PerStep(self.kind, self.name, self.time_us[:, cols], self.calls[:, cols], [self.steps[i] for i in cols])

    def without(self, kind: str) -> PerStep:
        """The table less its rows of ``kind``."""
        keep = np.array([k != kind for k in self.kind], bool).reshape(-1)
        picked = np.flatnonzero(keep)
        return PerStep(
            [self.kind[i] for i in picked],
            [self.name[i] for i in picked],
            self.time_us[keep],
            self.calls[keep],
            self.steps,
        )

    def to_dict(self, steps: Sequence[StepStats]) -> dict[str, Any]:
        """JSON-safe columns: each column's step as its index in ``steps`` (the Summary's step rows), times rounded
        to nanoseconds, calls as integers."""
        index = {s: i for i, s in reversed(list(enumerate(steps)))}
        return {
            "kind": list(self.kind),
            "name": list(self.name),
            "steps": [index[s] for s in self.steps],
            "time_us": np.round(self.time_us, 3).tolist(),
            "calls": self.calls.astype(np.int64).tolist(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], steps: Sequence[StepStats]) -> PerStep:
        """The table `to_dict` wrote, its columns' steps taken from ``steps``."""
        shape = (len(data["kind"]), len(data["steps"]))
        return cls(
            list(data["kind"]),
            list(data["name"]),
            np.array(data["time_us"], np.float64).reshape(shape),
            np.array(data["calls"], np.float64).reshape(shape),
            [steps[i] for i in data["steps"]],
        )

    def columns(self, steps: Sequence[StepStats]) -> list[int]:
        """The column of each of `steps` (matched on rank, worker and step number)."""
        index = {(s.rank, s.worker, s.step): i for i, s in reversed(list(enumerate(self.steps)))}
        return [index[s.rank, s.worker, s.step] for s in steps]


def _by_step(code: np.ndarray, step: np.ndarray, values: np.ndarray, n_steps: int):
    """Unique codes and, per code and step, the sum of `values` and the count (events with step -1 dropped)."""
    inside = step >= 0
    code, step, values = code[inside], step[inside], values[inside]
    uniq, inverse = unique_ids(code)
    cell = inverse * n_steps + step
    size = uniq.size * n_steps
    time = np.bincount(cell, weights=values, minlength=size).reshape(uniq.size, n_steps)
    calls = np.bincount(cell, minlength=size).reshape(uniq.size, n_steps).astype(np.float64)
    return uniq, time, calls


def _host_windows(tl: Events, times: StepTimes) -> Windows:
    """The steps' host ranges, in the order of `times.rows` (the whole trace when it has no steps)."""
    if tl.steps.shape[0] == 0:
        return times.windows
    return Windows(tl.steps[:, 0], tl.steps[:, 1], tl.steps[:, 2])


def from_timeline(tl: Events, tree: Tree, costs: HostCosts, times: StepTimes) -> PerStep:
    """The per-step table of one trace file; its columns are `times.rows`."""
    host, dev = tl.host, tl.device
    win = _host_windows(tl, times)
    n = win.lo.size
    kind: list[str] = []
    name: list[str] = []
    blocks: list[tuple[np.ndarray, np.ndarray]] = []
    host_rows = (("op", op_events(tl, tree), costs.self_cpu), ("label", label_events(tl, tree), costs.cpu))
    for label, rows, values in host_rows:
        uniq, time, calls = _by_step(host.name[rows], win.index_of(host.start[rows]), values[rows], n)
        kind += [label] * uniq.size
        name += [tl.names[k] for k in uniq.tolist()]
        blocks.append((time, calls))
    if dev.start.size:
        code = dev.name.astype(np.int64) * len(DEVICE_KINDS) + dev.kind
        uniq, time, calls = _by_step(code, win.index_of(launch_times(tl)), (dev.end - dev.start) / 1000.0, n)
        kind += [DEVICE_KINDS[k % len(DEVICE_KINDS)] for k in uniq.tolist()]
        name += [tl.names[k // len(DEVICE_KINDS)] for k in uniq.tolist()]
        blocks.append((time, calls))
    step_names, step_time, step_calls = outside.rows(tl, times, win)
    kind += [outside.KIND] * len(step_names)
    name += step_names
    blocks.append((step_time, step_calls))
    return PerStep(
        kind, name, np.concatenate([t for t, _ in blocks]), np.concatenate([c for _, c in blocks]), list(times.rows)
    )


def with_modules(table: PerStep, attributed: Any) -> PerStep:
    """``table`` with the module rows of one file's ``attribution.FileAttribution`` (None: no rows to add)."""
    if attributed is None or not attributed.step_names:
        return table
    time = attributed.step_time
    return PerStep(
        table.kind + ["module"] * len(attributed.step_names),
        table.name + list(attributed.step_names),
        np.concatenate([table.time_us, time]),
        np.concatenate([table.calls, (time > 0).astype(np.float64)]),
        table.steps,
    )


def merge(parts: Sequence[PerStep]) -> PerStep:
    """One table over the steps of several files: the union of their rows, zeros where a file lacks one."""
    index: dict[tuple[str, str], int] = {}
    for p in parts:
        for key in zip(p.kind, p.name):
            index.setdefault(key, len(index))
    total = sum(len(p.steps) for p in parts)
    time, calls = np.zeros((len(index), total)), np.zeros((len(index), total))
    col = 0
    for p in parts:
        rows = np.array([index[key] for key in zip(p.kind, p.name)], np.int64)
        time[rows, col : col + len(p.steps)] = p.time_us
        calls[rows, col : col + len(p.steps)] = p.calls
        col += len(p.steps)
    return PerStep([k for k, _ in index], [n for _, n in index], time, calls, [s for p in parts for s in p.steps])
