"""`kprof.diff(a, b)`: what changed between two runs (or step selections), and which changes are real.

Each side is a run folder, a trace file, or `PATH@steps=SPEC` (steps of one run, e.g. `log/run@steps=2-4,7`).
Both are read by `summarize`, whose per-step tables hold every operator, label and GPU activity per step.
Step time: ratio of medians with an unpaired bootstrap interval and `compare`'s verdict words. Every other row
(time per step of an operator, label or kernel, and counts per step: syncs, launches, copies) is a per-step
mean, with a bootstrap interval of its change and Welch's t-test; rows are many, so a change is *significant*
only when Benjamini-Hochberg keeps the false discovery rate across all rows under 1 - confidence, its
interval excludes zero, and it exceeds `noise_threshold` of A's value (compare's 2%).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from .. import stats
from . import diff_report
from .diagnostics import SCALAR_READ, SYNC_CALLS
from .diff_inputs import Source, load, select
from .perstep import PerStep
from .summary import Summary

if TYPE_CHECKING:
    import pandas

NEW, GONE, INCREASED, DECREASED, UNCHANGED = "new", "gone", "increased", "decreased", "unchanged"
FEW_STEPS = 5  # below this many steps on a side, intervals are rough and the report says so
BROAD_ROWS, BROAD_SHARE = 10, 0.5  # this many timed rows, this share of them moving one way: a note on the machine


@dataclasses.dataclass(frozen=True)
class Side:
    """One side of a diff: where it came from and which steps it holds."""

    source: str  # as given (a path, `PATH@steps=SPEC`, or a Summary's name)
    run: str  # the Summary's name
    steps: list[int]  # the step numbers used
    samples: int  # steps x ranks/workers: the per-step samples resampled


@dataclasses.dataclass(frozen=True)
class StepTimeChange:
    """Median step time of each side, speedup = median(A) / median(B) with its interval, and the verdict for B."""

    a_median_us: float
    b_median_us: float
    speedup: float
    low: float
    high: float
    verdict: str  # stats.FASTER / SLOWER / SAME: B compared with A


@dataclasses.dataclass(frozen=True)
class Change:
    """One row: per-step means in A and B (microseconds; a number for kind "count"), the change and its verdict."""

    kind: str  # op (self CPU time), label (wall time), kernel/memcpy/memset/nccl (GPU time), count
    name: str
    a: float
    b: float
    change: float  # b - a
    low: float  # interval of the change
    high: float
    a_calls: float  # calls per step (for counts: the count)
    b_calls: float
    p_value: float  # Welch's t-test, before the false-discovery correction
    significant: bool
    status: str  # new / gone (by presence), increased / decreased (significant), unchanged

    @property
    def presence_changed(self) -> bool:
        """New in B or gone from it."""
        return self.status in (NEW, GONE)

    @property
    def verdict(self) -> str:
        """The status as the reports word it: new and gone rows say whether the change is significant."""
        if self.presence_changed:
            return self.status if self.significant else f"{self.status}, not significant"
        return self.status if self.significant else "no significant change"


@dataclasses.dataclass(frozen=True)
class DiagnosticChange:
    """A finding present on one side only."""

    kind: str
    change: str  # "appeared" (in B) or "went away" (was in A)
    message: str


@dataclasses.dataclass(eq=False)
class Diff:
    """What changed from A to B: step time, rows with intervals and verdicts, findings that came or went."""

    a: Side
    b: Side
    step_time: StepTimeChange
    changes: list[Change]  # significant first, then by size of the change
    diagnostics: list[DiagnosticChange]
    notes: list[str]
    mean_step_change_us: float  # mean step time of B minus A (means add up across rows; the verdict uses medians)
    confidence: float
    noise_threshold: float

    def significant(self, kinds: Sequence[str] | None = None) -> list[Change]:
        """The significant rows (of `kinds` only, when given), largest change first."""
        return [c for c in self.changes if c.significant and (kinds is None or c.kind in kinds)]

    def contributors(self, kinds: Sequence[str] = ("kernel", "memcpy", "memset", "nccl"), top: int = 5,
                     min_share: float = 0.0) -> list[Change]:
        """The significant rows of `kinds` that moved the way the step time did: what accounts for a speedup.

        With the default kinds, the GPU activities that made B faster (or slower) than A, each at least
        `min_share` of the change in mean step time (`share_of_step_change`), largest first.
        """
        return [c for c in self.significant(kinds) if self.share_of_step_change(c) > max(min_share, 0.0)][:top]

    def share_of_step_change(self, change: Change) -> float:
        """`change` as a fraction of the change in mean step time (0 when the step time did not move)."""
        delta = self.mean_step_change_us
        return change.change / delta if delta else 0.0

    def headline(self, top: int = 3) -> str:
        """One paragraph: the step-time verdict and the GPU activities (else operators) that account for it."""
        return diff_report.headline(self, top)

    def render(self, top: int = 10) -> str:
        """The report as text, `top` rows per table."""
        if top < 1:
            raise ValueError(f"top must be >= 1, got {top}")
        return diff_report.render(self, top)

    def __str__(self) -> str:
        return self.render()

    def print(self, top: int = 10, file: TextIO | None = None) -> None:
        """Print the text report (to stdout unless `file` is given)."""
        print(self.render(top=top), file=file or sys.stdout)

    def to_dict(self) -> dict[str, Any]:
        """Everything as JSON-safe dicts and lists."""
        return {
            "a": dataclasses.asdict(self.a),
            "b": dataclasses.asdict(self.b),
            "step_time": dataclasses.asdict(self.step_time),
            "mean_step_change_us": self.mean_step_change_us,
            "changes": [dict(dataclasses.asdict(c), verdict=c.verdict) for c in self.changes],
            "diagnostics": [dataclasses.asdict(d) for d in self.diagnostics],
            "notes": list(self.notes),
            "settings": {"confidence": self.confidence, "noise_threshold": self.noise_threshold,
                         "test": "Welch t-test per row, Benjamini-Hochberg false discovery rate 1 - confidence"},
        }

    def to_pandas(self) -> dict[str, pandas.DataFrame]:
        """DataFrames: `step_time` (one row), `changes`, `diagnostics`."""
        import pandas as pd

        data = self.to_dict()
        columns = {"changes": [f.name for f in dataclasses.fields(Change)] + ["verdict"],
                   "diagnostics": [f.name for f in dataclasses.fields(DiagnosticChange)]}
        return {"step_time": pd.DataFrame([data["step_time"]]),
                **{key: pd.DataFrame(data[key], columns=cols) for key, cols in columns.items()}}

    def to_html(self, path: str | Path, top: int = 30) -> Path:
        """Write a self-contained HTML report (inline SVG, no scripts, no network)."""
        return diff_report.write_html(self, Path(path), top)


def _counts(table: PerStep) -> tuple[list[str], np.ndarray]:
    """Counts per step that matter for speed: host-GPU syncs, tensor reads, launches, copies."""
    kinds, names = np.array(table.kind, dtype=object), np.array(table.name, dtype=object)
    pageable = np.array(["Pageable" in n for n in table.name], bool)
    picks = {
        "host-GPU syncs (cuda*Synchronize, cudaMemcpy)": (kinds == "op") & np.isin(names, list(SYNC_CALLS)),
        "tensor reads (.item(), bool(), int())": (kinds == "op") & (names == SCALAR_READ),
        "kernels run": kinds == "kernel",
        "memcpy": kinds == "memcpy",
        "memcpy from pageable memory": (kinds == "memcpy") & pageable,
        "memset": kinds == "memset",
        "NCCL kernels": kinds == "nccl",
    }
    return list(picks), np.stack([table.calls[rows].sum(axis=0) for rows in picks.values()]).reshape(len(picks), -1)


def _rows(a: PerStep, b: PerStep, confidence: float, noise: float, seed: int) -> list[Change]:
    """Every row present on either side, tested together."""
    count_names, a_counts, b_counts = *_counts(a), _counts(b)[1]
    kinds = a.kind + ["count"] * len(count_names)
    names = a.name + count_names
    xa, xb = np.concatenate([a.time_us, a_counts]), np.concatenate([b.time_us, b_counts])
    ca, cb = np.concatenate([a.calls, a_counts]), np.concatenate([b.calls, b_counts])
    present = (ca.sum(axis=1) > 0) | (cb.sum(axis=1) > 0)
    kinds, names = [k for k, keep in zip(kinds, present) if keep], [n for n, keep in zip(names, present) if keep]
    xa, xb, ca, cb = xa[present], xb[present], ca[present], cb[present]
    p = stats.welch_p(xa, xb)
    low, high = stats.mean_change_interval(xa, xb, confidence=confidence, seed=seed)
    ma, mb = xa.mean(axis=1), xb.mean(axis=1)
    change = mb - ma
    dust = 1e-9 * np.maximum(np.abs(ma), np.abs(mb))  # rounding error of the resampled means of equal values
    low, high = np.where(np.abs(low) <= dust, 0.0, low), np.where(np.abs(high) <= dust, 0.0, high)
    clear = (np.abs(change) > noise * np.abs(ma)) & ((low > 0) | (high < 0))
    significant = stats.fdr_reject(p, 1.0 - confidence) & clear
    rows = []
    for i in range(len(kinds)):
        was, now = ca[i].sum() > 0, cb[i].sum() > 0
        status = NEW if not was else GONE if not now else (
            (INCREASED if change[i] > 0 else DECREASED) if significant[i] else UNCHANGED)
        rows.append(Change(kinds[i], names[i], float(ma[i]), float(mb[i]), float(change[i]), float(low[i]),
                           float(high[i]), float(ca[i].mean()), float(cb[i].mean()), float(p[i]), bool(significant[i]),
                           status))
    return sorted(rows, key=lambda c: (not c.significant, not c.presence_changed, -abs(c.change)))


def _broad_shift(changes: list[Change]) -> list[str]:
    """A note when most timed rows moved the same way: that is usually the machine, not the code."""
    timed = [c for c in changes if c.kind != "count" and not c.presence_changed]
    for status, word in ((INCREASED, "slower"), (DECREASED, "faster")):
        moved = sum(c.status == status for c in timed)
        if len(timed) >= BROAD_ROWS and moved >= BROAD_SHARE * len(timed):
            return [(f"{moved} of {len(timed)} rows present in both got significantly {word} together: a shift "
                     "that broad is usually the machine (load from other processes, clocks, a different GPU or "
                     "driver) rather than the code; record both sides on the same machine, interleaved if you can "
                     "(kprof.compare does that).")]
    return []


def _diagnostic_changes(a: Summary, b: Summary) -> list[DiagnosticChange]:
    kinds_a, kinds_b = {d.kind for d in a.diagnostics}, {d.kind for d in b.diagnostics}
    return ([DiagnosticChange(d.kind, "appeared", d.message) for d in b.diagnostics if d.kind not in kinds_a]
            + [DiagnosticChange(d.kind, "went away", d.message) for d in a.diagnostics if d.kind not in kinds_b])


def _step_time(walls: list[np.ndarray], confidence: float, noise: float, seed: int) -> StepTimeChange:
    """Medians, speedup with its bootstrap interval, and the verdict."""
    speedup, low, high = stats.ratio_interval(walls[0], walls[1], confidence=confidence, seed=seed)
    verdict = stats.verdict(speedup, low, high, threshold=noise)
    # With the few steps of a profiling window the bootstrap interval is too narrow (3 against 3 steps: about 12%
    # of noise-only pairs come out "faster" or "slower"); Welch's t-test on log step times keeps that under 5%.
    logs = [np.log(np.maximum(w, 1e-3))[None] for w in walls]
    if stats.welch_p(*logs)[0] >= 1.0 - confidence:
        verdict = stats.SAME
    return StepTimeChange(float(np.median(walls[0])), float(np.median(walls[1])), speedup, low, high, verdict)


def _few_steps(walls: list[np.ndarray]) -> list[str]:
    n_a, n_b = (len(w) for w in walls)
    if min(n_a, n_b) >= FEW_STEPS:
        return []
    return [(f"{n_a} against {n_b} step{'s' * (n_b != 1)}: with fewer than {FEW_STEPS} steps on a side the "
             "intervals are rough and only large, steady changes can be significant; profile more steps (active=10) "
             "for finer answers.")]


def diff(a: Source, b: Source, *, confidence: float = 0.95, noise_threshold: float = 0.02, seed: int = 0) -> Diff:
    """Compare B with A: step time, every operator, label, GPU activity and count per step, and the findings.

    `a` and `b` are run folders, trace files, `PATH@steps=SPEC` selections (`log/run@steps=2-4,7`), Summaries,
    or `diff_inputs.Input`s (a Summary and its steps: the kprof tab summarizes runs itself). `confidence` sets
    the intervals and the false discovery rate (1 - confidence); changes under `noise_threshold` (a fraction of
    A's value) are never significant; `seed` makes the bootstrap repeatable.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence!r}")
    if isinstance(noise_threshold, bool) or not isinstance(noise_threshold, (int, float)) or not noise_threshold >= 0:
        raise ValueError(f"noise_threshold must be a number >= 0, got {noise_threshold!r}")
    sides = load(a, b)
    table_a, table_b = select(sides)
    walls = [np.array([s.wall_us for s in t.steps]) for t in (table_a, table_b)]
    changes = _rows(table_a, table_b, confidence, noise_threshold, seed)
    same_run = sides[0].summary is sides[1].summary
    notes = _few_steps(walls) + _broad_shift(changes)
    if same_run:
        notes.append("Both sides are steps of one run: its findings (diagnostics) are per run, so none are compared.")
    a_side, b_side = (Side(side.source, side.summary.name, sorted({s.step for s in t.steps}), len(t.steps))
                      for side, t in zip(sides, (table_a, table_b)))
    return Diff(
        a=a_side,
        b=b_side,
        step_time=_step_time(walls, confidence, noise_threshold, seed),
        changes=changes,
        diagnostics=[] if same_run else _diagnostic_changes(sides[0].summary, sides[1].summary),
        notes=notes,
        mean_step_change_us=float(walls[1].mean() - walls[0].mean()),
        confidence=confidence,
        noise_threshold=noise_threshold,
    )
