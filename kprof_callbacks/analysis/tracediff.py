"""`kprof.diff(a, b)`: what changed between two runs (or step selections), and which changes are real.

Each side is a run folder, a trace file, or `PATH@steps=SPEC` (steps of one run, e.g. `log/run@steps=2-4,7`).
Both are read by `summarize`, whose per-step tables hold every operator, label and GPU activity per step.
Step time (`StepTimeChange`): a typical step of B against a typical step of A, by the rank test (`stats.rank_ratio`:
the median of the pairwise step-time ratios, with the interval that is the test), and `compare`'s verdict words;
below the steps a side the test needs, "too few steps" and no interval. Every other row (time per step of an
operator, label or kernel, and counts per step: syncs, launches, copies) is a per-step mean tested by Welch's
t-test; rows are many, so a change is *significant* only when Benjamini-Hochberg keeps the false discovery rate
across all rows under 1 - confidence and it exceeds `noise_threshold` of A's value (compare's 2%). Each row's
interval is Welch's at the level that control used (the false-coverage-adjusted level 1 - R q / m for R
significant rows of m), so it excludes 0 exactly for the rows the control kept. A row present on one side only is
*new* or *gone*; whether it is steady is tested on its calls per step.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .. import stats
from . import explain, fmt, health, memory_diff, outside
from .diagnostics import SCALAR_READ, SYNC_CALLS
from .diff_inputs import Source, load, select
from .diffresult import DECREASED, GONE, INCREASED, NEW, UNCHANGED, Change, DiagnosticChange, Diff, Side, StepTimeChange
from .machine import compare as compare_machines
from .machine import is_machine, samples
from .perstep import PerStep
from .summary import Summary
from .tables import StepStats

ROW_MIN_STEPS = 2  # Welch's test needs a variance on each side
BROAD_ROWS, BROAD_SHARE = 10, 0.5  # this many timed rows, this share of them moving one way: a note on the machine


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


def _rows(
    a: PerStep, b: PerStep, confidence: float, noise: float, memory: tuple[list[str], np.ndarray, np.ndarray]
) -> tuple[list[Change], float]:
    """Every row present on either side (with the ``memory`` rows: names, bytes per step of A and B), tested
    together; and the level of their intervals."""
    kinds, names, (xa, xb), (ca, cb) = _present_rows(a, b, memory)
    presence = (ca.sum(axis=1) == 0) | (cb.sum(axis=1) == 0)
    p = np.where(presence, stats.welch_p(ca, cb), stats.welch_p(xa, xb))
    q = 1.0 - confidence
    kept = stats.fdr_reject(p, q)
    alpha = max(int(kept.sum()), 1) * q / max(p.size, 1)  # false-coverage-adjusted: excludes 0 iff kept
    low, high = stats.welch_interval(xa, xb, alpha)
    ma, mb = xa.mean(axis=1), xb.mean(axis=1)
    change = mb - ma
    above_noise = np.abs(change) > noise * np.abs(ma)
    significant = kept & above_noise
    steps = (xa.shape[1], xb.shape[1])
    rows = []
    for i in range(len(kinds)):
        status = (
            NEW
            if not ca[i].any()
            else GONE
            if not cb[i].any()
            else ((INCREASED if change[i] > 0 else DECREASED) if significant[i] else UNCHANGED)
        )
        words = _verdict(
            kinds[i],
            status,
            bool(significant[i]),
            bool(above_noise[i]),
            low[i],
            high[i],
            change[i],
            (ca[i] if status == GONE else cb[i]),
            steps,
            noise,
        )
        rows.append(
            Change(
                kinds[i],
                names[i],
                float(ma[i]),
                float(mb[i]),
                float(change[i]),
                float(low[i]),
                float(high[i]),
                float(ca[i].mean()),
                float(cb[i].mean()),
                float(p[i]),
                bool(significant[i]),
                status,
                words,
            )
        )
    return sorted(rows, key=lambda c: (not c.significant, not c.presence_changed, -abs(c.change))), 1.0 - alpha


def _present_rows(
    a: PerStep, b: PerStep, memory: tuple[list[str], np.ndarray, np.ndarray]
) -> tuple[list[str], list[str], tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """The rows present on either side: their kinds and names, their values per step on A and B (a row per row, a
    column per step) and their calls per step (for counts the count; for memory whether it was allocated)."""
    count_names, a_counts, b_counts = *_counts(a), _counts(b)[1]
    memory_names, a_memory, b_memory = memory
    kinds = a.kind + ["count"] * len(count_names) + ["memory"] * len(memory_names)
    names = a.name + count_names + memory_names
    xa, xb = np.concatenate([a.time_us, a_counts, a_memory]), np.concatenate([b.time_us, b_counts, b_memory])
    ca = np.concatenate([a.calls, a_counts, a_memory > 0])
    cb = np.concatenate([b.calls, b_counts, b_memory > 0])
    present = (ca.sum(axis=1) > 0) | (cb.sum(axis=1) > 0)
    kinds, names = [k for k, keep in zip(kinds, present) if keep], [n for n, keep in zip(names, present) if keep]
    return kinds, names, (xa[present], xb[present]), (ca[present], cb[present])


def _verdict(
    kind: str,
    status: str,
    significant: bool,
    above_noise: bool,
    low: float,
    high: float,
    change: float,
    calls: np.ndarray,
    steps: tuple[int, int],
    noise: float,
) -> str:
    """A row's verdict in words. ``calls``: calls per step on the side where the row ran (new: B, gone: A)."""
    few = min(steps) < ROW_MIN_STEPS
    if status in (NEW, GONE):
        per_step = f"{calls.mean():.3g} calls/step, {'+' if change >= 0 else '-'}{fmt.duration(abs(change))} per step"
        if kind == "memory":
            per_step = f"{'+' if change >= 0 else '-'}{fmt.size(abs(change))} at the peak"
        if few:
            return f"{status}: {per_step} (too few steps to tell if it is steady)"
        if significant:
            return f"{status}: {per_step}"
        return f"{status} in {int((calls > 0).sum())} of {calls.size} steps, not steady ({per_step})"
    if few:
        return stats.TOO_FEW
    if significant:
        return status
    if low > 0 or high < 0:  # kept by the false-discovery control, but smaller than the noise threshold
        return f"no significant change (under {fmt.share(noise)} of A)"
    return "no significant change"


