"""``kprof.session``: profile a plain training loop with a ``torch.profiler`` schedule.

One ``torch.profiler.profile`` lives for the whole session (``recorder.py``), driven by a schedule that says NONE
outside the profiled windows, so a step outside a window costs a counter, a timer mark and torch's own step
bookkeeping. Finished windows go to the background ``TraceWriter``; the training thread never waits on disk. What each
step measured is kept by ``metrics.py``. Every other front door (the Lightning callback, ``compare``, the CLI) drives
this class.
"""

from __future__ import annotations

import contextlib
import dataclasses
import numbers
import os
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch.profiler import ProfilerActivity

from . import layout, scalars, torch_compat
from .attribution import ModelCapture
from .config import ProfileConfig
from .metrics import Rows, StepMetrics
from .recorder import Recorder
from .writer import Capture

if TYPE_CHECKING:
    from .analysis import Summary

# Each window is written as it ends, so torch's reminder that a new cycle starts empty is noise here.
warnings.filterwarnings("ignore", message="Warning: Profiler clears events at the end of each cycle")

_START = threading.Lock()  # makes "is another profiler running?" and "now this one is" one step


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
        capture = ModelCapture(model)  # module ranges and compiled kernels for the module view (model=)
        self.steps = 0
        self._state = "new"
        self.run_dir: Path | None = None
        self._nvtx = config.nvtx and torch.cuda.is_available()
        if config.nvtx and not self._nvtx:
            warnings.warn(
                "kprof: nvtx=True needs a CUDA device; no NVTX ranges will be emitted", RuntimeWarning, stacklevel=3
            )
        self._off = "profiling was disabled (enabled=False or KPROF=0): nothing was recorded"
        self._own_folder = continues is None or continues.run_dir is None  # claimed here: given back if start fails
        if config.enabled and not self._own_folder:
            self.run_dir = continues.run_dir
        elif config.enabled:
            self.run_dir, full = _claim_folder(config)
            if full:  # profiling is off when the disk was full
                self._off, self.config = full, dataclasses.replace(config, enabled=False)
                config = self.config
        self._metrics = StepMetrics(config)  # step times, samples, FLOPs, memory and machine samples, the scalars
        self._recorder = Recorder(config, self.run_dir, on_trace, capture, self._metrics, self.arm)  # the profiler
        self.captures: list[Capture] = self._recorder.captures  # the windows recorded so far, as they ended

    # -- public surface ---------------------------------------------------------------------------------------
    @property
    def trace_files(self) -> list[Path]:
        """Trace files written so far (complete files only, in the order they were written)."""
        writer = self._recorder.writer
        return list(writer.files) if writer else []

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
        writer = self._recorder.writer
        return writer.waited_s if writer else 0.0

    @property
    def recording(self) -> bool:
        """True while the current step is inside a profiling window (warm-up or recorded)."""
        return self._recorder.recording

    def step(self, samples: int | None = None, flops: float | None = None) -> None:
        """Mark the end of one training step. ``samples`` (the batch size) turns step times into throughput;
        ``flops`` (the step's floating-point operations, e.g. 6 x parameters x tokens for a transformer) into
        achieved TFLOP/s and MFU against the device's dense peak. What kprof and torch.profiler do here (a window's
        start or stop, the hand-off to the trace writer, memory samples, triggers) is timed as kprof's own cost
        (``kprof/profiler_ms``), apart from the step's time."""
        self._end_step(samples, flops)
        self._metrics.begin(self.steps)  # the next step begins

    @contextlib.contextmanager
    def _step_boundary(self, samples: int | None, flops: float | None):
        """``step()`` that also keeps the block's work, a front door's own bookkeeping at this boundary (the
        Lightning callback's), out of the next step: all of it is kprof's own time."""
        self._end_step(samples, flops)
        try:
            yield
        finally:
            self._metrics.begin(self.steps)  # the next step begins

    def _end_step(self, samples: int | None, flops: float | None) -> None:
        """Check the arguments, end the step's time, and do the session's bookkeeping (timed as its own)."""
        if self._state != "running":
            raise RuntimeError(f"Session.step() called on a session that is {self._state}; use it inside `with`")
        self._recorder.check_thread("step")
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
        if self._recorder.prof is not None:
            self._recorder.step(self.steps)
        self._metrics.hand_off(self.steps)

    def region(self, name: str) -> contextlib.AbstractContextManager:
        """A labelled range (``record_function``) in the trace, free outside profiling windows.

        With ``nvtx=True`` it is also an NVTX range on every step, for Nsight Systems / ``ncu --nvtx``.
        """
        if not isinstance(name, str) or not name or not name.isprintable() and not _encodes(name):
            raise ValueError(f"region name must be a non-empty str that UTF-8 can encode, got {name!r}")
        self._recorder.check_thread("region")
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
        self._recorder.toggle(False, activities)

    def resume(self, activities: list[ProfilerActivity] | None = None) -> None:
        """Collect again after ``pause()``."""
        self._recorder.toggle(True, activities)

    @contextlib.contextmanager
    def paused(self, activities: list[ProfilerActivity] | None = None):
        """``with s.paused(): ...`` leaves that code out of the trace (``toggle_collection_dynamic``)."""
        self.pause(activities)
        try:
            yield
        finally:
            self.resume(activities)

    def arm(self, reason: str = "manual") -> bool:
        """Capture the next steps (warm-up + ``active``) now, whatever the trigger; False if one is running or the
        session is not running."""
        self._recorder.check_thread("arm")
        return self._state == "running" and self._recorder.arm(self.steps + 1, reason)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until traces handed to the writer are on disk (at most ``timeout``, default ``write_timeout``)."""
        if self._recorder.writer is not None:
            self._recorder.writer.flush(self.config.write_timeout if timeout is None else timeout)

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
            self._recorder.warn_if_no_window(self.steps)
        return False

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
                self._recorder.start()
            except BaseException as exc:
                self._state = "failed"
                self._recorder.undo()
                self._give_back_folder()
                Session._active = None
                raise RuntimeError(
                    f"kprof: the profiler could not start ({type(exc).__name__}: {exc}); nothing "
                    "was left running, so training without it or a new session both work"
                ) from exc
        self._state = "running"
        self._metrics.timer.start()
        if self._nvtx:
            torch.cuda.nvtx.range_push("step 0")
        return self

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
        if self._recorder.prof is None:
            return
        try:
            self._recorder.stop(exception, self.steps)
        finally:
            Session._active = None
            interrupted = self._recorder.close(exception)
        if not interrupted:
            self._recorder.raise_interrupt()


def _claim_folder(config: ProfileConfig) -> tuple[Path | None, str | None]:
    """A run folder of the session's own (``layout.make_run_dir``); on a full disk, None and why, said once: a disk
    full at the start is a fault like one that fills mid-run, profiling is off and training goes on."""
    try:
        return layout.make_run_dir(config.logdir, config.run), None
    except OSError as exc:
        if exc.errno not in layout.DISK_FULL:
            raise
        warnings.warn(
            f"kprof: {config.logdir}: {exc.strerror} when the session started; training continues without profiling",
            RuntimeWarning,
            stacklevel=4,
        )
        return None, f"the disk was full when the session started ({exc.strerror}): nothing was recorded"


def _encodes(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def session(
    logdir: str | os.PathLike = "log",
    *,
    model: torch.nn.Module | None = None,
    **options,
) -> Session:
    """Profile a training loop: ``with kprof.session("log", run="baseline") as s: ... s.step()``.

    ``model``: the model being trained, for time by module (``Summary.modules``): its module calls are recorded while
    a window records, and what torch.compile generates during the session is recorded by module and source line.

    Options mirror ``torch.profiler.schedule``/``profile`` (``skip_first=0, wait=1, warmup=1, active=3,
    repeat=1, record_shapes, profile_memory, with_stack, with_flops, activities``) plus kprof's own (``run``,
    ``enabled``, ``gzip``, ``scalars``, ``trigger``, budgets); see ``ProfileConfig``. Bad values raise here,
    before training starts. ``enabled=False`` or ``KPROF=0`` makes it a no-op with no profiler.
    """
    return Session(ProfileConfig.from_kwargs(logdir=logdir, **options), model=model)
