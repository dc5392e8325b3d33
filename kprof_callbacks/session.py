"""``kprof.session``: profile a plain training loop with a ``torch.profiler`` schedule.

One ``torch.profiler.profile`` lives for the whole session, driven by a schedule that says NONE outside the
profiled windows, so a step outside a window costs a counter, a timer mark and torch's own step bookkeeping.
Finished windows go to the background ``TraceWriter``; the training thread never waits on disk.
Every other front door (the Lightning callback, ``compare``, the CLI) drives this class.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import numbers
import os
import signal
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch.profiler import ProfilerAction, ProfilerActivity

from . import layout, memory_watch, scalars, torch_compat
from .attribution import ModelCapture
from .config import ProfileConfig, check_activities
from .metrics import Rows, StepMetrics
from .triggers import Plan, make_trigger
from .writer import Capture, TraceWriter

if TYPE_CHECKING:
    from .analysis import Summary

log = logging.getLogger(__name__)
# Each window is written as it ends, so torch's reminder that a new cycle starts empty is noise here.
warnings.filterwarnings("ignore", message="Warning: Profiler clears events at the end of each cycle")

_FORK_WAIT = 2.0  # seconds a window's end waits at most for the trace writer to fork its export process
_START = threading.Lock()  # makes "is another profiler running?" and "now this one is" one step
_INTERRUPTED_WRITE_TIMEOUT = 10.0  # at most this long to finish trace writes after Ctrl-C or SIGTERM
_RECORDING = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)  # the steps module ranges are recorded in


class Session:
    """A profiled training loop: call ``step()`` once per step inside ``with kprof.session(...) as s``.

    Each session writes to a run folder of its own (``layout.make_run_dir``); ``continues=`` an earlier session
    writes into that one's folder instead (the validation loops of one ``Trainer.fit`` are one run).
    """

    _active: Session | None = None  # torch.profiler allows one profiler per process

    def __init__(
        self,
        config: ProfileConfig,
        *,
        on_trace: Callable[[Path], None] | None = None,
        continues: Session | None = None,
        model: torch.nn.Module | None = None,
    ) -> None:
        if not isinstance(config, ProfileConfig):
            raise TypeError(f"config must be a ProfileConfig (or use kprof.session(...)), got {type(config).__name__}")
        if on_trace is not None and not callable(on_trace):
            raise TypeError(f"on_trace must be a callable taking the trace path, got {type(on_trace).__name__}")
        if continues is not None and not isinstance(continues, Session):
            raise TypeError(f"continues must be an earlier Session or None, got {type(continues).__name__}")
        self.config = config
        self.on_trace = on_trace
        self._model = ModelCapture(model)  # module ranges and compiled kernels for the module view (model=)
        self.steps = 0
        self.captures: list[Capture] = []
        self._memory: memory_watch.Watch | None = None  # the optimizers' note in traces, out-of-memory reports
        self._prof = None
        self._writer: TraceWriter | None = None
        self._state = "new"
        self._interrupt: KeyboardInterrupt | None = None  # Ctrl-C caught inside torch's step, raised once it is done
        self._thread: threading.Thread | None = None  # the thread that started profiling: torch records its steps
        self._activities: list[ProfilerActivity] = []
        self.run_dir: Path | None = None
        self._nvtx = config.nvtx and torch.cuda.is_available()
        if config.nvtx and not self._nvtx:
            warnings.warn(
                "kprof: nvtx=True needs a CUDA device; no NVTX ranges will be emitted", RuntimeWarning, stacklevel=3
            )
        self._off = "profiling was disabled (enabled=False or KPROF=0): nothing was recorded"
        self._own_folder = continues is None or continues.run_dir is None  # claimed here: given back if start fails
        if config.enabled:
            self.run_dir = continues.run_dir if not self._own_folder else self._claim_folder()
            config = self.config  # profiling is off when the disk was full
        self._metrics = StepMetrics(config)  # step times, samples, FLOPs, memory and machine samples, the scalars
        if config.enabled:
            self._activities = _usable_activities(config.resolved_activities())
        self._plan = Plan(config, self._may_capture)
        self._trigger = (
            make_trigger(config, self.arm, self._metrics.own_step_times(), self.run_dir) if config.enabled else None
        )

    # -- public surface ---------------------------------------------------------------------------------------
    @property
    def trace_files(self) -> list[Path]:
        """Trace files written so far (complete files only, in the order they were written)."""
        return list(self._writer.files) if self._writer else []

    @property
    def step_times(self) -> list[float]:
        """Seconds per completed step without kprof's own cost (what the steps right after a window pay for its
        export included: ``afterwindow.py``), the last ``history.KEEP_STEPS`` steps (every step is in the
        ``kprof/step_time_ms`` scalars); waits for outstanding CUDA events, so call it outside the hot loop."""
        return self._metrics.step_times()

    def new_step_metrics(self) -> Rows:
        """``(step, scalars)`` of the steps completed since the last call (``scalars.step_metrics`` plus memory at
        sampled steps), without waiting for the GPU."""
        return self._metrics.new_rows()

    @property
    def peak_tflops(self) -> float | None:
        """The dense peak MFU is measured against (``peak_tflops=``, else the device's; None: unknown device)."""
        return self._metrics.peak_tflops

    @property
    def writer_wait_s(self) -> float:
        """Seconds training waited at window ends for the trace writer to make room (0 while it keeps up)."""
        return self._writer.waited_s if self._writer else 0.0

    @property
    def recording(self) -> bool:
        """True while the current step is inside a profiling window (warm-up or recorded)."""
        return self._prof is not None and self._prof.current_action is not ProfilerAction.NONE

    def step(self, samples: int | None = None, flops: float | None = None) -> None:
        """Mark the end of one training step. ``samples`` (the batch size) turns step times into throughput;
        ``flops`` (the step's floating-point operations, e.g. 6 x parameters x tokens for a transformer) into
        achieved TFLOP/s and MFU against the device's dense peak. What kprof and torch.profiler do here (a window's
        start or stop, the hand-off to the trace writer, memory samples, triggers) is timed as kprof's own cost
        (``kprof/profiler_ms``), apart from the step's time."""
        self._end_step(samples, flops)
        self._begin_step()

    @contextlib.contextmanager
    def _step_boundary(self, samples: int | None, flops: float | None):
        """``step()`` that also keeps the block's work, a front door's own bookkeeping at this boundary (the
        Lightning callback's), out of the next step: all of it is kprof's own time."""
        self._end_step(samples, flops)
        try:
            yield
        finally:
            self._begin_step()

    def _begin_step(self) -> None:
        """The next step begins: its time, and its page faults when it is right after a window (``afterwindow``)."""
        self._metrics.begin(self.steps)

    def _end_step(self, samples: int | None, flops: float | None) -> None:
        """Check the arguments, end the step's time, and do the session's bookkeeping (timed as its own)."""
        if self._state != "running":
            raise RuntimeError(f"Session.step() called on a session that is {self._state}; use it inside `with`")
        self._check_thread("step")
        if samples is not None and (
            not isinstance(samples, numbers.Integral) or isinstance(samples, bool) or samples < 0
        ):
            raise ValueError(f"samples must be the batch size (an int >= 0) or None, got {samples!r}")
        if flops is not None:
            flops = scalars.check_flops("flops", flops)
        self._metrics.end(self.steps)
        try:
            self._bookkeeping(samples, flops)
        except BaseException:
            self._metrics.timer.start()
            raise

    def _bookkeeping(self, samples: int | None, flops: float | None) -> None:
        """Everything ``step()`` does between the end of one step and the start of the next."""
        step, self.steps = self.steps, self.steps + 1
        self._metrics.record(step, samples, flops)
        if self._nvtx:
            torch.cuda.nvtx.range_pop()
            torch.cuda.nvtx.range_push(f"step {self.steps}")
        if self._prof is None:
            return
        if self._trigger is not None:
            self._run_trigger()
        self._mark_steps_only_in_windows(self._prof.step_num + 1)
        windows = len(self.captures)
        self._prof.step()
        self._memory.on_step(self.recording, self._plan.window_start)
        self._model.sync(self._prof.current_action in _RECORDING)
        if len(self.captures) > windows:  # a window ended: its export forks now, inside kprof's time
            self._writer.wait_forked(_FORK_WAIT)
            self._metrics.window_ended(self.captures[-1].first_step - self.config.warmup, self.captures[-1].last_step)
        else:  # an export that could not fork at its window's end (the writer was busy) forks here
            self._writer.let_fork(_FORK_WAIT)
        self._raise_interrupt()
        self._metrics.hand_off(self.steps)

    def region(self, name: str) -> contextlib.AbstractContextManager:
        """A labelled range (``record_function``) in the trace, free outside profiling windows.

        With ``nvtx=True`` it is also an NVTX range on every step, for Nsight Systems / ``ncu --nvtx``.
        """
        if not isinstance(name, str) or not name or not name.isprintable() and not _encodes(name):
            raise ValueError(f"region name must be a non-empty str that UTF-8 can encode, got {name!r}")
        self._check_thread("region")
        if not (self.recording or self._nvtx):
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        if self.recording:
            stack.enter_context(torch.profiler.record_function(name))
        if self._nvtx:
            stack.enter_context(torch.cuda.nvtx.range(name))
        return stack

    def pause(self, activities: list[ProfilerActivity] | None = None) -> None:
        """Stop collecting (all activities, or those given) until ``resume()``; part of a step stays out."""
        self._toggle(False, activities)

    def resume(self, activities: list[ProfilerActivity] | None = None) -> None:
        """Collect again after ``pause()``."""
        self._toggle(True, activities)

    @contextlib.contextmanager
    def paused(self, activities: list[ProfilerActivity] | None = None):
        """``with s.paused(): ...`` leaves that code out of the trace (``toggle_collection_dynamic``)."""
        self.pause(activities)
        try:
            yield
        finally:
            self.resume(activities)

    def _toggle(self, enable: bool, activities: list[ProfilerActivity] | None) -> None:
        if self._prof is None:
            return
        self._check_thread("resume" if enable else "pause")
        if not hasattr(self._prof, "toggle_collection_dynamic"):
            raise NotImplementedError(
                f"pause/resume need torch.profiler.toggle_collection_dynamic (torch {torch.__version__} lacks it)"
            )
        acts = self._activities if activities is None else check_activities(activities)
        if self.recording:
            self._prof.toggle_collection_dynamic(enable, list(acts))

    def arm(self, reason: str = "manual") -> bool:
        """Capture the next steps (warm-up + ``active``) now, whatever the trigger; False if one is running or the
        session is not running."""
        self._check_thread("arm")
        return self._state == "running" and self._prof is not None and self._plan.arm(self.steps + 1, reason)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until traces handed to the writer are on disk (at most ``timeout``, default ``write_timeout``)."""
        if self._writer is not None:
            self._writer.flush(self.config.write_timeout if timeout is None else timeout)

    def summary(self) -> Summary:
        """Summarize this run's trace files (``kprof.summarize``), after any pending writes land; a disabled session
        gives an empty Summary that says so."""
        from .analysis import Summary, summarize

        if self.run_dir is None:
            return Summary.empty(self.config.run or "disabled", self._off)
        self.flush()
        return summarize(self.run_dir)

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def __enter__(self) -> Session:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.stop(exc)
        if exc is None:
            self._warn_if_no_window()
        return False

    def _warn_if_no_window(self) -> None:
        """A loop that ended before its schedule's first window recorded nothing: said once, with what to change."""
        cfg = self.config
        if self._prof is None or cfg.trigger != "schedule" or self.captures:
            return
        first = cfg.skip_first + cfg.wait + cfg.warmup
        warnings.warn(
            f"kprof: the loop ended after {self.steps} step{'s' * (self.steps != 1)}, before the schedule's first "
            f"window (steps {first}-{first + cfg.active - 1}): nothing was recorded; run more steps or lower "
            "skip_first, wait or warmup",
            RuntimeWarning,
            stacklevel=3,
        )

    def start(self) -> Session:
        """Start profiling (what ``with`` does on entry); front doors without a ``with`` block call it directly."""
        if self._state != "new":
            raise RuntimeError("a kprof Session can be entered only once; create a new one with kprof.session()")
        if self.config.enabled:
            with _START:
                if Session._active is not None or torch_compat.profiler_enabled():
                    self._state = "failed"
                    self._give_back_folder()
                    raise RuntimeError(
                        "another profiler is already running in this process (a kprof session, torch.profiler, or "
                        "Lightning's profiler='pytorch'); torch can run only one at a time"
                    )
                Session._active = self
            try:
                self._start_profiling()
            except BaseException as exc:
                self._state = "failed"
                self._undo_start()
                raise RuntimeError(
                    f"kprof: the profiler could not start ({type(exc).__name__}: {exc}); nothing "
                    "was left running, so training without it or a new session both work"
                ) from exc
        self._state = "running"
        self._metrics.timer.start()
        if self._nvtx:
            torch.cuda.nvtx.range_push("step 0")
        return self

    def _start_profiling(self) -> None:
        self._writer = TraceWriter(
            self.run_dir,
            layout.worker_name(layout.rank()),
            compress=self.config.gzip,
            max_bytes=None if self.config.max_trace_mb is None else int(self.config.max_trace_mb * 2**20),
            max_pending_bytes=int(self.config.max_pending_mb * 2**20),
            on_trace=self.on_trace,
            room_timeout=self.config.write_timeout,
        )
        if ProfilerActivity.CUDA in self._activities:
            # Without it kineto leaves CUPTI attached after a window and every later kernel launch pays for it
            # (H100, launch-bound MLP under Lightning: median step 6.81 ms -> 8.91 ms long after the windows,
            # 7.84 ms with it). Read by kineto at each trace stop; a value the user set wins.
            os.environ.setdefault("TEARDOWN_CUPTI", "1")
        self._prof = torch.profiler.profile(
            activities=self._activities,
            schedule=self._plan,
            on_trace_ready=self._trace_ready,
            **self.config.profiler_kwargs(),
        )
        self._metrics.start(self._writer, self.run_dir)
        if self.config.memory_snapshot and torch.cuda.is_available():
            torch_compat.record_memory_history(True)
        self._memory = memory_watch.Watch(self.config, self.run_dir, self._writer.worker)
        if self._trigger is not None:
            self._trigger.start()
        on_main_thread = threading.current_thread() is threading.main_thread()
        if on_main_thread and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, self._on_sigterm)
        self._mark_steps_only_in_windows(0)
        self._thread = threading.current_thread()
        self._prof.__enter__()
        self._model.start(self._prof.current_action in _RECORDING)

    def _undo_start(self) -> None:
        """Leave nothing of a start that failed half-way: profiler, signal handlers, trigger, writer thread."""
        if self._prof is not None and torch_compat.profiler_enabled():
            with contextlib.suppress(Exception):
                self._prof.__exit__(None, None, None)
        self._prof = None
        if self._trigger is not None:
            self._trigger.stop()
        if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if self.config.memory_snapshot and torch.cuda.is_available():
            torch_compat.record_memory_history(False)
        self._model.stop()
        if self._writer is not None:
            self._writer.close(1.0)
        self._metrics.close()
        if self._memory is not None:
            self._memory.close()
        self._give_back_folder()
        Session._active = None

    def _claim_folder(self) -> Path | None:
        """A run folder of this session's own (``layout.make_run_dir``); on a full disk, None and profiling off, said
        once: a disk full at the start is a fault like one that fills mid-run, and training goes on."""
        try:
            return layout.make_run_dir(self.config.logdir, self.config.run)
        except OSError as exc:
            if exc.errno not in layout.DISK_FULL:
                raise
            self._off = f"the disk was full when the session started ({exc.strerror}): nothing was recorded"
            warnings.warn(
                f"kprof: {self.config.logdir}: {exc.strerror} when the session started; training continues without "
                "profiling",
                RuntimeWarning,
                stacklevel=4,
            )
            self.config = dataclasses.replace(self.config, enabled=False)
            return None

    def _give_back_folder(self) -> None:
        """A session that could not start leaves no claimed folder behind (the next one would be ``<run>-2``)."""
        if self._own_folder and self.run_dir is not None:
            layout.release_run_dir(self.run_dir)

    def stop(self, exception: BaseException | None = None) -> None:
        """Stop profiling and finish the trace writes (what ``with`` does on exit); ``exception`` is what ended
        the loop, if anything: a window it cut short is still saved, and after Ctrl-C the writes are bounded."""
        if self._state != "running":
            return
        self._state = "closed"
        if self._nvtx:
            torch.cuda.nvtx.range_pop()
        if self._prof is None:
            return
        exc_type = None if exception is None else type(exception)
        self._memory.stop(exception, self.steps, self.recording)  # an out-of-memory report first, as memory is now
        try:
            self._prof.__exit__(exc_type, exception, None if exception is None else exception.__traceback__)
        finally:
            Session._active = None
            if self._trigger is not None:
                self._trigger.stop()
            if self.config.memory_snapshot and torch.cuda.is_available():
                self._dump_memory_snapshot()
            self._model.stop(self._writer, self.run_dir)
            self._metrics.finish()
            interrupted = exc_type is not None and issubclass(exc_type, KeyboardInterrupt)
            timeout = self.config.write_timeout
            if interrupted or self._interrupt is not None:
                timeout = min(timeout, _INTERRUPTED_WRITE_TIMEOUT)
            self._writer.close(timeout)
            if signal.getsignal(signal.SIGTERM) == self._on_sigterm:  # kept until here: SIGTERM drains this close too
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if not interrupted:
            self._raise_interrupt()

    # -- internals ---------------------------------------------------------------------------------------------
    def _check_thread(self, call: str) -> None:
        """RuntimeError unless this is the thread that started profiling: torch.profiler steps and records the thread
        it was started on, and a step from another one was lost (or crashed the export, from two at once)."""
        here = threading.current_thread()
        if self._thread is not None and here is not self._thread:
            raise RuntimeError(
                f"kprof: Session.{call}() called on thread {here.name!r}, but the session was started on thread "
                f"{self._thread.name!r}: call step(), region(), arm() and pause() on the thread that entered it"
            )

    def _on_sigterm(self, signum: int, frame) -> None:
        """SIGTERM where the program had no handler: finish the trace writes already queued (bounded), then die
        of SIGTERM as it would have. The window being recorded is lost. A handler chaining ours decides itself."""
        if signal.getsignal(signum) != self._on_sigterm:
            return
        signal.signal(signum, signal.SIG_DFL)
        self._writer.close(min(self.config.write_timeout, _INTERRUPTED_WRITE_TIMEOUT))
        os.kill(os.getpid(), signum)

    def _mark_steps_only_in_windows(self, step: int) -> None:
        """Let torch open its ``ProfilerStep#N`` range only for a step a window may record (``step_ranges``)."""
        torch_compat.step_ranges(self._prof, self._plan.planned(step) is not ProfilerAction.NONE)

    def _run_trigger(self) -> None:
        """The trigger's bookkeeping for this step; an error in it turns the trigger off with one warning (training
        code never sees an exception from the profiler's bookkeeping)."""
        try:
            self._trigger.on_step(self.steps)
        except Exception as exc:
            warnings.warn(
                f"kprof: the {self.config.trigger} trigger failed ({type(exc).__name__}: {exc}); it is off "
                "for the rest of the session (training continues)",
                RuntimeWarning,
                stacklevel=5,
            )
            self._trigger.stop()
            self._trigger = None

    def _may_capture(self) -> bool:
        return not (self._writer is not None and self._writer.over_budget)

    def _dump_memory_snapshot(self) -> None:
        """Save the CUDA allocator history beside the traces (open it at https://pytorch.org/memory_viz)."""
        try:
            memory_watch.save_snapshot(layout.snapshot_path(self.run_dir, self._writer.worker))
        except Exception as exc:  # a snapshot is a bonus: never fail the run for it
            warnings.warn(f"kprof: could not save the memory snapshot: {exc}", RuntimeWarning, stacklevel=3)
        finally:
            torch_compat.record_memory_history(False)

    def _trace_ready(self, prof) -> None:
        last = prof.step_num - 1 if self._state == "running" else prof.step_num
        first = last - self.config.active + 1
        start = self._plan.window_start  # already the next window's start when one follows with no wait
        if start is not None and start <= last:
            first = max(start + self.config.warmup, first)  # a window cut short recorded from its warm-up's end
        capture = Capture(first_step=first, last_step=last, reason=self._plan.reason)
        self.captures.append(capture)
        self._model.save(self._writer, self.run_dir)  # the record of compiled kernels lands before the trace
        try:
            self._writer.submit(prof, capture)
        except KeyboardInterrupt as exc:  # Ctrl-C while waiting for the writer (which kept the capture)
            # torch is between stopping this window and starting the next: raised here, it left the profiler half
            # switched (at exit torch stopped it twice and the next export crashed), so it waits for step()'s end
            self._interrupt = exc

    def _raise_interrupt(self) -> None:
        """Raise the Ctrl-C caught while torch's profiler changed windows, now that it has."""
        if self._interrupt is not None:
            exc, self._interrupt = self._interrupt, None
            raise exc


