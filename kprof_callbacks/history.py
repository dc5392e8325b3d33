"""Per-step numbers of the last ``KEEP_STEPS`` steps, so kprof's own memory stays flat however long training runs.

A session keeps each step's time, its own cost, the work the program declared and the memory samples only until
every reader (the scalar writer, the slow-step trigger, the Lightning logger) has taken them; they read every few
steps, far fewer than ``KEEP_STEPS``. The full record of every step is the scalars on disk.
"""

from __future__ import annotations

import math
from array import array

KEEP_STEPS = 8192
"""Steps of history kept in memory (a ring): 128 KB per column, value and step."""


class History:
    """A ring of ``columns`` floats per step, indexed by the step's number (NaN: not recorded), allocated once. Each
    value is stamped with its step, so a row that comes round needs no clearing."""

    def __init__(self, columns: int, keep: int = KEEP_STEPS) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.keep = keep
        self.end = 0  # one past the highest step written
        self._values = [array("d", [math.nan]) * keep for _ in range(columns)]
        self._steps = [array("q", [-1]) * keep for _ in range(columns)]  # the step each value belongs to

    @property
    def start(self) -> int:
        """The oldest step still held."""
        return max(0, self.end - self.keep)

    def put(self, step: int, column: int, value: float) -> None:
        """Record ``value`` in ``column`` of ``step`` (a step older than the ring holds is an error)."""
        if step < self.end - self.keep:
            raise IndexError(f"step {step} is older than the {self.keep} steps kept (from {self.start})")
        row = step % self.keep
        self._values[column][row] = value
        self._steps[column][row] = step
        if step >= self.end:
            self.end = step + 1

    def column(self, column: int, start: int, stop: int) -> list[float]:
        """The values of steps ``start`` to ``stop - 1`` (NaN for a step not held: too old, or not written)."""
        values, steps, keep = self._values[column], self._steps[column], self.keep
        return [values[s % keep] if steps[s % keep] == s else math.nan for s in range(start, stop)]

    def rows(self, start: int, stop: int) -> list[tuple[float, ...]]:
        """Every column of steps ``start`` to ``stop - 1``, a tuple per step."""
        return list(zip(*(self.column(c, start, stop) for c in range(len(self._values)))))
