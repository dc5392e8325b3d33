"""Worker processes that read and summarize trace files in parallel (``kprof summary --jobs``, the kprof tab).

A worker is a fresh interpreter running this module, never a fork of the caller: the caller may hold threads
(TensorBoard's server) or a CUDA context (a training script), and nothing of the caller's own script runs again in
it, guarded by ``if __name__ == "__main__"`` or not. A task is a module-level function and its arguments, pickled to
the worker's stdin; its result, or the exception it raised, comes back pickled on the worker's stdout. While the
queue holds a task for every process, each worker is sent its next task while it runs one (a thread of the worker
takes it off the pipe), so it does not wait for its feeder thread, which needs the caller's GIL. A worker that dies
is replaced, and its replacement gets the task it was running once more (then WorkerError) and the task sent behind
it. Whatever else goes wrong in a feeder (no process or thread can start, the memory runs out, an answer that cannot
be unpickled) fails the tasks it holds, never leaves them pending. The caller is a worker too: while it waits for
results (``wait``), it runs queued tasks itself, which also covers the workers' start-up (and feeders that could not
start). Workers import from the caller's ``sys.path`` alone, never from the current folder
(``shell.module_command``), run numpy single-threaded and keep the memory they free (``keep_freed_memory``).
"""

from __future__ import annotations

import collections
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

from .. import shell

_LENGTH = struct.Struct("<Q")
# Tasks a worker holds: the one it runs and the next, already in its pipe, while the queue has a task for every process
# (else a worker could sit on a whole file another would start at once). On a 2-core machine a worker fed one task at a
# time waited ~5 ms (the interpreter's switch interval) for its feeder after each ~11 ms task.
_DEPTH = 2
_PIPE_BYTES = 1 << 20  # the unprivileged maximum on Linux
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt() parameters
# Workers never multiply matrices: no BLAS thread pool (numpy's OpenBLAS starts a thread per core in each process).
_ONE_THREAD = {v: "1" for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
_TRIES = 2  # a task whose worker died is sent once more, to the worker that replaces it


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
    return pickle.loads(_read(pipe))


def _read(pipe: IO[bytes]) -> bytes:
    head = pipe.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        raise EOFError("the other end closed the pipe")
    (size,) = _LENGTH.unpack(head)
    data = pipe.read(size)
    if len(data) < size:
        raise EOFError("the other end closed the pipe")
    return data


class Workers:
    """``jobs - 1`` worker processes and the caller; ``submit(fn, *args)`` returns a Future, ``wait(futures)`` runs
    queued tasks here until those are done. Use as a context manager: on exit the workers finish the tasks in hand
    and quit."""

    def __init__(self, jobs: int) -> None:
        if jobs < 2:
            raise ValueError(f"jobs must be >= 2 (the caller and a worker), got {jobs}")
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._env = {**os.environ, **_ONE_THREAD, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self._threads: list[threading.Thread] = []
        for k in range(jobs - 1):
            thread = threading.Thread(target=self._serve, name=f"kprof-worker-{k}", daemon=True)
            try:
                thread.start()
            except RuntimeError:  # can't start new thread (a limit on threads): fewer workers, the caller does the rest
                break
            self._threads.append(thread)

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
        proc = subprocess.Popen(
            shell.module_command(__name__), stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self._env
        )
        for pipe in (proc.stdin, proc.stdout):
            _widen(pipe)
        return proc

    def _serve(self) -> None:
        """One worker's feeder: keep up to _DEPTH tasks sent to it until told to stop; replace it when it dies. Any
        exception here fails the tasks it holds (never left pending); the caller runs what is still queued."""
        held: collections.deque[list] = collections.deque()  # [future, fn, pickled task, tries] sent to the worker
        proc, stopping = None, False
        try:
            proc = self._start()
            while held or not stopping:
                stopping = stopping or self._take(proc, held)
                if not held:
                    continue
                try:
                    ok, value = _receive(proc.stdout)
                except Exception as exc:  # the worker ended, or its answer cannot be read: it is replaced
                    proc = self._replace(proc, held, exc)
                    continue
                future = held.popleft()[0]
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)
        except BaseException as exc:
            for future, *_ in held:
                future.set_exception(WorkerError(f"a worker could not run the task ({type(exc).__name__}: {exc})"))
        finally:
            if proc is not None:
                _end(proc)

    def _take(self, proc: subprocess.Popen, held: collections.deque[list]) -> bool:
        """Send the worker queued tasks until it holds _DEPTH (waiting for one while it holds none); True once the
        queue said to stop."""
        while len(held) < _DEPTH:
            if held and self._tasks.qsize() < self.jobs:  # a second task only while each process can have one
                return False
            try:
                item = self._tasks.get(block=not held)
            except queue.Empty:
                return False
            if item is None:
                return True
            if (task := _claimed(item)) is not None:
                held.append([item[0], item[1], task, 1])
                _offer(proc, task)
        return False

    def _replace(self, proc: subprocess.Popen, held: collections.deque[list], exc: Exception) -> subprocess.Popen:
        """A worker that ended, or whose answer could not be read: kill it and start another, which gets the task it
        ran once more (after _TRIES, the task fails) and those sent behind it."""
        proc.kill()
        proc.wait()
        future, fn, _, tries = held[0]
        if tries >= _TRIES:
            held.popleft()
            name = getattr(fn, "__name__", fn)
            if isinstance(exc, (OSError, EOFError)):
                what = f"a worker process ended (exit status {proc.returncode}) while running {name}"
            else:
                what = f"the answer of a worker process running {name} could not be read"
            future.set_exception(WorkerError(f"{what}, on each of {tries} tries ({type(exc).__name__}: {exc})"))
        else:
            held[0][3] += 1
        proc = self._start()
        for _, _, task, _ in held:
            _offer(proc, task)
        return proc


def _end(proc: subprocess.Popen) -> None:
    """Close the worker's tasks pipe (it then exits) and reap it."""
    with contextlib.suppress(OSError):
        proc.stdin.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _widen(pipe: IO[bytes]) -> None:
    """Let the pipe hold a whole result (a piece's columns: ~0.5 MB), where the system allows: the worker hands it over
    in one write and its feeder takes it in one read. Through 64 KB at a time, each read waits for the GIL anew."""
    with contextlib.suppress(ImportError, AttributeError, OSError):  # Linux only, capped by fs/pipe-max-size
        import fcntl

        fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, _PIPE_BYTES)


