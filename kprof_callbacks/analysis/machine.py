"""What the machine did during a run, from the samples a session writes with its scalars (``..machine``): when a run
was starved of CPU or its GPU throttled, and which steps (findings of kinds ``machine_*``), and whether one side of a
diff ran on a busier or throttled machine than the other (``compare``).

A slowdown with evidence of contention that every part of the step shares alike (``explain.proportional``) is the
machine, not the code: the diff says so and the regression gate answers "inconclusive" (exit status 4).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np

from .. import layout
from ..machine import THROTTLES
from . import fmt
from .series import Series
from .tables import Diagnostic

PREFIX = "machine_"
STARVED_SHARE = 0.10  # a sample in which the training thread waited for a CPU this share of the time: starved
CLOCK_SHARE = 0.90  # a GPU clock below this share of its maximum: slowed
BUSIER_WAIT = 0.05  # one side's thread waited for a CPU this share of the time more than the other's: busier
UNIFORM = 0.5  # at least this share of a slowdown is every row growing by one factor: a uniform slowdown
ACCOUNTED = 0.5  # the busier side's measured CPU wait or clock loss accounts for at least this share of its slowdown
ACCOUNTED_UNIFORM = (
    0.25  # ... or this share, when the slowdown is uniform: a core's other tenant slows it beyond its wait
)
TAGS = layout.MACHINE_TAGS


def is_machine(d: Diagnostic) -> bool:
    """Whether a finding is about the machine (compared between runs by ``compare``, not as a finding)."""
    return d.kind.startswith(PREFIX)


@dataclasses.dataclass(frozen=True)
class Samples:
    """One run's machine samples (all workers): per tag, its values at the samples; each sample's steps (first,
    last)."""

    values: dict[str, np.ndarray]
    first: np.ndarray
    last: np.ndarray

    def __len__(self) -> int:
        return int(self.last.size)

    def median(self, key: str) -> float | None:
        v = self.values.get(TAGS[key])
        v = v[~np.isnan(v)] if v is not None else v
        return float(np.median(v)) if v is not None and v.size else None

    def steps(self, rows: np.ndarray) -> str:
        return fmt.ranges(s for i in np.flatnonzero(rows) for s in range(int(self.first[i]), int(self.last[i]) + 1))


def samples(series: dict[str, dict[str, Series]], steps: Iterable[int] | None = None) -> Samples | None:
    """The samples of every worker in ``series`` whose steps overlap ``steps`` (all of them when none do, or when
    ``steps`` is None); None without machine samples."""
    blocks = []
    for tags in series.values():
        rates = tags.get(TAGS["cpu_per_wall"])  # every sample after the first has it: its steps follow the last one
        if rates is not None:
            ends = rates.steps
            values = {tag: _at(s, ends) for tag, s in tags.items() if tag in TAGS.values()}
            blocks.append((np.concatenate([[0], ends[:-1]]), ends - 1, values))
    if not blocks:
        return None
    first, last = (np.concatenate([b[k] for b in blocks]) for k in (0, 1))
    tags = {tag for *_, values in blocks for tag in values}
    values = {t: np.concatenate([b[2].get(t, np.full(b[0].size, np.nan)) for b in blocks]) for t in tags}
    wanted = np.unique(np.fromiter(steps or (), np.int64))
    hit = np.searchsorted(wanted, last, side="right") > np.searchsorted(wanted, first, side="left")
    pick = hit if hit.any() else np.ones(first.size, bool)
    return Samples({t: v[pick] for t, v in values.items()}, first[pick], last[pick])


def to_dict(series: dict[str, dict[str, Series]]) -> dict[str, dict[str, list]]:
    """The machine's samples of ``series``, JSON-safe: worker -> tag -> [steps, values]."""
    return {
        worker: {tag: [s.steps.tolist(), _json(s.values)] for tag, s in tags.items() if tag in TAGS.values()}
        for worker, tags in series.items()
        if TAGS["cpu_per_wall"] in tags
    }


def _json(values: np.ndarray) -> list[float | None]:
    return [None if np.isnan(v) else v for v in values.tolist()]


def from_dict(data: dict[str, dict[str, list]]) -> dict[str, dict[str, Series]]:
    """The series ``to_dict`` wrote."""
    return {
        worker: {tag: Series(np.array(st, np.int64), np.array(v, np.float64)) for tag, (st, v) in tags.items()}
        for worker, tags in data.items()
    }


def _at(series: Series, steps: np.ndarray) -> np.ndarray:
    """The value of ``series`` at each of ``steps``, or at its last step before (a value given once: the CPUs)."""
    at = np.searchsorted(series.steps, steps, side="right") - 1
    return np.where(at >= 0, series.values[np.maximum(at, 0)], np.nan)


