"""Trace writer: takes finished captures off the training thread and writes them safely.

``on_trace_ready`` only hands the finished capture to a background thread; that thread exports it to its partial
name (``layout.partial_path``) and renames it into place, so a file with the final name (the name TensorBoard and
``kprof summary`` read) is always complete. Write errors (disk full, logdir gone) drop that capture with one warning;
they never reach the training loop.

A capture is never dropped because the writer is behind. Finished captures wait in memory, up to a budget
(``max_pending_bytes``, each held capture counted as the largest trace written so far, at least 1 MB); past it, the
training thread waits at the end of its window until the writer has made room, and that wait is reported
(``Capture.waited_s``). A writer that makes no room within ``room_timeout`` is stuck (an ``on_trace`` callback or a
write that never returns): that capture, and every later one until the writer moves again, is dropped with one
warning, without waiting, so training goes on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import exporter, layout, torch_compat

log = logging.getLogger(__name__)

_IDLE, _WAITING, _FORKING = "idle", "waiting", "forking"  # TraceWriter._fork_state
_MIN_ESTIMATE = 2**20  # what a held capture counts before any trace has been written


@dataclass
class Capture:
    """One profiled window: the steps it covers and where its trace went (``path`` is None until written)."""

    first_step: int
    last_step: int
    reason: str
    path: Path | None = None
    bytes: int = 0
    error: str | None = None
    waited_s: float = 0.0  # how long the training thread waited for the writer to make room for this capture


class TraceWriter:
    """Background exporter for finished ``torch.profiler`` captures (one daemon thread, memory-bounded queue)."""

    def __init__(
        self,
        run_dir: Path,
        worker: str,
        *,
        compress: bool = False,
        max_bytes: int | None = None,
        max_pending_bytes: int = 512 * 2**20,
        on_trace: Callable[[Path], None] | None = None,
        fork: bool = True,
        child_timeout: float = 300.0,
        room_timeout: float = 60.0,
    ) -> None:
        self.run_dir = run_dir
        self.worker = worker
        self.compress = compress
        self.max_bytes = max_bytes
        self.max_pending_bytes = max_pending_bytes
        self.on_trace = on_trace
        self.fork = fork
        self.child_timeout = child_timeout
        self.room_timeout = room_timeout
        self.written_bytes = 0
        self.waited_s = 0.0  # the training thread's total wait for room (see the module docstring)
        self.files: list[Path] = []
        self.errors: list[str] = []
        self._warned: set[str] = set()
        self._exports: set[int] = set()  # pids of export processes running now
        self._abandoned = False
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._room = threading.Condition()  # guards the five below
        self._queued: list[Capture] = []  # captures held in memory, handed to the writer thread and not yet done with
        self._held_bytes = 0  # their estimated size
        self._largest = 0  # the largest capture written so far (bytes of JSON): the estimate of the next one
        self._stuck = False  # no room came within room_timeout, and no capture has been written since
        self._forking = False  # the capture being written has forked its export process
        # A fork copies one thread, but every lock the process holds. So the writer forks only while the training
        # thread is parked in kprof's own code (never inside torch, holding the profiler's or an allocator's lock):
        self._fork_state = _IDLE  # _WAITING: a capture waits to fork; _FORKING: it is forking now
        self._parked = False  # the training thread is parked for a fork (for good once the session closes)
        self._thread = threading.Thread(target=self._loop, name="kprof-trace-writer", daemon=True)
        self._thread.start()

    @property
    def over_budget(self) -> bool:
        """True once the traces written and held reach ``max_bytes``: no new window starts (oldest traces win)."""
        return self.max_bytes is not None and self.written_bytes + self._held_bytes >= self.max_bytes

    def submit(self, prof, capture: Capture) -> None:
        """Queue a finished capture (on the training thread: waits only while held captures fill the budget).

        Ctrl-C during that wait still queues the capture, past the budget (the window is finished and the program is
        stopping), then goes on as a KeyboardInterrupt."""
        # the window's results: the next window gets new ones, so these are ours now
        job = (torch_compat.window_results(prof), capture, max(self._largest, _MIN_ESTIMATE))
        try:
            waited = self._wait_for_room(job[2])
        except KeyboardInterrupt:
            self._queue(job)
            raise
        if waited is None:
            self._fail(
                capture,
                "stuck",
                f"the trace writer made no room within {self.room_timeout:.0f} s (an "
                "on_trace callback or a write does not return): the capture of steps "
                f"{capture.first_step}-{capture.last_step} was dropped, and so is every later one until the "
                "writer moves again",
            )
            return
        capture.waited_s = waited
        if capture.waited_s > 0:
            self.waited_s += capture.waited_s
            self._warn_once(
                "wait",
                f"the trace writer was behind: training waited {capture.waited_s:.2f} s at the "
                f"end of the window of steps {capture.first_step}-{capture.last_step} for earlier captures "
                "to be written (Session.writer_wait_s has the total)",
            )
        self._queue(job)

    def wait_forked(self, timeout: float) -> None:
        """At a window's end (training thread): park (at most ``timeout``) until the capture submitted last has
        forked its export process, unless an earlier capture is still being written (it forks at a later
        ``let_fork``). The fork holds the GIL and must find the training thread outside torch: parking here keeps
        the stall inside kprof's own, measured, time."""
        if self.fork and hasattr(os, "fork") and len(self._queued) <= 1:
            self._park(timeout, lambda: not self._queued or self._forking)

    def let_fork(self, timeout: float) -> None:
        """At any step (training thread): if a capture waits to fork, park (at most ``timeout``) while it does."""
        if self._fork_state == _WAITING:  # read without the lock: a hint, checked again under it
            self._park(timeout, lambda: self._fork_state == _IDLE)

    def _park(self, timeout: float, done: Callable[[], bool]) -> None:
        with self._room, self._parking():
            self._room.wait_for(lambda: done() or not self._thread.is_alive(), timeout)

    @contextlib.contextmanager
    def _parking(self):
        """(Holding ``_room``, on the training thread) parked for the block: the writer may fork meanwhile; on
        leaving, a fork under way (it takes moments) ends first."""
        self._parked = True
        self._room.notify_all()
        try:
            yield
            self._room.wait_for(lambda: self._fork_state != _FORKING)
        finally:
            self._parked = False

    def _await_park(self) -> None:
        """Writer thread: wait until the training thread is parked (or the session closes), then fork at once."""
        with self._room:
            self._fork_state = _WAITING
            while not self._parked and not self._abandoned:
                self._room.wait(0.05)
            self._fork_state = _FORKING

    def _forked(self) -> None:
        with self._room:
            self._forking = True
            self._fork_state = _IDLE
            self._room.notify_all()

    def _wait_for_room(self, estimate: int) -> float | None:
        """Wait while the held captures and one more of ``estimate`` bytes overfill the budget; seconds waited, or
        None when no room came within ``room_timeout`` (at once while the writer is known to be stuck)."""
        start = time.perf_counter()
        waited = False
        with self._room, self._parking():  # the writer may need to fork to make room
            while self._queued and self._held_bytes + estimate > self.max_pending_bytes and self._thread.is_alive():
                left = start + self.room_timeout - time.perf_counter()
                if self._stuck or left <= 0:
                    self._stuck = True
                    return None
                waited = True
                self._room.wait(min(left, 0.05))
        return time.perf_counter() - start if waited else 0.0

    def _queue(self, job: tuple) -> None:
        """Hold the capture of ``job`` against the budget and hand it to the writer thread (only the training thread
        adds, so the room found by ``_wait_for_room`` is still there)."""
        with self._room:
            self._held_bytes += job[2]
            self._queued.append(job[1])
        self._jobs.put(job)

    def _release(self, capture: Capture, estimate: int, written: int) -> None:
        with self._room:
            self._queued.remove(capture)
            self._held_bytes -= estimate
            self._largest = max(self._largest, written)
            self._stuck = False
            self._forking = False
            self._room.notify_all()

    def submit_call(self, fn: Callable[[], None]) -> None:
        """Run a small piece of disk work (e.g. scalar logging) on the writer thread, in order with traces.

        Its errors count as write errors: one full disk is one warning, whether a trace or scalars hit it first.
        """
        self._jobs.put((fn, None, 0))

    def flush(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` seconds) until everything queued so far is written."""
        if not self._thread.is_alive():  # closed: close() already waited for what was queued
            return True
        done = threading.Event()

        def mark() -> None:
            with self._room:
                done.set()
                self._room.notify_all()

        self._jobs.put((mark, None, 0))
        self._park(timeout, done.is_set)  # this thread waits here anyway: exports may fork meanwhile
        return done.is_set()

    def close(self, timeout: float) -> bool:
        """Finish queued writes within ``timeout`` seconds; returns False (and warns) if some were left.

        What is left is dropped (each such capture's ``error`` says so) and a hung export process is killed: an
        orphan would keep writing after the program ends, holding its stdout/stderr pipes open.
        """
        with self._room:
            self._parked = True  # for good: training is over, the writer may fork at any time
            self._room.notify_all()
        self._jobs.put(None)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            return True
        self._abandoned = True  # the killed export's failure is the warning below, not one of its own
        with self._room:
            unfinished = list(self._queued)
        for pid in list(self._exports):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._thread.join(1.0)  # time to remove the killed export's temp files
        lost = [c for c in unfinished if c.path is None]  # the one whose on_trace callback hangs was written
        for capture in lost:
            capture.error = f"not written: trace writing did not finish within {timeout:.0f} s at the session's end"
        count = "1 capture not yet written was" if len(lost) == 1 else f"{len(lost)} captures not yet written were"
        warnings.warn(
            f"kprof: trace writing did not finish within {timeout:.0f} s; {count} dropped "
            f"(a '*{layout.PARTIAL}' file left in {self.run_dir} is ignored by readers)",
            RuntimeWarning,
            stacklevel=3,
        )
        return False

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None or self._abandoned:
                return
            work, capture, estimate = job
            if capture is None:
                self._run_quietly(work, "write")
                continue
            written = 0
            try:
                written = self._write(work, capture)
            finally:
                self._release(capture, estimate, written)

    def _write(self, results, capture: Capture) -> int:
        """Export one capture; returns the size of its JSON (0 when the write failed). ``capture.path`` is set once
        the file is in place."""
        final = layout.new_trace_path(self.run_dir, self.worker, self.compress)
        try:
            if self.fork and hasattr(os, "fork"):
                self._await_park()
                try:
                    size = exporter.export_in_child(
                        results, final, self.compress, self.child_timeout, self._exports, self._forked
                    )
                finally:
                    with self._room:  # when the fork itself failed, the parked thread must not wait on
                        self._fork_state = _IDLE
                        self._room.notify_all()
            else:
                size = exporter.export(results, final, self.compress)
            os.replace(layout.partial_path(final), final)
            capture.bytes = final.stat().st_size  # fails too if the folder was removed a moment ago
        except Exception as exc:  # disk full, logdir removed, read-only: drop this capture, keep training
            for leftover in layout.temp_paths(final):
                with contextlib.suppress(OSError):  # a read-only file system refuses even to unlink a missing file
                    leftover.unlink(missing_ok=True)
            if not self._abandoned:  # else close() has said why
                self._fail(capture, "write", f"writing {final.name} failed: {exc}")
            return 0
        capture.path = final
        self.written_bytes += capture.bytes
        self.files.append(final)
        if self.on_trace is not None:
            name = getattr(self.on_trace, "__qualname__", self.on_trace)
            self._run_quietly(lambda: self.on_trace(final), "callback", f"your on_trace callback {name}")
        return size

    def _run_quietly(self, fn: Callable[[], None], kind: str, what: str | None = None) -> None:
        try:
            fn()
        except BaseException as exc:  # even SystemExit: the writer thread must outlive any callback
            self._warn_once(kind, f"{what or getattr(fn, '__qualname__', fn)} raised {type(exc).__name__}: {exc}")

    def _fail(self, capture: Capture, kind: str, message: str) -> None:
        capture.error = message
        self.errors.append(message)
        self._warn_once(kind, message)

    def _warn_once(self, kind: str, message: str) -> None:
        """Warn the first time each kind of fault happens; later ones go to the debug log and ``errors``."""
        if kind in self._warned:
            log.debug("kprof: %s", message)
            return
        self._warned.add(kind)
        warnings.warn(f"kprof: {message} (training continues)", RuntimeWarning, stacklevel=2)