def _broad_shift(changes: list[Change]) -> list[str]:
    """A note when most timed rows moved the same way: that is usually the machine, not the code."""
    timed = [c for c in changes if c.kind != "count" and not c.presence_changed]
    for status, word in ((INCREASED, "slower"), (DECREASED, "faster")):
        moved = sum(c.status == status for c in timed)
        if len(timed) >= BROAD_ROWS and moved >= BROAD_SHARE * len(timed):
            return [
                (
                    f"{moved} of {len(timed)} rows present in both got significantly {word} together: a shift "
                    "that broad is usually the machine (load from other processes, clocks, a different GPU or "
                    "driver) rather than the code; record both sides on the same machine, interleaved if you can "
                    "(kprof.compare does that)."
                )
            ]
    return []


def _diagnostic_changes(a: Summary, b: Summary) -> list[DiagnosticChange]:
    """The findings on one side only; the capture's health is said per side, the machine's compared (``machine``)."""
    (_, found_a), (_, found_b) = health.split(a.diagnostics), health.split(b.diagnostics)
    found_a, found_b = ([d for d in x if not is_machine(d)] for x in (found_a, found_b))
    kinds_a, kinds_b = {d.kind for d in found_a}, {d.kind for d in found_b}
    return [DiagnosticChange(d.kind, "appeared", d.message) for d in found_b if d.kind not in kinds_a] + [
        DiagnosticChange(d.kind, "went away", d.message) for d in found_a if d.kind not in kinds_b
    ]


def _window_starts(table: PerStep, summary: Summary) -> np.ndarray:
    """Per step of ``table``: whether it is the first of its profiling window (its rank and worker recorded no step
    numbered one less). torch.profiler's start lands in that step and, on a GPU, so does the backlog of the
    unprofiled steps before the window (on an H200, 30-40% of a step), so it is no sample of the typical step."""
    recorded = {(s.rank, s.worker, s.step) for s in summary.steps}
    return np.array([(s.rank, s.worker, s.step - 1) not in recorded for s in table.steps], bool)


def _step_time(
    tables: tuple[PerStep, PerStep], summaries: tuple[Summary, Summary], confidence: float, noise: float
) -> StepTimeChange:
    """The typical step of B against A, by the rank test, and why the means say otherwise when they do. Each
    window's first step is left out of the test where both sides keep enough steps without them."""
    first = [_window_starts(t, summary) for t, summary in zip(tables, summaries)]
    used = [[s for s, f in zip(t.steps, firsts) if not f] for t, firsts in zip(tables, first)]
    left_out = (int(first[0].sum()), int(first[1].sum()))
    if not any(left_out) or min(map(len, used)) < stats.rank_min_steps(confidence):
        used, left_out = [list(t.steps) for t in tables], (0, 0)
    walls = [np.array([s.wall_us for s in steps]) for steps in used]
    speedup, low, high = stats.rank_ratio(walls[0], walls[1], confidence=confidence)
    verdict = stats.TOO_FEW if low is None else stats.verdict(speedup, low, high, threshold=noise)
    change = StepTimeChange(
        float(np.median(walls[0])),
        float(np.median(walls[1])),
        speedup,
        low,
        high,
        verdict,
        walls[0].size,
        walls[1].size,
        stats.rank_min_steps(confidence),
        float(walls[0].mean()),
        float(walls[1].mean()),
        window_starts=left_out,
    )
    return dataclasses.replace(change, note=_mean_note(change, used, noise))