def _encodes(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _usable_activities(requested: list[ProfilerActivity]) -> list[ProfilerActivity]:
    """Drop CUDA activity with one warning where no CUDA device can be profiled."""
    if ProfilerActivity.CUDA in requested and not torch.cuda.is_available():
        warnings.warn(
            "kprof: CUDA activity was requested but no CUDA device is usable; profiling CPU activity only",
            RuntimeWarning,
            stacklevel=4,
        )
        requested = [a for a in requested if a is not ProfilerActivity.CUDA] or [ProfilerActivity.CPU]
    return requested


def session(logdir: str | os.PathLike = "log", *, model: torch.nn.Module | None = None, **options) -> Session:
    """Profile a training loop: ``with kprof.session("log", run="baseline") as s: ... s.step()``.

    ``model``: the model being trained, for time by module (``Summary.modules``): its module calls are recorded while
    a window records, and what torch.compile generates during the session is recorded by module and source line.

    Options mirror ``torch.profiler.schedule``/``profile`` (``skip_first=0, wait=1, warmup=1, active=3,
    repeat=1, record_shapes, profile_memory, with_stack, with_flops, activities``) plus kprof's own (``run``,
    ``enabled``, ``gzip``, ``scalars``, ``trigger``, budgets); see ``ProfileConfig``. Bad values raise here,
    before training starts. ``enabled=False`` or ``KPROF=0`` makes it a no-op with no profiler.
    """
    return Session(ProfileConfig.from_kwargs(logdir=logdir, **options), model=model)
