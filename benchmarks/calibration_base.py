"""What every calibration case shares (``calibration.py`` and the case modules beside it): the row type, and the
noise model of the synthetic cases: step numbering under the runs' schedule, per-step tables, noisy step times."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from kprof_callbacks.analysis import diagnostics
from kprof_callbacks.analysis.perstep import PerStep
from kprof_callbacks.analysis.tables import StepStats

STEP_US = 100_000.0
SCHEDULE = {"wait": 2, "warmup": 1, "active": 5, "repeat": 2}  # the end-to-end runs' schedule, as the synthetic
WINDOW = SCHEDULE["active"]  # ones number their steps: profiled steps per window, the first of each a window's first


@dataclasses.dataclass(frozen=True)
class Detector:
    """One verdict: what fires it, the run it looks at, and the effect injected to test detection."""

    name: str
    run: str
    effect: str
    fired: Callable[[np.random.Generator, float, bool], bool]
    details: Callable[[], dict] | None = None  # more than the rates, written with the row (e.g. exit statuses)
    detection_target: bool = True  # False: an effect the noise may hide, whose detection rate is published, not held


def step_number(i: int) -> int:
    """The number of the ``i``-th profiled step under SCHEDULE: the windows' steps are numbered with gaps between
    them (the waiting and warm-up steps), as in a real run."""
    skipped = SCHEDULE["wait"] + SCHEDULE["warmup"]
    return (i // WINDOW) * (WINDOW + skipped) + skipped + i % WINDOW


def step_stats(wall_us: np.ndarray, **columns: np.ndarray) -> list[StepStats]:
    zero = np.zeros(wall_us.size)
    values = {k: columns.get(k, zero) for k in ("gpu_busy_us", "gpu_idle_us", "kernel_us", "dataloader_us")}
    return [
        StepStats(
            step=step_number(i),
            rank=None,
            worker="w",
            wall_us=float(w),
            memcpy_us=0.0,
            memset_us=0.0,
            comm_us=0.0,
            cpu_only_us=float(w - values["gpu_busy_us"][i]),
            peak_memory=0,
            **{k: float(v[i]) for k, v in values.items()},
        )
        for i, w in enumerate(wall_us)
    ]


def walls(rng: np.random.Generator, sigma: float, n: int) -> np.ndarray:
    """Noise-only step times; each window's first step 10% slower (the profiler starting)."""
    first = np.where(np.arange(n) % WINDOW == 0, 1.10, 1.0)
    return STEP_US * first * rng.lognormal(0.0, sigma, n)


def kinds(found: list) -> set[str]:
    return {d.kind for d in found}


def findings(steps: list[StepStats], ev: diagnostics.Evidence, rows: tuple[list, list, np.ndarray] | None = None):
    kind, name, calls = rows or ([], [], np.zeros((0, len(steps))))
    per_step = PerStep(kind, name, calls * 5.0, calls, steps)
    return kinds(diagnostics.diagnose(steps, [], ev, per_step))
