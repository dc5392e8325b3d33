"""Time outside operators, as rows of the per-step table (kind "step"): what no operator row can explain.

A step's time that no operator or label covers (the Python between them, a sleep, a wait for the GPU outside any
operator) has no row of its own, so a diff whose steps grew by 90 ms of such time would name a 10 us operator as
what grew. These rows give it one, so every diff, gate and comparison tests it like any other row:

- ``BETWEEN_OPS``: the step's host range on the thread that ran it (``ProfilerStep#N``) less the union of the
  operators, runtime calls and labels on that thread;
- ``GPU_IDLE``: the step's wall time in which no GPU activity ran (traces with GPU activity only);
- ``DATA_LOADING``: time in DataLoader iteration ranges and ``data_loading`` labels (when any step has some).
"""

from __future__ import annotations

import numpy as np

from . import intervals as iv
from .events import ANNOTATION, OP, RUNTIME, Events, is_step_name
from .steps import StepTimes, Windows, is_dataloader_name

KIND = "step"
BETWEEN_OPS = "Python / host between operators"
GPU_IDLE = "GPU idle"
DATA_LOADING = "data loading"


def _main_threads(tl: Events, work: np.ndarray, is_step: np.ndarray) -> np.ndarray:
    """The threads that ran the steps (those of the ``ProfilerStep#N`` ranges); without step ranges, the thread with
    the most host work."""
    host = tl.host
    if is_step.any():
        return np.unique(host.thread[is_step])
    if not work.any():
        return np.zeros(0, host.thread.dtype)
    busy = np.bincount(host.thread[work], weights=(host.end - host.start)[work])
    return np.array([int(np.argmax(busy))])


def between_ops_us(tl: Events, win: Windows) -> np.ndarray:
    """Per step of ``win`` (the steps' host ranges): microseconds on the steps' thread inside no operator, runtime
    call or label."""
    host = tl.host
    names = np.array([is_step_name(n) for n in tl.names] or [False], bool)
    is_step = names[host.name] if host.name.size else np.zeros(0, bool)
    work = ((host.kind == OP) | (host.kind == ANNOTATION) | (host.kind == RUNTIME)) & ~is_step
    on_main = np.isin(host.thread, _main_threads(tl, work, is_step))
    covered = iv.union(host.start[work & on_main], host.end[work & on_main])
    span = np.maximum(win.hi - win.lo, 0)
    return (span - iv.length_in(covered, win.lo, win.hi)) / 1000.0


def rows(tl: Events, times: StepTimes, win: Windows) -> tuple[list[str], np.ndarray, np.ndarray]:
    """``(names, time_us, calls)`` of the step rows of one trace, columns ``times.rows``. Calls: one per step for the
    time between operators and GPU idle (measured in every step), the data-loading ranges for data loading."""
    n = len(times.rows)
    names, time, calls = [BETWEEN_OPS], [between_ops_us(tl, win)], [np.ones(n)]
    if tl.device.start.size:
        names.append(GPU_IDLE)
        time.append(np.array([r.gpu_idle_us for r in times.rows]))
        calls.append(np.ones(n))
    loader = np.array([r.dataloader_us for r in times.rows])
    if loader.any():
        host = tl.host
        ranges = np.array([is_dataloader_name(x) for x in tl.names], bool)[host.name]
        ranges &= (host.kind == OP) | (host.kind == ANNOTATION)
        owner = win.index_of(host.start[ranges])
        names.append(DATA_LOADING)
        time.append(loader)
        calls.append(np.bincount(owner[owner >= 0], minlength=n)[:n].astype(np.float64))
    # to the nanosecond, as a saved summary keeps them (GPU idle is a difference of sums)
    return names, np.round(np.stack(time), 3).reshape(len(names), n), np.stack(calls).reshape(len(names), n)
