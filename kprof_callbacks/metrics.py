"""The step metrics: each step's time apart from kprof's own cost, what it processed (samples, FLOPs), memory and
machine samples, and what the steps right after a window pay for its export (``afterwindow.py``).

``Session`` owns one ``StepMetrics`` and tells it where each step ends and the next begins. The scalars file, the
slow-step trigger and the Lightning logger read it, each with a cursor of its own (``StepTimer.reader``); every row is
``scalars.step_metrics``, one formula for every sink.
"""

from __future__ import annotations

import importlib
import math
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from . import layout, machine, peaks, scalars
from .afterwindow import AfterWindow
from .config import ProfileConfig
from .history import History
from .timing import StepTimer
from .writer import TraceWriter

SCALAR_EVERY = 50  # steps between hand-offs of step times to the scalar writer
EARLY_MEMORY_STEPS = 50  # memory is sampled at every one of the first steps, then every memory_every steps
STEP_COLUMNS = ("samples", "flops", *layout.MEMORY_TAGS.values())  # what is kept per step (History)
_SAMPLES, _FLOPS = 0, 1

Rows = list[tuple[int, dict[str, float]]]  # (step, scalars) of consecutive steps


class StepMetrics:
    """What each step measured (the last ``history.KEEP_STEPS`` steps held) and the scalars made of it."""

    def __init__(self, config: ProfileConfig) -> None:
        self.config = config
        self.timer = StepTimer()
        self.after = AfterWindow()  # the steps right after a window: what they pay for its export is kprof's
        self.peak_tflops: float | None = None  # the dense peak MFU is measured against (None: unknown device)
        self._steps = History(len(STEP_COLUMNS))  # per step: samples, flops as step() got them; memory samples
        self._probe: scalars.MemoryProbe | None = None
        self._machine: machine.MachineProbe | None = None  # what the machine did, with the scalars
        self._scalars: scalars.EventFile | None = None
        self._writer: TraceWriter | None = None  # takes the scalars to their file, off the training thread
        self._peak_noted = False
        self._scalar_times = self.timer.reader(own=True)
        self._new_times = self.timer.reader(own=True)

    def start(self, writer: TraceWriter, run_dir: Path) -> None:
        """Open the scalars file and the samplers as profiling starts, and find the device's dense peak."""
        if self.config.scalars:  # import now: an import mid-training would hold the GIL for ~0.1 s
            importlib.import_module("torch.utils.tensorboard")
            self._scalars = scalars.EventFile(layout.scalars_path(run_dir, writer.worker))
            self._writer = writer
        cuda_device = torch.cuda.current_device() if torch.cuda.is_available() else None
        if self.config.memory_every:
            self._probe = scalars.MemoryProbe(cuda_device)
        if self.config.scalars:
            gpu = None if cuda_device is None else machine.pci_bus_id(torch.cuda.get_device_properties(cuda_device))
            self._machine = machine.MachineProbe(pci_bus_id=gpu)
        self.peak_tflops = self.config.peak_tflops
        if self.peak_tflops is None and cuda_device is not None:
            self.peak_tflops = peaks.peak_tflops(torch.cuda.get_device_name(cuda_device), self.config.mfu_dtype)

    def begin(self, step: int) -> None:
        """Step ``step`` begins: its time, and its page faults when it is right after a window (``afterwindow``)."""
        self.after.started(step)
        self.timer.start()

    def end(self, step: int) -> None:
        """Step ``step``'s work ended; what follows until ``begin`` is kprof's own time."""
        self.timer.end()
        self.after.finished(step)

    def record(self, step: int, samples: int | None, flops: float | None) -> None:
        """What step ``step`` processed as ``step()`` got it, and the memory and machine samples taken after it."""
        if samples is not None:
            self._steps.put(step, _SAMPLES, samples)
        if flops is not None:
            self._steps.put(step, _FLOPS, flops)
        if flops and self.peak_tflops is None and not self._peak_noted:
            self._peak_noted = True
            warnings.warn(
                "kprof: no dense peak FLOP/s is known for this device, so TFLOP/s is reported without MFU; "
                "pass peak_tflops= (and mfu_dtype=) to kprof.session",
                RuntimeWarning,
                stacklevel=5,
            )
        if self._probe is not None and (step < EARLY_MEMORY_STEPS or (step + 1) % self.config.memory_every == 0):
            for tag, mb in self._probe.sample().items():
                self._steps.put(step, STEP_COLUMNS.index(tag), mb)
        if self._machine is not None:
            self._machine.on_step(step)

    def window_ended(self, first: int, last: int) -> None:
        """A window over steps ``first`` (its warm-up) to ``last`` ended: the steps after it pay for its export."""
        self.after.ended(first, last)

    def hand_off(self, steps: int) -> None:
        """Every ``SCALAR_EVERY`` steps, the new steps' scalars go to the writer thread."""
        if self._scalars is not None and steps % SCALAR_EVERY == 0:
            self._send_scalars()

    def step_times(self) -> list[float]:
        """Seconds per held step without kprof's own cost; waits for outstanding CUDA events."""
        self.timer.drain()
        times = self.timer.times()
        first = self.timer.count - len(times)
        return [t - self.after.charge(first + k, t, self.timer.seconds) for k, t in enumerate(times)]

    def own_step_times(self) -> Callable[[], tuple[int, list[float]]]:
        """A cursor over the steps' times, as ``StepTimer.reader``, less what the steps right after a window pay for
        its export: the slow-step trigger must not take a window's own cost for a slow step and start another."""
        read = self.timer.reader()

        def own() -> tuple[int, list[float]]:
            start, times = read()
            return start, [t - self.after.charge(start + k, t, self.timer.seconds) for k, t in enumerate(times)]

        return own

    def new_rows(self) -> Rows:
        """``(step, scalars)`` of the steps completed since the last call, without waiting for the GPU."""
        return self._rows(*self._new_times())

    def close(self) -> None:
        """Close the samplers (a start that failed half-way; ``finish`` at the session's end)."""
        if self._probe is not None:
            self._probe.close()
        if self._machine is not None:
            self._machine.close()

    def finish(self) -> None:
        """At the session's end: close the samplers, then hand the last steps' scalars and the file's close to the
        writer (after the last CUDA events)."""
        self.close()
        self.after.close()
        if self._scalars is not None:
            self.timer.drain()
            self._send_scalars()
            self._writer.submit_call(self._scalars.close)

    def _rows(self, start: int, times: list[tuple[float, float]]) -> Rows:
        """``(step, scalars)`` for the steps ``start, start + 1, ...`` whose ``times`` are (step seconds, kprof's own
        seconds after it)."""
        rows = []
        recorded = self._steps.rows(start, start + len(times))
        for step, (seconds, own), row in zip(range(start, start + len(times)), times, recorded):
            samples, flops = (None if math.isnan(x) else x for x in row[:2])
            export = self.after.charge(step, seconds, self.timer.seconds)
            metrics = scalars.step_metrics(
                seconds - export, None if samples is None else int(samples), flops, self.peak_tflops, own
            )
            if self.after.charged(step):
                metrics[layout.AFTER_WINDOW_TAG] = export * 1e3
            metrics.update((tag, mb) for tag, mb in zip(STEP_COLUMNS[2:], row[2:]) if not math.isnan(mb))
            if self._machine is not None:
                metrics.update(self._machine.metrics(step))
            if step == 0 and self.peak_tflops:
                metrics[layout.PEAK_TAG] = self.peak_tflops
            if step == 0 and self.config.trigger == "slow_step":  # the tab names the trigger only when it was on
                metrics[layout.TRIGGER_TAG] = self.config.slow_factor
            rows.append((step, metrics))
        return rows

    def _send_scalars(self) -> None:
        rows = self._rows(*self._scalar_times())
        if rows:
            self._writer.submit_call(self._scalars.writer(rows))
