"""When captures start: the ``Plan`` torch.profiler asks at every step, and the triggers that arm it while training
runs, on demand (signal or a PROFILE file) or after a slow step.

A trigger only calls ``arm(reason)`` (``Session.arm``); the plan then records the next warm-up + ``active`` steps
exactly as a scheduled window would, and budgets (``max_captures``, ``max_trace_mb``) still apply.
"""

from __future__ import annotations

import signal
import statistics
import threading
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch.profiler import ProfilerAction

from . import layout
from .config import ProfileConfig

Arm = Callable[[str], bool]  # start a capture for this reason; False if one is running
StepTimes = Callable[[], tuple[int, Sequence[float]]]  # a StepTimer.reader(): step times known since the last call


class OnDemand:
    """Arms a capture when the process gets ``signal`` (default SIGUSR1) or ``<run_dir>/PROFILE`` appears."""

    def __init__(self, cfg: ProfileConfig, arm: Arm, run_dir: Path) -> None:
        self.arm = arm
        self.poll_every = cfg.poll_every
        self.signum = signal.SIGUSR1 if cfg.signal is None else cfg.signal
        self.request = run_dir / layout.PROFILE_FILE
        self._signalled = False
        self._previous = None
        self._installed = False

    def start(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            warnings.warn(
                f"kprof: not on the main thread, so no signal handler; create {self.request} to trigger a capture",
                RuntimeWarning,
                stacklevel=4,
            )
            return
        self._previous = signal.getsignal(self.signum)
        signal.signal(self.signum, self._on_signal)
        self._installed = True

    def stop(self) -> None:
        """Put the program's handler back, unless the program has installed another one since (then it stays)."""
        if self._installed and signal.getsignal(self.signum) == self._on_signal:
            signal.signal(self.signum, self._previous)
        self._installed = False

    def _on_signal(self, signum, frame) -> None:
        self._signalled = True
        if callable(self._previous):  # chain the handler the program had before ours
            self._previous(signum, frame)

    def on_step(self, step: int) -> None:
        if self._signalled:
            self._signalled = False
            self.arm(f"signal {signal.Signals(self.signum).name} at step {step}")
        elif step % self.poll_every == 0 and self.request.exists():
            self.request.unlink(missing_ok=True)  # consumed: one file, one capture
            self.arm(f"{layout.PROFILE_FILE} file at step {step}")


class SlowStep:
    """Arms a capture when a step takes more than ``slow_factor`` times the running median step time (steps
    without kprof's own cost: a window's stop never passes for a slow step)."""

    def __init__(self, cfg: ProfileConfig, arm: Arm, read: StepTimes) -> None:
        self.arm = arm
        self.read = read
        self.factor = cfg.slow_factor
        self.min_steps = cfg.slow_min_steps
        self.cooldown = cfg.cooldown
        self.refresh = cfg.poll_every
        self.recent: deque[float] = deque(maxlen=max(cfg.slow_min_steps, 101))
        self.median = 0.0
        self.seen = 0
        self.quiet_until = 0
        self.fired: list[tuple[int, float, float]] = []  # (step, seconds, median seconds) of each firing

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def on_step(self, step: int) -> None:
        for seconds in self.read()[1]:
            self.seen += 1
            slow = self.median > 0 and seconds > self.factor * self.median  # a coarse clock can give a median of 0
            if self.seen > self.min_steps and self.seen >= self.quiet_until and slow:
                reason = f"slow step {self.seen}: {seconds * 1e3:.2f} ms = {seconds / self.median:.1f}x median"
                if self.arm(reason):
                    self.fired.append((self.seen, seconds, self.median))
                    self.quiet_until = self.seen + self.cooldown
            self.recent.append(seconds)
            if self.seen % self.refresh == 0 or self.seen <= self.min_steps:
                self.median = statistics.median(self.recent)


def make_trigger(cfg: ProfileConfig, arm: Arm, read: StepTimes, run_dir: Path) -> OnDemand | SlowStep | None:
    """The trigger object for ``cfg.trigger`` (None for the fixed schedule)."""
    if cfg.trigger == "on_demand":
        return OnDemand(cfg, arm, run_dir)
    if cfg.trigger == "slow_step":
        return SlowStep(cfg, arm, read)
    return None


class Plan:
    """The schedule torch.profiler asks at every step: torch's own for trigger="schedule", else armed windows."""

    def __init__(self, cfg: ProfileConfig, allowed: Callable[[], bool]) -> None:
        self.cfg = cfg
        self.allowed = allowed  # the disk budget: may a new window start?
        self.fixed = (
            torch.profiler.schedule(
                skip_first=cfg.skip_first, wait=cfg.wait, warmup=cfg.warmup, active=cfg.active, repeat=cfg.repeat
            )
            if cfg.trigger == "schedule"
            else None
        )
        self.armed_at: int | None = None  # first step of an armed (triggered) window
        self.window_start: int | None = None  # first step of the window in progress, any trigger
        self.reason = cfg.trigger
        self._last = ProfilerAction.NONE
        self.started = 0  # windows begun, counted against max_captures

    def arm(self, step: int, reason: str) -> bool:
        """Start a window at ``step`` (warmup, then ``active`` recorded steps) unless one is running."""
        if self.armed_at is not None or self.window_start is not None:
            return False
        self.armed_at, self.reason = step, reason
        return True

    def planned(self, step: int) -> ProfilerAction:
        """The action for ``step`` before the budgets have their say; no side effects."""
        if self.armed_at is not None:
            return window_action(step - self.armed_at, self.cfg.warmup, self.cfg.active)
        return self.fixed(step) if self.fixed is not None else ProfilerAction.NONE

    def __call__(self, step: int) -> ProfilerAction:
        """torch.profiler calls this once per step with the step about to run."""
        action = self.planned(step)
        if self.armed_at is not None and action is ProfilerAction.NONE and step > self.armed_at:
            self.armed_at = None
        if action is not ProfilerAction.NONE and self._last in (ProfilerAction.NONE, ProfilerAction.RECORD_AND_SAVE):
            if self.allowed() and (self.cfg.max_captures is None or self.started < self.cfg.max_captures):
                self.window_start = step
                self.started += 1
            else:
                action, self.armed_at = ProfilerAction.NONE, None
        if action is ProfilerAction.NONE:
            self.window_start = None
        self._last = action
        return action


def window_action(offset: int, warmup: int, active: int) -> ProfilerAction:
    """What an armed window does at ``offset`` steps from its first: warm-up, record, and save at its last step."""
    if offset < 0 or offset >= warmup + active:
        return ProfilerAction.NONE
    if offset < warmup:
        return ProfilerAction.WARMUP
    return ProfilerAction.RECORD_AND_SAVE if offset == warmup + active - 1 else ProfilerAction.RECORD