def findings(series: dict[str, dict[str, Series]]) -> list[Diagnostic]:
    """When the run was starved of CPU or its GPU slowed (throttled, clocked down, shared), and in which steps."""
    s = samples(series)
    if s is None:
        return []
    found = []
    wait = s.values.get(TAGS["cpu_wait"])
    if wait is not None:
        starved = wait >= STARVED_SHARE
        if starved.any():
            text = (
                f"Starved of CPU in steps {s.steps(starved)} ({int(starved.sum())} of {len(s)} samples): the training "
                f"thread waited for a CPU {fmt.share(float(np.median(wait[starved])))} of the time "
                f"({_load(s, starved)}). Other processes took its cores: those steps are slower because of the "
                "machine, not the code."
            )
            found.append(Diagnostic(PREFIX + "starved", "warning", text))
    slowed = _gpu_slowed(s)
    if slowed.any():
        found.append(Diagnostic(PREFIX + "throttled", "warning", f"{_gpu_words(s, slowed)}."))
    others = s.values.get(TAGS["other_processes"])
    if others is not None and np.nanmax(others) > 0:
        text = (
            f"Other processes computed on the GPU in steps {s.steps(others > 0)} (up to {int(np.nanmax(others))} "
            "besides this one): they share its time and memory bandwidth."
        )
        found.append(Diagnostic(PREFIX + "shared_gpu", "warning", text))
    return found


def _load(s: Samples, rows: np.ndarray) -> str:
    parts = []
    for key, words in (("runnable", "runnable tasks"), ("load1", "load average")):
        v = s.values.get(TAGS[key])
        if v is not None:
            parts.append(f"{words} {float(np.nanmedian(v[rows])):.3g}")
    cpus = s.median("cpus")
    return ", ".join(parts) + (f" on {cpus:g} CPUs" if cpus else "")


def _gpu_slowed(s: Samples) -> np.ndarray:
    reasons = s.values.get(TAGS["throttle"], np.zeros(len(s)))
    clock, top = s.values.get(TAGS["sm_clock"]), s.values.get(TAGS["max_sm_clock"])
    low = clock < CLOCK_SHARE * top if clock is not None and top is not None else np.zeros(len(s), bool)
    return (np.nan_to_num(reasons) > 0) | np.nan_to_num(low, nan=False).astype(bool)


def _gpu_words(s: Samples, rows: np.ndarray) -> str:
    """The GPU's slowing in the samples ``rows``: the throttle reasons seen, its clock, its temperature."""
    seen = np.nan_to_num(s.values.get(TAGS["throttle"], np.zeros(len(s)))[rows]).astype(np.int64)
    reasons = int(np.bitwise_or.reduce(seen, initial=0))
    names = ", ".join(name for bit, name in THROTTLES.items() if reasons & bit) or "clocked down"
    clock, top, temp = (s.values.get(TAGS[k]) for k in ("sm_clock", "max_sm_clock", "temperature"))
    said = f"The GPU slowed in steps {s.steps(rows)} ({names})"
    if clock is not None:
        said += f": SM clock {float(np.nanmedian(clock[rows])):.0f} MHz"
        said += f" of {float(np.nanmax(top)):.0f}" if top is not None else ""
    return said + (f", {float(np.nanmax(temp[rows])):.0f} °C" if temp is not None else "")


@dataclasses.dataclass(frozen=True)
class Change:
    """How the machines of a diff's two sides differed: the side that ran on the busier or slower machine (None when
    neither, or each in its own way), what shows it, both sides' numbers, and whether that explains B's change."""

    busier: str | None  # "A" or "B"
    evidence: list[str]  # "the training thread waited for a CPU 0.1% -> 25% of the time", A's number first
    lost: float | None  # how much longer the busier side's steps were for what it measurably lost (0.43: 43%)
    accounted: float | None  # the share of the slower side's slowdown its measured wait or clock accounts for
    loss: str  # which: "its training thread's wait for a CPU", "its lower GPU clock" ("" when neither was measured)
    uniform: float  # the share of the change in step time that is every row growing by one factor
    explains: bool  # the slower side ran on the busier machine, and that accounts for its slowdown: the machine

    def sentence(self) -> str:
        """The evidence in one sentence, and what it means for the verdict."""
        said = f"{self.busier} ran on a busier or slower machine: " if self.busier else "The machines differed: "
        said += "; ".join(self.evidence) + "."
        if not self.explains:
            return said
        share = fmt.share(self.uniform)
        why = f"every part of the step slowed alike ({share} of the change is each row growing by one factor)"
        if self.accounted is not None:
            why = f"{self.loss} accounts for {fmt.share(self.accounted)} of the slowdown" + (
                f", and {why}" if self.uniform >= UNIFORM else ""
            )
        return (
            f"{said} {why[0].upper()}{why[1:]}: the machine changed, not necessarily the code; rerun both sides on one "
            "quiet machine, or interleave them (kprof compare)."
        )


def _pair(a: Samples, b: Samples, key: str, words: str, unit: str = "") -> str:
    x, y = a.median(key), b.median(key)
    if unit == "%":
        return f"{words} {fmt.share(x)} -> {fmt.share(y)}"
    return f"{words} {x:.3g}{unit} -> {y:.3g}{unit}"


