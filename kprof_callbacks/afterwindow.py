"""What the steps right after a window pay for its export, measured and charged to kprof.

A window's trace is exported by a forked process (``writer.py``) while training goes on. The fork leaves every page of
the training process copy-on-write, so the first write to each page after it faults and copies: the user's next step,
which writes its weights, gradients and optimizer state again, pays for each page it touches while the export runs
beside it (on the 2-core CPU machine, about 8,400 faults and 3-4x the step for a 32 MB working set;
``benchmarks/after_window.py --bump``). That is kprof's cost paid inside the user's step, so the session counts the
minor faults of each of the ``STEPS`` steps after a window (``getrusage``, only those steps). A step that copied at
least ``COPIED`` pages paid for the export, and its time beyond the median of the ``BEFORE`` steps before the window is
charged; a step with fewer faults is charged only those, at the cost of one timed on a scratch buffer of kprof's own.
The charge goes to ``kprof/after_window_ms``, and ``kprof/step_time_ms`` leaves it out. A step slow for reasons of its
own (a sleep, a longer batch) after the one that took the copies keeps its time.
"""

from __future__ import annotations

import math
import mmap
import resource
import statistics
import time
from collections import deque
from collections.abc import Callable

STEPS = 2  # steps after a window charged for it
BEFORE = 8  # steps before the window whose median is the typical step
_PAGES = 64  # scratch pages written after each fork: a copy-on-write fault each
COPIED = 256  # a step with this many faults (1 MB of pages copied) paid for the export: all its extra time is kprof's


def _minor_faults(who: int = resource.RUSAGE_SELF) -> int:
    return resource.getrusage(who).ru_minflt


_THIS_THREAD = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)  # the scratch pages' faults, not others'


class AfterWindow:
    """The windows that ended, the faults of the steps after them, and the charge for each such step (``charge``)."""

    def __init__(self) -> None:
        self._windows: deque[tuple[int, int]] = deque(maxlen=4)  # (first step, warm-up included; last step)
        self._faults: dict[int, int] = {}  # step after a window -> its minor faults
        self._started: tuple[int, int] | None = None  # (step, minor faults when it started)
        self._scratch = mmap.mmap(-1, _PAGES * mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self._scratch.write(b"\1" * len(self._scratch))  # resident, so each write after a fork copies a page
        self.fault_s = 0.0  # one copy-on-write fault, timed after the last window's fork
        self._timed = False  # whether fault_s was timed since that fork

    def ended(self, first: int, last: int) -> None:
        """A window of steps ``first`` (its warm-up's first) to ``last`` ended; its export forks now or at a step
        soon after."""
        self._windows.append((first, last))
        self._timed = False

    def _fault_cost(self) -> float:
        """Seconds of one copy-on-write fault now: writing each scratch page copies it (0 when the export did not
        fork, or not yet: no fault)."""
        faults, start = _minor_faults(_THIS_THREAD), time.perf_counter()
        for page in range(0, len(self._scratch), mmap.PAGESIZE):
            self._scratch[page] = 2
        took, copied = time.perf_counter() - start, _minor_faults(_THIS_THREAD) - faults
        return took / copied if copied else 0.0

    def charged(self, step: int) -> bool:
        """Whether ``step`` is one of the ``STEPS`` steps after a window (its charge may be 0)."""
        return any(last < step <= last + STEPS for _, last in self._windows)

    def started(self, step: int) -> None:
        """Step ``step`` begins (the training thread, at kprof's exit)."""
        self._started = (step, _minor_faults()) if self.charged(step) else None

    def finished(self, step: int) -> None:
        """Step ``step`` ended (the training thread, at kprof's entry)."""
        if self._started is not None and self._started[0] == step:
            self._faults[step] = _minor_faults() - self._started[1]
            self._started = None
            while len(self._faults) > 4 * STEPS:
                del self._faults[min(self._faults)]
            if not self._timed:  # the first time after the fork: a fault's cost in the state the step ran in
                self.fault_s = self._fault_cost()
                self._timed = self.fault_s > 0

    def charge(self, step: int, seconds: float, held: Callable[[int, int], list[float]]) -> float:
        """The seconds of ``step`` (``seconds`` long) charged to kprof: its time beyond the median of the steps
        before the window when it copied at least COPIED pages (it paid for the export: the copies, the export
        running beside it, caches it found cold), else only its few faults at the measured cost. ``held(start,
        stop)`` gives the step times still held (NaN for a step that is not)."""
        for first, last in self._windows:
            if last < step <= last + STEPS:
                before = [t for t in held(max(0, first - BEFORE), first) if not math.isnan(t)]
                beyond = seconds - statistics.median(before) if before else 0.0
                faults = self._faults.get(step, 0)
                return max(0.0, beyond if faults >= COPIED else min(beyond, faults * self.fault_s))
        return 0.0

    def close(self) -> None:
        self._scratch.close()