def keep_freed_memory() -> None:
    """Have glibc keep the memory this process frees for its next allocations rather than hand it back to the system:
    the analysis allocates and frees hundreds of MB of arrays, and every page handed back faults in anew when taken
    again. A 50 MB summary went from 0.39 to 0.28 s (45,000 page faults to 500) on a 2-core machine. For processes
    that end when their analysis does (the CLI's, the workers): they keep their peak memory. Not glibc: nothing."""
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (ImportError, OSError, AttributeError, TypeError):
        return
    # Both or neither: setting one turns off glibc's own adjustment of the other (and faulted more than before).
    mallopt(_M_MMAP_THRESHOLD, 32 << 20)  # the most glibc accepts: bigger blocks are still mapped on their own
    mallopt(_M_TRIM_THRESHOLD, 1 << 30)


def _claimed(item: tuple[Future, Callable[..., Any], tuple]) -> bytes | None:
    """The queued task pickled for a worker, with its future marked running; None when it is not to be sent (its
    future was cancelled, or it cannot be pickled: then it fails alone)."""
    future, fn, args = item
    if not future.set_running_or_notify_cancel():
        return None
    try:
        return _pickled((fn, args))
    except Exception as exc:
        future.set_exception(exc)
        return None


def _offer(proc: subprocess.Popen, task: bytes) -> None:
    """Send ``task`` to the worker; a worker that is gone is found when its result is read."""
    with contextlib.suppress(OSError):
        _write(proc.stdin, task)


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
    keep_freed_memory()
    results, inbox = sys.stdout.buffer, queue.SimpleQueue()
    sys.stdout = sys.stderr  # a stray print must not corrupt the results
    threading.Thread(target=_take_tasks, args=(sys.stdin.buffer, inbox), daemon=True).start()
    from . import reader  # noqa: F401  (imported while the caller is still planning)

    while (task := inbox.get()) is not None:
        try:
            fn, args = pickle.loads(task)
            result = (True, fn(*args))
        except BaseException as exc:  # the caller re-raises it
            result = (False, _portable(exc))
        try:
            _send(results, result)
        except OSError:  # the caller is gone (killed): end without a traceback
            break
    with contextlib.suppress(OSError):
        sys.stderr.flush()
    os._exit(0)  # no teardown (freeing numpy and every object left), which the caller's close() would wait for


def _take_tasks(tasks: IO[bytes], inbox: queue.SimpleQueue) -> None:
    """Move tasks from the pipe to ``inbox`` as they come (the feeder never blocks on a full pipe while this worker
    writes a result); None when the pipe closes or fails (the worker then ends, which fails the task it was sent)."""
    try:
        while True:
            inbox.put(_read(tasks))
    except (EOFError, OSError):
        inbox.put(None)


if __name__ == "__main__":
    main()
