"""Per-step numbers of the last ``KEEP_STEPS`` steps, so kprof's own memory stays flat however long training runs.

A session keeps each step's time, its own cost, the work the program declared and the memory samples only until
every reader (the scalar writer, the slow-step trigger, the Lightning logger) has taken them; they read every few
steps, far fewer than ``KEEP_STEPS``. The full record of every step is the scalars on disk.
"""

from __future__ import annotations

import math
from array import array

KEEP_STEPS = 8192
"""Steps of history kept in memory (a ring): 64 KB per column."""


class History:
    """A ring of ``columns`` floats per step, indexed by the step's number (NaN: not recorded), allocated once."""

    def __init__(self, columns: int, keep: int = KEEP_STEPS) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.keep = keep
        self.end = 0  # one past the highest step written
        self._columns = [array("d", [math.nan]) * keep for _ in range(columns)]

    @property
    def start(self) -> int:
        """The oldest step still held."""
        return max(0, self.end - self.keep)

    def put(self, step: int, column: int, value: float) -> None:
        """Record ``value`` in ``column`` of ``step`` (a step older than the ring holds is an error)."""
        if step >= self.end:
            self._advance(step)
        elif step < self.end - self.keep:
            raise IndexError(f"step {step} is older than the {self.keep} steps kept (from {self.start})")
        self._columns[column][step % self.keep] = value

    def _advance(self, step: int) -> None:
        """Make ``step`` the newest; the rows that come round for it start empty."""
        if step >= self.keep:
            for new in range(max(self.end, step + 1 - self.keep), step + 1):
                for values in self._columns:
                    values[new % self.keep] = math.nan
        self.end = step + 1

    def column(self, column: int, start: int, stop: int) -> list[float]:
        """The values of steps ``start`` to ``stop - 1`` (NaN for a step not held: too old, or not yet written)."""
        return [self._get(column, step) for step in range(start, stop)]

    def rows(self, start: int, stop: int) -> list[tuple[float, ...]]:
        """Every column of steps ``start`` to ``stop - 1``, a tuple per step."""
        return list(zip(*(self.column(c, start, stop) for c in range(len(self._columns)))))

    def _get(self, column: int, step: int) -> float:
        return self._columns[column][step % self.keep] if self.start <= step < self.end else math.nan