def _direction(relative: float, noise: float) -> int:
    return 1 if relative > noise else -1 if relative < -noise else 0


def _mean_note(t: StepTimeChange, used: list[list[StepStats]], noise: float) -> str | None:
    """Why the mean step time moved another way than the typical step, when it did: one outlier step (named, with
    the mean without it), or step times skewed by a few long steps."""
    if t.verdict == stats.TOO_FEW:
        return None
    typical = 0 if t.verdict == stats.SAME else _direction(t.change, noise)
    mean = t.b_mean_us - t.a_mean_us
    if _direction(mean / t.a_mean_us, noise) == typical:
        return None
    said = (
        f"The mean step time changed by {'+' if mean > 0 else '-'}{fmt.duration(abs(mean))} "
        f"({mean / t.a_mean_us:+.0%}) while the typical step {'did not' if not typical else 'moved the other way'}"
    )
    for side, steps in zip("AB", used):
        walls = np.array([s.wall_us for s in steps])
        worst = int(np.argmax(np.abs(walls - np.median(walls))))
        rest = np.delete(walls, worst)
        if rest.size:
            without = t.b_mean_us - rest.mean() if side == "A" else rest.mean() - t.a_mean_us
            if _direction(without / t.a_mean_us, noise) == typical:
                step = steps[worst]
                return (
                    f"{said}: step {step.step} of {side} took {fmt.duration(walls[worst])}, "
                    f"{walls[worst] / np.median(walls):.1f}x its median (an outlier); without it the mean "
                    f"changed by {'+' if without > 0 else '-'}{fmt.duration(abs(without))}. The verdict goes by "
                    "the typical step."
                )
    return f"{said}: a few long steps skew the step times, which moves the mean more than the median."


def _steps_note(t: StepTimeChange, confidence: float) -> list[str]:
    """Which minimum a side missed, when one did: the rank test's for the step time, Welch's for the rows."""
    if t.low is not None:
        return []
    rows = (
        "; the rows' t-test needs 2 a side, so they are not tested either"
        if min(t.a_steps, t.b_steps) < ROW_MIN_STEPS
        else ""
    )
    return [
        (
            f"{t.a_steps} against {t.b_steps} step{'s' * (t.b_steps != 1)}: the step-time rank test needs at least "
            f"{t.min_steps} steps a side at {fmt.level(confidence)} confidence for an interval{rows}; profile more "
            "steps (active=10) for a verdict."
        )
    ]


def diff(a: Source, b: Source, *, confidence: float = 0.95, noise_threshold: float = 0.02) -> Diff:
    """Compare B with A: step time, every operator, label, GPU activity and count per step, and the findings.

    `a` and `b` are run folders, trace files, `PATH@steps=SPEC` selections (`log/run@steps=2-4,7`), Summaries,
    or `diff_inputs.Input`s (a Summary and its steps: the kprof tab summarizes runs itself). `confidence` sets
    the step time's interval and the false discovery rate of the rows (1 - confidence); changes under
    `noise_threshold` (a fraction of A's value) are never significant. The result is deterministic.
    """
    stats.check_confidence(confidence)
    stats.check_noise_threshold(noise_threshold)
    sides = load(a, b)
    tables = select(sides)
    if not all(outside.KIND in side.summary.per_step.kind for side in sides):  # a summary saved before these rows
        tables = tuple(t.without(outside.KIND) for t in tables)
    changes, row_confidence = _rows(*tables, confidence, noise_threshold, memory_diff.rows(sides, tables))
    step_time = _step_time(tables, (sides[0].summary, sides[1].summary), confidence, noise_threshold)
    same_run = sides[0].summary is sides[1].summary
    evidence = [samples(x.summary.series, [s.step for s in t.steps]) for x, t in zip(sides, tables)]
    machines = compare_machines(*evidence, step_time.change, step_time.significant, explain.proportional(changes))
    notes = _steps_note(step_time, confidence) + _broad_shift(changes)
    if same_run:
        notes.append("Both sides are steps of one run: its findings (diagnostics) are per run, so none are compared.")
    a_side, b_side = (
        Side(side.source, side.summary.name, sorted({s.step for s in t.steps}), len(t.steps))
        for side, t in zip(sides, tables)
    )
    return Diff(
        a=a_side,
        b=b_side,
        step_time=step_time,
        changes=changes,
        diagnostics=[] if same_run else _diagnostic_changes(sides[0].summary, sides[1].summary),
        notes=notes,
        mean_step_change_us=step_time.b_mean_us - step_time.a_mean_us,
        confidence=confidence,
        noise_threshold=noise_threshold,
        row_confidence=row_confidence,
        memory=memory_diff.change(sides, tables),
        capture=[
            f"{side}: {d.message}" for side, x in zip("AB", sides) for d in health.split(x.summary.diagnostics)[0]
        ],
        machine=machines,
    )
