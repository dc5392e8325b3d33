"""Memory in `kprof.diff`: rows of kind "memory" (the peak allocated, each kind and each module alive at the peak,
per step) tested with the other rows, and the memory gate (``--fail-if-more-memory PCT``) on the medians over steps
of each side's peak."""

from __future__ import annotations

import dataclasses
from statistics import median
from typing import TYPE_CHECKING

import numpy as np

from . import fmt
from .memory import KINDS, MemoryStep

if TYPE_CHECKING:
    from .diff_inputs import Input
    from .perstep import PerStep
    from .tracediff import Change, Diff

PEAK = "peak allocated"
_KIND_ROW, _MODULE_ROW = "kind: ", "module: "


@dataclasses.dataclass(frozen=True)
class MemoryChange:
    """Each side's memory peak over its selected steps: the median (the gate's figure) and the highest, in bytes."""

    a_median: int
    b_median: int
    a_max: int
    b_max: int
    a_steps: int
    b_steps: int

    @property
    def change(self) -> float:
        """B's median peak relative to A's, minus 1: +0.1 is 10% more memory."""
        return self.b_median / self.a_median - 1.0 if self.a_median else 0.0


def _steps(side: Input, table: PerStep) -> list[MemoryStep | None]:
    """The memory row of each step (column) of ``table``, None where the side recorded none."""
    memory = side.summary.memory
    rows = {(s.rank, s.worker, s.step): s for s in memory.steps} if memory else {}
    return [rows.get((s.rank, s.worker, s.step)) for s in table.steps]


def _values(steps: list[MemoryStep | None], names: list[str]) -> np.ndarray:
    out = np.zeros((len(names), len(steps)))
    for j, s in enumerate(steps):
        if s is None:
            continue
        for i, name in enumerate(names):
            if name == PEAK:
                out[i, j] = s.peak
            elif name.startswith(_KIND_ROW):
                out[i, j] = s.kinds.get(name.removeprefix(_KIND_ROW), 0)
            else:
                out[i, j] = s.modules.get(name.removeprefix(_MODULE_ROW), 0)
    return out


def rows(sides: list[Input], tables: tuple[PerStep, PerStep]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The memory rows both sides can be compared on: their names and per-step bytes (rows x steps) of A and B; none
    unless both sides recorded memory."""
    a, b = (_steps(side, table) for side, table in zip(sides, tables))
    if not any(a) or not any(b):
        return [], np.zeros((0, len(a))), np.zeros((0, len(b)))
    kinds = [k for k in KINDS if any(s and s.kinds.get(k) for s in a + b)]
    modules = sorted({m for s in a + b if s for m in s.modules})
    names = [PEAK] + [_KIND_ROW + k for k in kinds] + [_MODULE_ROW + m for m in modules]
    return names, _values(a, names), _values(b, names)


def change(sides: list[Input], tables: tuple[PerStep, PerStep]) -> MemoryChange | None:
    """Each side's median and highest peak over its selected steps; None unless both recorded memory."""
    a, b = ([s.peak for s in _steps(side, table) if s] for side, table in zip(sides, tables))
    if not a or not b:
        return None
    return MemoryChange(int(median(a)), int(median(b)), max(a), max(b), len(a), len(b))


def memory_order(changes: list[Change]) -> list[Change]:
    """Rows in the order a report lists them: memory rows as peak, kinds, modules (each group's own order kept);
    other rows as they are."""
    rank = {PEAK: 0, _KIND_ROW: 1}
    return sorted(
        changes, key=lambda c: rank.get(c.name, rank.get(c.name[: len(_KIND_ROW)], 2)) if c.kind == "memory" else 0
    )


def check_pct(pct: float) -> float:
    """``pct`` as a fraction, checked (a percentage >= 0)."""
    if isinstance(pct, bool) or not isinstance(pct, (int, float)) or not 0 <= pct < float("inf"):
        raise ValueError(f"the memory limit must be a percentage >= 0, got {pct!r}")
    return pct / 100.0


def more_memory(d: Diff, pct: float) -> bool:
    """Whether B's median peak allocated is above A's by more than ``pct`` percent; ValueError when a side recorded
    no memory (profile with profile_memory=True)."""
    limit = check_pct(pct)
    if d.memory is None:
        raise ValueError("a side recorded no memory events: profile both with profile_memory=True")
    return d.memory.b_median > d.memory.a_median * (1.0 + limit)


def gate(d: Diff, pct: float) -> str:
    """The memory gate's answer in words, with the medians and what grew at the peak when it failed."""
    check_pct(pct)
    m = d.memory
    if m is None:
        return f"No memory verdict (limit {fmt.limit(pct)}): a side recorded no memory events (profile_memory=True)."
    figures = (
        f"B's peak allocated is {fmt.size(m.b_median)} against A's {fmt.size(m.a_median)} ({m.change:+.1%}; medians "
        f"over {m.b_steps} and {m.a_steps} steps; highest {fmt.size(m.b_max)} and {fmt.size(m.a_max)})"
    )
    if not more_memory(d, pct):
        return f"No memory regression (limit {fmt.limit(pct)}): {figures}."
    grew = [c for c in d.significant(("memory",)) if c.change > 0 and c.name != PEAK][:4]
    what = ", ".join(f"{c.name} +{fmt.size(c.change)}" for c in grew)
    grew_text = f" What grew at the peak: {what}." if what else ""
    return f"Memory regression (limit {fmt.limit(pct)}): {figures}.{grew_text}"
