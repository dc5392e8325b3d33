"""The profiler's life in a session: one ``torch.profiler.profile`` driven by the ``Plan`` (``triggers.py``), the
trace writer its windows go to, and what rides on the windows: the trigger, module ranges and compiled kernels
(``attribution.py``), the memory watch and the allocator history.

``Session`` (the front door) checks arguments and counts steps; it starts the ``Recorder``, steps it at each step
boundary and stops it at the end. A window that ends goes to the background ``TraceWriter`` (``_trace_ready``); the
training thread never waits on disk.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerAction, ProfilerActivity

from . import layout, memory_watch, torch_compat
from .attribution import ModelCapture
from .config import ProfileConfig, check_activities
from .metrics import StepMetrics
from .triggers import Arm, Plan, make_trigger
from .writer import Capture, TraceWriter

_FORK_WAIT = 2.0  # seconds a window's end waits at most for the trace writer to fork its export process
_INTERRUPTED_WRITE_TIMEOUT = 10.0  # at most this long to finish trace writes after Ctrl-C or SIGTERM
_RECORDING = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)  # the steps module ranges are recorded in


class Recorder:
    """The profiler of one session and its windows, from ``start()`` to ``stop()`` and ``close()``."""

    def __init__(
        self,
        config: ProfileConfig,
        run_dir: Path | None,
        on_trace: Callable[[Path], None] | None,
        model: ModelCapture,
        metrics: StepMetrics,
        arm: Arm,
    ) -> None:
        self.config = config
        self.run_dir = run_dir
        self.activities = _usable_activities(config.resolved_activities()) if config.enabled else []
        self.on_trace = on_trace
        self.model = model  # module ranges and compiled kernels for the module view (model=)
        self.metrics = metrics
        self.captures: list[Capture] = []
        self.plan = Plan(config, self._may_capture)
        self.trigger = make_trigger(config, arm, metrics.own_step_times(), run_dir) if config.enabled else None
        self.prof = None
        self.writer: TraceWriter | None = None
        self.memory: memory_watch.Watch | None = None  # the optimizers' note in traces, out-of-memory reports
        self.thread: threading.Thread | None = None  # the thread that started profiling: torch records its steps
        self._exiting = False  # the profiler is being stopped: its last window ends at the last step
        self._interrupt: KeyboardInterrupt | None = None  # Ctrl-C caught inside torch's step, raised once it is done

    @property
    def recording(self) -> bool:
        """True while the current step is inside a profiling window (warm-up or recorded)."""
        return self.prof is not None and self.prof.current_action is not ProfilerAction.NONE

    def start(self) -> None:
        """Start the writer, the samplers and the profiler; ``undo()`` leaves nothing of a start that failed."""
        self.writer = TraceWriter(
            self.run_dir,
            layout.worker_name(layout.rank()),
            compress=self.config.gzip,
            max_bytes=None if self.config.max_trace_mb is None else int(self.config.max_trace_mb * 2**20),
            max_pending_bytes=int(self.config.max_pending_mb * 2**20),
            on_trace=self.on_trace,
            room_timeout=self.config.write_timeout,
        )
        if ProfilerActivity.CUDA in self.activities:
            # Without it kineto leaves CUPTI attached after a window and every later kernel launch pays for it
            # (H100, launch-bound MLP under Lightning: median step 6.81 ms -> 8.91 ms long after the windows,
            # 7.84 ms with it). Read by kineto at each trace stop; a value the user set wins.
            os.environ.setdefault("TEARDOWN_CUPTI", "1")
        self.prof = torch.profiler.profile(
            activities=self.activities,
            schedule=self.plan,
            on_trace_ready=self._trace_ready,
            **self.config.profiler_kwargs(),
        )
        self.metrics.start(self.writer, self.run_dir)
        if self.config.memory_snapshot and torch.cuda.is_available():
            torch_compat.record_memory_history(True)
        self.memory = memory_watch.Watch(self.config, self.run_dir, self.writer.worker)
        if self.trigger is not None:
            self.trigger.start()
        on_main_thread = threading.current_thread() is threading.main_thread()
        if on_main_thread and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, self._on_sigterm)
        self._mark_steps_only_in_windows(0)
        self.thread = threading.current_thread()
        self.prof.__enter__()
        self.model.start(self.prof.current_action in _RECORDING)

    def undo(self) -> None:
        """Leave nothing of a start that failed half-way: profiler, signal handlers, trigger, writer thread."""
        self._exiting = True
        if self.prof is not None and torch_compat.profiler_enabled():
            with contextlib.suppress(Exception):
                self.prof.__exit__(None, None, None)
        self.prof = None
        if self.trigger is not None:
            self.trigger.stop()
        if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if self.config.memory_snapshot and torch.cuda.is_available():
            torch_compat.record_memory_history(False)
        self.model.stop()
        if self.writer is not None:
            self.writer.close(1.0)
        self.metrics.close()
        if self.memory is not None:
            self.memory.close()

    def step(self, steps: int) -> None:
        """torch.profiler's step after ``steps`` steps, and what rides on it: the trigger, the memory watch, module
        ranges, and the hand-off of a window that ended to the writer's export process."""
        if self.trigger is not None:
            self._run_trigger(steps)
        self._mark_steps_only_in_windows(self.prof.step_num + 1)
        windows = len(self.captures)
        self.prof.step()
        self.memory.on_step(self.recording, self.plan.window_start)
        self.model.sync(self.prof.current_action in _RECORDING)
        if len(self.captures) > windows:  # a window ended: its export forks now, inside kprof's time
            self.writer.wait_forked(_FORK_WAIT)
            self.metrics.window_ended(self.captures[-1].first_step - self.config.warmup, self.captures[-1].last_step)
        else:  # an export that could not fork at its window's end (the writer was busy) forks here
            self.writer.let_fork(_FORK_WAIT)
        self.raise_interrupt()

    def arm(self, step: int, reason: str) -> bool:
        """Record a window from ``step`` (``Plan.arm``); False if one is running or the profiler is not."""
        return self.prof is not None and self.plan.arm(step, reason)

    def toggle(self, enable: bool, activities: list[ProfilerActivity] | None) -> None:
        """Collect (or not) the activities given, all by default, in the window being recorded (``Session.pause``)."""
        if self.prof is None:
            return
        self.check_thread("resume" if enable else "pause")
        if not hasattr(self.prof, "toggle_collection_dynamic"):
            raise NotImplementedError(
                f"pause/resume need torch.profiler.toggle_collection_dynamic (torch {torch.__version__} lacks it)"
            )
        acts = self.activities if activities is None else check_activities(activities)
        if self.recording:
            self.prof.toggle_collection_dynamic(enable, list(acts))

    def stop(self, exception: BaseException | None, steps: int) -> None:
        """Stop the profiler after ``steps`` steps (an out-of-memory report first, as memory is now); a window that
        ``exception`` cut short is saved. ``close()`` follows, whatever this raises."""
        self._exiting = True
        self.memory.stop(exception, steps, self.recording)
        exc_type = None if exception is None else type(exception)
        self.prof.__exit__(exc_type, exception, None if exception is None else exception.__traceback__)

    def close(self, exception: BaseException | None) -> bool:
        """Finish what the windows left: the trigger, the allocator history, the scalars, the trace writes (bounded
        after Ctrl-C or SIGTERM). True when ``exception`` is a Ctrl-C."""
        if self.trigger is not None:
            self.trigger.stop()
        if self.config.memory_snapshot and torch.cuda.is_available():
            self._dump_memory_snapshot()
        self.model.stop(self.writer, self.run_dir)
        self.metrics.finish()
        interrupted = isinstance(exception, KeyboardInterrupt)
        timeout = self.config.write_timeout
        if interrupted or self._interrupt is not None:
            timeout = min(timeout, _INTERRUPTED_WRITE_TIMEOUT)
        self.writer.close(timeout)
        if signal.getsignal(signal.SIGTERM) == self._on_sigterm:  # kept until here: SIGTERM drains this close too
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        return interrupted

    def warn_if_no_window(self, steps: int) -> None:
        """A loop that ended before its schedule's first window recorded nothing: said once, with what to change."""
        cfg = self.config
        if self.prof is None or cfg.trigger != "schedule" or self.captures:
            return
        first = cfg.skip_first + cfg.wait + cfg.warmup
        warnings.warn(
            f"kprof: the loop ended after {steps} step{'s' * (steps != 1)}, before the schedule's first "
            f"window (steps {first}-{first + cfg.active - 1}): nothing was recorded; run more steps or lower "
            "skip_first, wait or warmup",
            RuntimeWarning,
            stacklevel=3,
        )

    def check_thread(self, call: str) -> None:
        """RuntimeError unless this is the thread that started profiling: torch.profiler steps and records the thread
        it was started on, and a step from another one was lost (or crashed the export, from two at once)."""
        here = threading.current_thread()
        if self.thread is not None and here is not self.thread:
            raise RuntimeError(
                f"kprof: Session.{call}() called on thread {here.name!r}, but the session was started on thread "
                f"{self.thread.name!r}: call step(), region(), arm() and pause() on the thread that entered it"
            )

    def raise_interrupt(self) -> None:
        """Raise the Ctrl-C caught while torch's profiler changed windows, now that it has."""
        if self._interrupt is not None:
            exc, self._interrupt = self._interrupt, None
            raise exc

    def _on_sigterm(self, signum: int, frame) -> None:
        """SIGTERM where the program had no handler: finish the trace writes already queued (bounded), then die
        of SIGTERM as it would have. The window being recorded is lost. A handler chaining ours decides itself."""
        if signal.getsignal(signum) != self._on_sigterm:
            return
        signal.signal(signum, signal.SIG_DFL)
        self.writer.close(min(self.config.write_timeout, _INTERRUPTED_WRITE_TIMEOUT))
        os.kill(os.getpid(), signum)

    def _mark_steps_only_in_windows(self, step: int) -> None:
        """Let torch open its ``ProfilerStep#N`` range only for a step a window may record (``step_ranges``)."""
        torch_compat.step_ranges(self.prof, self.plan.planned(step) is not ProfilerAction.NONE)

    def _run_trigger(self, steps: int) -> None:
        """The trigger's bookkeeping for this step; an error in it turns the trigger off with one warning (training
        code never sees an exception from the profiler's bookkeeping)."""
        try:
            self.trigger.on_step(steps)
        except Exception as exc:
            warnings.warn(
                f"kprof: the {self.config.trigger} trigger failed ({type(exc).__name__}: {exc}); it is off "
                "for the rest of the session (training continues)",
                RuntimeWarning,
                stacklevel=6,
            )
            self.trigger.stop()
            self.trigger = None

    def _may_capture(self) -> bool:
        return not (self.writer is not None and self.writer.over_budget)

    def _dump_memory_snapshot(self) -> None:
        """Save the CUDA allocator history beside the traces (open it at https://pytorch.org/memory_viz)."""
        try:
            memory_watch.save_snapshot(layout.snapshot_path(self.run_dir, self.writer.worker))
        except Exception as exc:  # a snapshot is a bonus: never fail the run for it
            warnings.warn(
                f"kprof: could not save the memory snapshot: {exc}",
                RuntimeWarning,
                stacklevel=4,
            )
        finally:
            torch_compat.record_memory_history(False)

    def _trace_ready(self, prof) -> None:
        last = prof.step_num if self._exiting else prof.step_num - 1
        first = last - self.config.active + 1
        start = self.plan.window_start  # already the next window's start when one follows with no wait
        if start is not None and start <= last:
            first = max(start + self.config.warmup, first)  # a window cut short recorded from its warm-up's end
        capture = Capture(first_step=first, last_step=last, reason=self.plan.reason)
        self.captures.append(capture)
        self.model.save(self.writer, self.run_dir)  # the record of compiled kernels lands before the trace
        try:
            self.writer.submit(prof, capture)
        except KeyboardInterrupt as exc:  # Ctrl-C while waiting for the writer (which kept the capture)
            # torch is between stopping this window and starting the next: raised here, it left the profiler half
            # switched (at exit torch stopped it twice and the next export crashed), so it waits for step()'s end
            self._interrupt = exc


def _usable_activities(requested: list[ProfilerActivity]) -> list[ProfilerActivity]:
    """Drop CUDA activity with one warning where no CUDA device can be profiled."""
    if ProfilerActivity.CUDA in requested and not torch.cuda.is_available():
        warnings.warn(
            "kprof: CUDA activity was requested but no CUDA device is usable; profiling CPU activity only",
            RuntimeWarning,
            stacklevel=5,
        )
        requested = [a for a in requested if a is not ProfilerActivity.CUDA] or [ProfilerActivity.CPU]
    return requested
