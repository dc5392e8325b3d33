"""Per-step scalars (step time, kprof's own cost, throughput, TFLOP/s and MFU, memory): one formula, two sinks.

``EventFile`` writes them as TensorBoard scalars beside the traces, on the trace writer's thread; the Lightning
callback hands the same ``step_metrics`` to the trainer's other loggers. Step N is ``ProfilerStep#N``: both count
the session's steps from 0. ``MemoryProbe`` reads memory without a device sync.
"""

from __future__ import annotations

import math
import numbers
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from . import layout, torch_compat

_MB = 2**20


MAX_FLOPS = 1e30  # per step: a machine of an exaFLOP/s would take 30,000 years over one


def check_flops(name: str, flops: object, *, zero: bool = True) -> float | None:
    """``flops`` as a float if it is a plausible count of a step's floating-point operations (finite, >= 0, or > 0
    where ``zero`` is False, and under ``MAX_FLOPS``; None passes), else a ValueError naming ``name``. A count that
    large is a unit slip, and it would overflow TFLOP/s (written as float32 scalars) to inf."""
    if flops is None:
        return None
    try:
        value = float(flops) if isinstance(flops, numbers.Real) and not isinstance(flops, bool) else None
    except OverflowError:  # an int beyond float's range, e.g. 10**400
        value = math.inf
    if value is None or not (value >= 0 if zero else value > 0) or not value < MAX_FLOPS:
        low = ">= 0" if zero else "> 0"
        raise ValueError(
            f"{name} must be the FLOPs of one step: a finite number {low} and below {MAX_FLOPS:.0e} "
            f"(e.g. 6 x parameters x tokens), or None; got {flops!r}"
        )
    return value


def step_metrics(
    seconds: float,
    samples: int | None,
    flops: float | None = None,
    peak_tflops: float | None = None,
    own_seconds: float | None = None,
) -> dict[str, float]:
    """The scalars of one step that took ``seconds`` (kprof's own cost apart: ``own_seconds``, None when not
    measured) and processed ``samples`` with ``flops`` (None: unknown); MFU against ``peak_tflops`` when it is
    known. Throughput, TFLOP/s and MFU are the step's own, without kprof's cost."""
    metrics = {layout.STEP_TIME_TAG: seconds * 1e3}
    if own_seconds is not None:
        metrics[layout.PROFILER_TAG] = own_seconds * 1e3
    if seconds > 0:
        if samples:
            metrics[layout.THROUGHPUT_TAG] = samples / seconds
        if flops:
            metrics[layout.TFLOPS_TAG] = flops / seconds / 1e12
            if peak_tflops:
                metrics[layout.MFU_TAG] = metrics[layout.TFLOPS_TAG] / peak_tflops
    return metrics


class MemoryProbe:
    """Memory now, without a device sync: the process's resident memory, and on a GPU the caching allocator's
    allocated, reserved and peak-since-the-last-sample bytes (host-side counters)."""

    def __init__(self, cuda_device: int | None) -> None:
        self.device = cuda_device
        try:
            self._statm = os.open("/proc/self/statm", os.O_RDONLY)  # Linux: a pread is ~2 us
        except OSError:
            self._statm = None
        self._page = os.sysconf("SC_PAGE_SIZE") if self._statm is not None else 0

    def sample(self) -> dict[str, float]:
        """MB by ``layout.MEMORY_TAGS`` tag."""
        out = {}
        if self._statm is not None:
            out[layout.MEMORY_TAGS["rss"]] = int(os.pread(self._statm, 64, 0).split()[1]) * self._page / _MB
        if self.device is not None:
            allocated, reserved, peak = torch_compat.cuda_memory(self.device)
            out[layout.MEMORY_TAGS["allocated"]] = allocated / _MB
            out[layout.MEMORY_TAGS["reserved"]] = reserved / _MB
            out[layout.MEMORY_TAGS["peak"]] = peak / _MB
        return out

    def close(self) -> None:
        if self._statm is not None:
            os.close(self._statm)
            self._statm = None


class EventFile:
    """Scalars as a TensorBoard event file beside the traces, one file per session.

    Records are written with tensorboard's RecordWriter from the caller's thread (the trace writer's). A
    SummaryWriter would add a thread of its own that outlives the session and dies with a traceback when the disk
    fills up.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._records = None

    def writer(self, rows: Iterable[tuple[int, dict[str, float]]]) -> Callable[[], None]:
        """A call that writes ``(step, metrics)`` rows (to hand to the trace writer's thread)."""
        rows = list(rows)

        def write() -> None:
            from tensorboard.compat.proto.event_pb2 import Event
            from tensorboard.compat.proto.summary_pb2 import Summary
            from tensorboard.summary.writer.record_writer import RecordWriter

            if self._records is None:
                self._records = RecordWriter(open(self.path, "wb"))
                self._records.write(Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
            for step, metrics in rows:
                values = [Summary.Value(tag=tag, simple_value=value) for tag, value in metrics.items()]
                event = Event(wall_time=time.time(), step=step, summary=Summary(value=values))
                self._records.write(event.SerializeToString())
            self._records.flush()

        write.__qualname__ = "writing step-time scalars"
        return write

    def close(self) -> None:
        """Close the event file (on the writer thread, after the last rows)."""
        if self._records is not None:
            self._records.close()
            self._records = None
