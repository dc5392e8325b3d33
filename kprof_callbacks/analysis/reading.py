"""How a run's trace files are read: in this process, or by worker processes (``--jobs``), each file whole or in
pieces decoded in parallel, whichever is faster for the files' number and sizes. The one place ``jobs`` is decided.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

from ..progress import Progress, ProgressArg
from . import reader
from .file_analysis import FileResult, analyze
from .reader import TraceError, TraceFile
from .tables import Problem
from .workers import WorkerError, Workers

log = logging.getLogger(__name__)


PROGRESS_BYTES = 100 << 20  # runs bigger than this show a progress bar (summarize(progress=True), kprof summary)
# Runs smaller than _POOL_BYTES are read in this process, and a pool gets a process per _JOB_BYTES at most: a worker
# is a fresh interpreter (0.1-0.2 s to start, 16 at once, on a 16-core GPU host), and the columns it decodes come
# back pickled. There a 102 MB GPT trace was summarized in 0.54 s with 16 processes against 0.80 s in one, while a
# 53 MB CPU trace took 0.49 s against 0.43 s: the start-up eats what 16 processes save on half as much decoding.
_POOL_BYTES = 64 << 20
_JOB_BYTES = 4 << 20


def _guarded(path: Path, work: Callable[[], FileResult]) -> FileResult | Problem:
    """``work()``, or the Problem that says why the file could not be used."""
    try:
        return work()
    except TraceError as exc:
        return Problem(path, str(exc))
    except WorkerError as exc:
        return Problem(path, str(exc), transient=True)
    except Exception as exc:  # a file no check foresaw: it is a problem of that file, never of the whole run
        log.debug("analyzing %s failed", path, exc_info=True)
        return Problem(path, f"could not be analyzed ({type(exc).__name__}: {exc}); please report it")


def _read_here(path: Path, progress: Progress) -> FileResult:
    return analyze(reader.read_trace(path, progress.add))


def _read_whole(path: Path, jobs: int) -> FileResult:
    """A worker's task: read and analyze one whole file, its pieces decoded by up to ``jobs`` processes (this one and
    helpers of its own) where the file is big enough to pay for them."""
    quiet = Progress(False, 0, "")
    with _workers(jobs, [path]) as helpers:
        return _read_here(path, quiet) if helpers is None else analyze(_read_in(helpers, path, quiet)())


def _read_in(workers: Workers, path: Path, progress: Progress) -> Callable[[], TraceFile]:
    """Start decoding ``path``'s pieces in the workers; returns the call that waits for them and merges them."""
    found = reader.plan(path)
    futures = []
    for piece in found.pieces:
        futures.append(workers.submit(reader.Piece.decode, piece))
        futures[-1].add_done_callback(lambda _, weight=piece.weight: progress.add(weight))

    def merged() -> TraceFile:
        workers.wait(futures)
        try:
            parts = [f.result() for f in futures]
        except reader.Uncut:
            parts = [found.whole().decode()]
        return reader.trace_file(path, parts, found.around)

    return merged


def _analyze_files(paths: list[Path], workers: Workers | None, progress: Progress) -> list[FileResult | Problem]:
    """Each file's analysis, or the Problem that kept it out. With workers and at least half as many files as
    processes, each process reads and analyzes whole files (with a helper of its own for files big enough, when there
    are twice as many processes as files); with fewer (a few big files), every file's pieces are decoded in parallel,
    then each file is analyzed (in a worker when there are several) as soon as its pieces are in."""
    if workers is None:
        return [_guarded(path, lambda path=path: _read_here(path, progress)) for path in paths]
    if len(paths) > 1 and 2 * len(paths) >= workers.jobs:
        # files enough to keep the processes busy: each process reads and analyzes whole files, so only a file's
        # result crosses a pipe, not its columns twice (the decoded pieces back, then the merged trace out again);
        # where there are cores to spare (8 files, 16 jobs), each file's process gets helpers of its own
        share = workers.jobs // len(paths)
        tasks = {path: workers.submit(_read_whole, path, share) for path in paths}
        for path, task in tasks.items():
            size = _size(path)
            task.add_done_callback(lambda _, size=size: progress.add(size))
        workers.wait(tasks.values())
        return [_guarded(path, task.result) for path, task in tasks.items()]
    reads = {path: _guarded(path, lambda path=path: _read_in(workers, path, progress)) for path in paths}
    if len(paths) == 1:
        ((path, read),) = reads.items()
        return [read if isinstance(read, Problem) else _guarded(path, lambda: analyze(read()))]
    analyses = {
        path: read if isinstance(read, Problem) else _guarded(path, lambda read=read: workers.submit(analyze, read()))
        for path, read in reads.items()
    }
    workers.wait(a for a in analyses.values() if not isinstance(a, Problem))
    return [a if isinstance(a, Problem) else _guarded(path, a.result) for path, a in analyses.items()]


@contextlib.contextmanager
def _workers(jobs: int, paths: list[Path]) -> Iterator[Workers | None]:
    """Worker processes for reading ``paths``, or None when one process does it faster."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    total = sum(_size(p) for p in paths)
    jobs = min(jobs, total // _JOB_BYTES + 1)
    if jobs == 1 or total < _POOL_BYTES:
        yield None
        return
    with Workers(jobs) as workers:
        yield workers


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def read_files(paths: list[Path], jobs: int, progress: ProgressArg, label: str) -> dict[Path, FileResult | Problem]:
    """Each file's analysis, or the Problem that kept it out, read by up to ``jobs`` processes; ``progress`` as
    ``summarize``'s (a bar for runs over PROGRESS_BYTES, labelled ``label``)."""
    meter = Progress(progress, sum(_size(p) for p in paths), label[:60], in_bytes=True, min_total=PROGRESS_BYTES)
    try:
        with _workers(jobs, paths) as workers:
            return dict(zip(paths, _analyze_files(paths, workers, meter)))
    finally:
        meter.close()
