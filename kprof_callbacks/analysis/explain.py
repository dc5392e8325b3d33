"""Which rows of a diff explain its change in step time, in order of their share, and how much they explain together.

A row's share is its change per step over the change in mean step time. Rows overlap in time (a label holds its
operators; GPU work runs beside the host's), so shares are not simply added: they add up only within a family of
rows that never count the same time twice. The host's step is its operators' self time plus the time between them
(``outside.BETWEEN_OPS``); a step's wall time is GPU activity plus GPU idle. What the rows that moved explain together
is the largest such sum over all of them (a lone label or data loading counts alone), a share that counts no time
twice; the largest few are named.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from . import fmt, outside
from .events import DEVICE_KINDS

if TYPE_CHECKING:
    from .tracediff import Change, Diff

MIN_SHARE = 0.05  # a row is named as explaining the change when it accounts for at least this share of it
FAMILIES: tuple[Callable[[Change], bool], ...] = (
    lambda c: c.kind == "op" or (c.kind == outside.KIND and c.name == outside.BETWEEN_OPS),
    lambda c: c.kind in DEVICE_KINDS or (c.kind == outside.KIND and c.name == outside.GPU_IDLE),
)
"""Rows whose times never overlap within one step: the host's (operators' self time, the time between them) and
the GPU's (its activities, its idle time)."""


@dataclasses.dataclass(frozen=True)
class Explanation:
    """The largest rows that moved the way the step time did, largest share first, and the share that all the rows that
    moved explain together."""

    rows: list[Change]
    shares: list[float]
    together: float

    def words(self) -> str:
        """`Python / host between operators +94.1 ms per step (98%), aten::mm +1.2 ms per step (1.3%)`."""
        return ", ".join(
            f"{fmt.row_label(c.kind, c.name)} {'+' if c.change > 0 else '-'}{fmt.duration(abs(c.change))} per step "
            f"({c.status}, {fmt.share(s)})"
            for c, s in zip(self.rows, self.shares)
        )


def together(d: Diff, rows: Sequence[Change]) -> float:
    """The share of the change in mean step time that ``rows`` explain, counting no time twice (see FAMILIES)."""
    shares = [d.share_of_step_change(c) for c in rows]
    sums = [sum(s for c, s in zip(rows, shares) if family(c)) for family in FAMILIES]
    return max([*sums, *shares, 0.0])


def explain(d: Diff, top: int, min_share: float = MIN_SHARE) -> Explanation:
    """The significant rows (counts aside) that moved the way the mean step time did, each at least ``min_share`` of
    that change, largest share first (``top`` of them), and what all the significant rows that moved that way
    explain together. GPU idle, the GPU waiting for the host, comes right after the time between operators when both
    moved: a sleep or Python work in the step makes the GPU wait as long, and the host's row names the cause."""
    moved = [c for c in d.significant() if c.kind != "count" and d.share_of_step_change(c) > 0]
    named = [c for c in moved if d.share_of_step_change(c) >= min_share]
    between = max((d.share_of_step_change(c) for c in named if _is(c, outside.BETWEEN_OPS)), default=None)

    def rank(c: Change) -> tuple[float, bool]:
        share, effect = d.share_of_step_change(c), between is not None and _is(c, outside.GPU_IDLE)
        return -(min(share, between) if effect else share), effect

    rows = sorted(named, key=rank)
    return Explanation(rows[:top], [d.share_of_step_change(c) for c in rows[:top]], together(d, moved))


def _is(c: Change, name: str) -> bool:
    return c.kind == outside.KIND and c.name == name


def proportional(changes: Sequence[Change]) -> float:
    """The share of the change in time per step that is every row of a family growing by one factor (the family's
    own), in the family that changed most: near 1 when load or clocks slowed everything alike, near 0 when a few
    rows (a new kernel, a sleep between operators) hold the change. A row's departure from that factor counts only
    beyond its own interval's half-width: preemption lands in whichever operator runs, a few milliseconds at a time,
    so over a few steps single rows scatter around the factor by as much as their noise."""
    best, moved = 0.0, 0.0
    for family in FAMILIES:
        rows = [c for c in changes if family(c)]
        a = sum(c.a for c in rows)
        change = sum(c.change for c in rows)
        spread = sum(abs(c.change) for c in rows)
        if not rows or not a or not spread or abs(change) <= moved:
            continue
        factor = change / a
        left = sum(max(0.0, abs(c.change - c.a * factor) - _half_width(c)) for c in rows)
        best, moved = max(0.0, 1.0 - left / spread), abs(change)
    return best


def _half_width(c: Change) -> float:
    """Half the width of a row's interval (0 where it has none: too few steps)."""
    return 0.0 if math.isnan(c.low) or math.isnan(c.high) else (c.high - c.low) / 2.0
