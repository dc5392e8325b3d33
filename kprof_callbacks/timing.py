"""Step timing without host syncs, and ``time_cuda`` for timing one function the way the seeds do.

CUDA work is asynchronous: a ``perf_counter`` around a step measures the launches, not the work. On a GPU we
record a CUDA event at every step boundary and read the elapsed times later, once the events have completed,
so the training thread never waits for the device.
"""

from __future__ import annotations

import math
import statistics
import time
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .checks import check_bool, check_int
from .history import KEEP_STEPS

_END, _START = 0, 1  # a step's work ended (the caller's own work begins); the next step began


class StepTimer:
    """Times each step apart from the caller's own work between steps (CUDA events on GPU, ``perf_counter`` on CPU).

    ``end()`` marks where a step's work ended and the caller's (kprof's) bookkeeping began, ``start()`` where that
    bookkeeping ended and the next step began: step ``k`` takes ``end_k - start_k`` and the caller's own time after
    it is ``start_{k+1} - end_k``. ``mark()`` is both at once (no own work). On a GPU both are events on the
    current stream, so a host stall that queued GPU work hid is charged to neither. The last ``keep`` steps are
    held (``history.KEEP_STEPS``); ``count`` says how many were timed in all.
    """

    def __init__(self, cuda: bool | None = None, keep: int = KEEP_STEPS) -> None:
        self.cuda = torch.cuda.is_available() if cuda is None else cuda
        self.keep = keep
        self._step_s = array("d", [0.0]) * keep  # rings: step k's seconds, and the own seconds after it, at k % keep
        self._own_s = array("d", [0.0]) * keep
        self.count = 0  # steps whose time is known
        self.own_count = 0  # steps whose own time after them is known too
        self._pending: deque = deque()  # (kind, CUDA event) not yet known to have completed
        self._last: tuple[int, object] | None = None  # the latest resolved boundary: (kind, event or seconds)
        self._spare: list = []

    def end(self) -> None:
        """The step's work ended here; what follows until ``start()`` is the caller's own time."""
        self._boundary(_END)

    def start(self) -> None:
        """The next step begins here (the first call starts the first step)."""
        self._boundary(_START)

    def mark(self) -> None:
        """A step boundary with no own work between the steps."""
        if not self.cuda:
            now = time.perf_counter()
            self._resolve(_END, now)
            self._resolve(_START, now)
            return
        event = self._event()
        self._pending.extend(((_END, event), (_START, event)))

    def poll(self) -> None:
        """Resolve the CUDA events that have completed, without waiting."""
        while self._pending and self._pending[0][1].query():
            self._resolve(*self._pending.popleft())

    def drain(self) -> None:
        """Wait for all recorded boundaries and resolve them (call outside the hot loop)."""
        if self._pending:
            self._pending[-1][1].synchronize()
            while self._pending:
                self._resolve(*self._pending.popleft())

    def times(self) -> list[float]:
        """Seconds of each step held, oldest first."""
        return self._held(self._step_s, max(0, self.count - self.keep), self.count)

    def seconds(self, start: int, stop: int) -> list[float]:
        """Seconds of steps ``start`` to ``stop - 1``; NaN for a step no longer held or not yet known."""
        held = range(max(0, self.count - self.keep), self.count)
        return [self._step_s[k % self.keep] if k in held else math.nan for k in range(start, stop)]

    def reader(self, own: bool = False) -> Callable[[], tuple[int, list]]:
        """A cursor over the steps: each call polls and returns (the first new step, their times).

        The times are each step's seconds, or with ``own=True`` (step seconds, own seconds after it) pairs, for
        the steps whose own time is known too. Every consumer (scalars, the slow-step trigger, the Lightning
        logger) keeps its own reader; one that falls more than ``keep`` steps behind skips the oldest.
        """
        seen = 0

        def read() -> tuple[int, list]:
            nonlocal seen
            if self._pending:
                self.poll()
            stop = self.own_count if own else self.count
            start, seen = max(seen, self.count - self.keep, 0), stop
            steps = self._held(self._step_s, start, stop)
            return start, list(zip(steps, self._held(self._own_s, start, stop))) if own else steps

        return read

    def _held(self, ring: array, start: int, stop: int) -> list[float]:
        return [ring[k % self.keep] for k in range(start, stop)]

    def _event(self):
        event = self._spare.pop() if self._spare else torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _boundary(self, kind: int) -> None:
        if self.cuda:
            self._pending.append((kind, self._event()))
        else:
            self._resolve(kind, time.perf_counter())

    def _resolve(self, kind: int, at) -> None:
        """Account the time from the previous boundary to this one, ``at`` (an event or perf_counter seconds)."""
        last = self._last
        self._last = (kind, at)
        if last is None:
            return
        if last[0] == _START and kind == _END:
            self._step_s[self.count % self.keep] = self._seconds(last[1], at)
            self.count += 1
        elif last[0] == _END and kind == _START and self.own_count < self.count:
            self._own_s[self.own_count % self.keep] = self._seconds(last[1], at)
            self.own_count += 1
        if self.cuda and last[1] is not at:
            self._spare.append(last[1])

    def _seconds(self, first, second) -> float:
        return first.elapsed_time(second) / 1000.0 if self.cuda else second - first


@dataclass(frozen=True)
class Timing:
    """Result of ``time_cuda``: per-iteration times in milliseconds and their summary statistics."""

    times_ms: tuple[float, ...]
    device: str

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms)

    @property
    def p10_ms(self) -> float:
        return _quantile(self.times_ms, 0.10)

    @property
    def p90_ms(self) -> float:
        return _quantile(self.times_ms, 0.90)

    def __str__(self) -> str:
        return (
            f"median {self.median_ms:.4f} ms (p10 {self.p10_ms:.4f}, p90 {self.p90_ms:.4f}; "
            f"{len(self.times_ms)} iters on {self.device})"
        )


def _quantile(values, q: float) -> float:
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


_L2_FLUSH_BYTES = 256 * 1024 * 1024  # larger than any current GPU's L2 (H100: 50 MB)


def time_cuda(
    fn: Callable, *args, warmup: int = 5, iters: int = 50, flush_l2: bool = False, device: str | None = None, **kwargs
) -> Timing:
    """Time ``fn(*args, **kwargs)``: ``warmup`` untimed calls, then ``iters`` calls each between two CUDA events.

    ``flush_l2=True`` overwrites a buffer larger than the L2 cache before every timed call, so each call starts
    cold (as it would inside a real training step). Falls back to ``perf_counter`` when CUDA is not usable.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    check_int("warmup", warmup, 0)
    check_int("iters", iters, 1)
    check_bool("flush_l2", flush_l2)
    if device is not None and (not isinstance(device, str) or device.split(":")[0] not in ("cpu", "cuda")):
        raise ValueError(f"device must be None, 'cpu' or 'cuda[:N]', got {device!r}")
    cuda = torch.cuda.is_available() if device is None else device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise ValueError(f"device={device!r}, but no CUDA device is usable here (device=None times on the CPU)")
    for _ in range(warmup):
        fn(*args, **kwargs)
    if not cuda:
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn(*args, **kwargs)
            times.append((time.perf_counter() - t0) * 1000.0)
        return Timing(tuple(times), "cpu")
    flush = torch.empty(_L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda") if flush_l2 else None
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    torch.cuda.synchronize()
    for start, end in pairs:
        if flush is not None:
            flush.zero_()
        start.record()
        fn(*args, **kwargs)
        end.record()
    torch.cuda.synchronize()
    return Timing(tuple(s.elapsed_time(e) for s, e in pairs), torch.cuda.get_device_name())
