"""Step timing without host syncs, and ``time_cuda`` for timing one function the way the seeds do.

CUDA work is asynchronous: a ``perf_counter`` around a step measures the launches, not the work. On a GPU we
record a CUDA event at every step boundary and read the elapsed times later, once the events have completed,
so the training thread never waits for the device.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .checks import check_bool, check_int


class StepTimer:
    """Times the interval between consecutive ``mark()`` calls (CUDA events on GPU, ``perf_counter`` on CPU)."""

    def __init__(self, cuda: bool | None = None) -> None:
        self.cuda = torch.cuda.is_available() if cuda is None else cuda
        self.times: list[float] = []  # seconds per completed step, in step order
        self._pending: deque = deque()  # CUDA events not yet known to have completed
        self._last = None  # the previous boundary: an event (CUDA) or a perf_counter value (CPU)
        self._spare: list = []

    def mark(self) -> None:
        """Record a step boundary; the step that just ended is timed from the previous boundary."""
        if not self.cuda:
            now = time.perf_counter()
            if self._last is not None:
                self.times.append(now - self._last)
            self._last = now
            return
        event = self._spare.pop() if self._spare else torch.cuda.Event(enable_timing=True)
        event.record()
        self._pending.append(event)

    def poll(self) -> list[float]:
        """Resolve the CUDA events that have completed, without waiting; returns the newly known step times."""
        if not self.cuda:
            return []
        start = len(self.times)
        while self._pending and self._pending[0].query():
            self._resolve_oldest()
        return self.times[start:]

    def reader(self) -> Callable[[], tuple[int, list[float]]]:
        """A cursor over the step times: each call polls and returns (index of the first new step, the new times).

        Every consumer (scalars, the slow-step trigger, the Lightning logger) keeps its own reader.
        """
        seen = 0

        def read() -> tuple[int, list[float]]:
            nonlocal seen
            self.poll()
            start, seen = seen, len(self.times)
            return start, self.times[start:]

        return read

    def drain(self) -> list[float]:
        """Wait for all recorded boundaries and resolve them (call outside the hot loop)."""
        start = len(self.times)
        if self.cuda and self._pending:
            self._pending[-1].synchronize()
            while self._pending:
                self._resolve_oldest()
        return self.times[start:]

    def _resolve_oldest(self) -> None:
        event = self._pending.popleft()
        if self._last is not None:
            self.times.append(self._last.elapsed_time(event) / 1000.0)
            self._spare.append(self._last)
        self._last = event


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