def _busier(x: Samples, y: Samples) -> list[str]:
    """The evidence that ``x`` ran on a busier or slower machine than ``y`` (empty: none)."""
    found = []
    wx, wy = x.median("cpu_wait"), y.median("cpu_wait")
    if wx is not None and wy is not None and wx - wy >= BUSIER_WAIT:
        found.append("wait")
    rx, ry, cpus = x.median("runnable"), y.median("runnable"), x.median("cpus") or 1.0
    if rx is not None and ry is not None and rx - ry >= 1 and rx > cpus:
        found.append("runnable")
    ix, iy = x.median("involuntary_switches"), y.median("involuntary_switches")
    if ix is not None and iy is not None and ix >= 2 * iy + 1:
        found.append("switches")
    if _gpu_slowed(x).mean() - _gpu_slowed(y).mean() >= 0.5:
        found.append("throttle")
    cx, cy = x.median("sm_clock"), y.median("sm_clock")
    if cx is not None and cy is not None and cx < CLOCK_SHARE * cy:
        found.append("clock")
    ox, oy = x.median("other_processes"), y.median("other_processes")
    if ox is not None and oy is not None and ox > oy:
        found.append("others")
    return found


def _words(a: Samples, b: Samples, signs: set[str]) -> list[str]:
    """Both sides' numbers for each kind of evidence in ``signs``, A's first."""
    out = []
    if "wait" in signs:
        out.append(_pair(a, b, "cpu_wait", "the training thread waited for a CPU", "%") + " of the time")
    if "runnable" in signs or "wait" in signs:
        load = _pair(a, b, "runnable", "runnable tasks")
        out.append(f"{load} on {a.median('cpus') or 0:g} CPUs ({_pair(a, b, 'load1', 'load average')})")
    if "switches" in signs:
        out.append(_pair(a, b, "involuntary_switches", "involuntary context switches") + " per step")
    if signs & {"throttle", "clock"}:
        out.append(_pair(a, b, "sm_clock", "GPU SM clock", " MHz"))
        shares = [fmt.share(float(_gpu_slowed(x).mean())) for x in (a, b)]
        out.append(f"samples with the GPU throttled {shares[0]} -> {shares[1]}")
    if "others" in signs:
        out.append(_pair(a, b, "other_processes", "other processes on the GPU"))
    return out


def _loss(quiet: Samples, busy: Samples) -> tuple[float, str] | None:
    """How much longer the busier side's steps were for what it measurably lost, and which loss: the time its
    training thread waited for a CPU (a step of work w with a wait share s takes w / (1 - s)), or its lower GPU
    clock; None where neither was measured on both sides."""
    lost = []
    wq, wb = quiet.median("cpu_wait"), busy.median("cpu_wait")
    if wq is not None and wb is not None and wb < 1.0:
        lost.append(((1.0 - wq) / (1.0 - wb) - 1.0, "its training thread's wait for a CPU"))
    cq, cb = quiet.median("sm_clock"), busy.median("sm_clock")
    if cq and cb:
        lost.append((cq / cb - 1.0, "its lower GPU clock"))
    return max(lost) if lost else None


def compare(a: Samples | None, b: Samples | None, change: float, significant: bool, uniform: float) -> Change | None:
    """How A's and B's machines differed (None when they did not, or a side has no samples). ``change``: B's typical
    step over A's, minus 1, ``significant``: whether the step-time verdict said faster or slower, ``uniform``:
    ``explain.proportional``. The machine explains the change when the slower side is the busier one and its measured
    wait or clock accounts for at least ACCOUNTED of its slowdown, or the slowdown is uniform (at least UNIFORM) and
    they account for at least ACCOUNTED_UNIFORM of it (processes sharing a core, its caches and memory bandwidth slow
    a step beyond the time it waited: under CPU hogs on the 2-core machine the wait accounts for 40-50% of a 2x
    slowdown), or nothing was measured to weigh it."""
    if a is None or b is None:
        return None
    signs = {"A": set(_busier(a, b)), "B": set(_busier(b, a))}
    if not signs["A"] and not signs["B"]:
        return None
    busier = None if signs["A"] and signs["B"] else "A" if signs["A"] else "B"
    slower = None if not significant else "B" if change > 0 else "A"
    slowdown = change if slower == "B" else 1.0 / (1.0 + change) - 1.0
    lost, loss = (None if busier is None else _loss(*((a, b) if busier == "B" else (b, a)))) or (None, "")
    accounted = lost / slowdown if lost is not None and slowdown > 0 else None
    uniform_enough = uniform >= UNIFORM and (accounted is None or accounted >= ACCOUNTED_UNIFORM)
    enough = uniform_enough or (accounted is not None and accounted >= ACCOUNTED)
    words = _words(a, b, signs["A"] | signs["B"])
    return Change(busier, words, lost, accounted, loss, uniform, busier == slower and enough)
