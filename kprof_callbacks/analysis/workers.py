"""Worker processes that read and summarize trace files in parallel (``kprof summary --jobs``, the kprof tab).

A worker is a fresh interpreter running this module, never a fork of the caller: the caller may hold threads
(TensorBoard's server) or a CUDA context (a training script), and nothing of the caller's own script runs again in
it, guarded by ``if __name__ == "__main__"`` or not. A task is a module-level function and its arguments, pickled to
the worker's stdin; its result, or the exception it raised, comes back pickled on the worker's stdout. A worker
that dies fails the task it held (WorkerError) and is replaced for the next one. The caller is a worker too: while
it waits for results (``wait``), it runs queued tasks itself, which also covers the workers' start-up.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import wait as wait_any
from typing import IO, Any

_LENGTH = struct.Struct("<Q")


class WorkerError(RuntimeError):
    """A worker process ended while it held a task (killed, out of memory, crashed)."""


def default_jobs() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _pickled(obj: object) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _send(pipe: IO[bytes], obj: object) -> None:
    _write(pipe, _pickled(obj))


def _write(pipe: IO[bytes], data: bytes) -> None:
    pipe.write(_LENGTH.pack(len(data)))
    pipe.write(data)
    pipe.flush()


def _receive(pipe: IO[bytes]) -> Any:
    head = pipe.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        raise EOFError("the other end closed the pipe")
    (size,) = _LENGTH.unpack(head)
    data = pipe.read(size)
    if len(data) < size:
        raise EOFError("the other end closed the pipe")
    return pickle.loads(data)


class Workers:
    """``jobs - 1`` worker processes and the caller; ``submit(fn, *args)`` returns a Future, ``wait(futures)`` runs
    queued tasks here until those are done. Use as a context manager: on exit the workers finish the tasks in hand
    and quit."""

    def __init__(self, jobs: int) -> None:
        if jobs < 2:
            raise ValueError(f"jobs must be >= 2 (the caller and a worker), got {jobs}")
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self._threads = [
            threading.Thread(target=self._serve, name=f"kprof-worker-{k}", daemon=True) for k in range(jobs - 1)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def jobs(self) -> int:
        """The processes that run tasks: the workers and the caller."""
        return len(self._threads) + 1

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        self._tasks.put((future, fn, args))
        return future

    def wait(self, futures: Iterable[Future]) -> None:
        """Return when all ``futures`` are done, running queued tasks in this process meanwhile."""
        pending = set(futures)
        while pending:
            try:
                item = self._tasks.get_nowait()
            except queue.Empty:
                pending = wait_any(pending, return_when=FIRST_COMPLETED).not_done
                continue
            if item is None:  # closing: leave the sentinel for a feeder
                self._tasks.put(None)
                pending = wait_any(pending, return_when=FIRST_COMPLETED).not_done
                continue
            future, fn, args = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:  # the waiter re-raises it
                    future.set_exception(exc)
            pending = {f for f in pending if not f.done()}

    def close(self) -> None:
        for _ in self._threads:
            self._tasks.put(None)
        for thread in self._threads:
            thread.join()

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self._env
        )

    def _serve(self) -> None:
        """One worker's feeder: hand it tasks one at a time until told to stop; replace it when it dies."""
        proc = self._start()
        try:
            while (item := self._tasks.get()) is not None:
                future, fn, args = item
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    task = _pickled((fn, args))
                except Exception as exc:  # a task that cannot be sent fails alone; nothing reached the worker
                    future.set_exception(exc)
                    continue
                try:
                    _write(proc.stdin, task)
                    ok, value = _receive(proc.stdout)
                except (OSError, EOFError) as exc:
                    proc.kill()
                    proc.wait()
                    future.set_exception(
                        WorkerError(
                            f"a worker process ended (exit status {proc.returncode}) while "
                            f"running {getattr(fn, '__name__', fn)}: {exc}"
                        )
                    )
                    proc = self._start()
                    continue
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)
        finally:
            with contextlib.suppress(OSError):
                proc.stdin.close()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a RuntimeError that says what it was."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


def main() -> None:
    """The worker's loop: tasks from stdin, results to stdout, until stdin closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the caller, which then closes our stdin
    tasks, results = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # a stray print must not corrupt the results
    from . import reader  # noqa: F401  (imported while the caller is still planning)

    while True:
        try:
            fn, args = _receive(tasks)
        except EOFError:
            return
        try:
            result = (True, fn(*args))
        except BaseException as exc:  # the caller re-raises it
            result = (False, _portable(exc))
        _send(results, result)


if __name__ == "__main__":
    main()
