"""`summarize(path)`: trace files on disk -> `Summary` (tables, diagnostics, exports).

One pass per file: decode (reader), columns (timeline), call tree (tree), then per-step
breakdown, operator/label/kernel totals and diagnostic evidence; files of one run are then
merged, with one entry per rank (or worker) for the multi-rank view.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from .. import layout
from ..progress import Progress, ProgressArg
from . import (
    comm,
    diagnostics,
    health,
    html,
    machine,
    ops,
    perstep,
    ranks,
    reader,
    report,
    saved,
    stacks,
    steps,
    trends,
)
from .events import PYTHON, build
from .reader import TraceError, TraceFile
from .series import Series, read_series
from .tables import (
    SORT_KEYS,
    CommStats,
    Diagnostic,
    FsdpStep,
    KernelStats,
    LabelStats,
    OpStats,
    Problem,
    RankStats,
    StepSkew,
    StepStats,
)
from .tree import nest
from .workers import WorkerError, Workers

if TYPE_CHECKING:
    import pandas

log = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class Summary:
    """What a run's traces say: per-step breakdown, top operators, kernels, labels, ranks, findings."""

    name: str
    files: list[Path]
    steps: list[StepStats]
    ops: list[OpStats]
    ops_by_shape: list[OpStats]  # empty unless the traces recorded input shapes
    kernels: list[KernelStats]
    labels: list[LabelStats]
    ranks: list[RankStats]  # one per rank/worker; more than one for multi-process runs
    step_skew: list[StepSkew]  # per step, the slowest rank (distributed runs)
    diagnostics: list[Diagnostic]
    problems: list[Problem]  # one per file that could not be read
    memory_snapshots: list[Path]
    per_step: perstep.PerStep = dataclasses.field(repr=False)  # rows by steps, for kprof.diff
    series: dict[str, dict[str, Series]] = dataclasses.field(repr=False, default_factory=dict)  # scalars, all steps
    comm: list[CommStats] = dataclasses.field(default_factory=list)  # by rank, step, collective and FSDP phase
    fsdp: list[FsdpStep] = dataclasses.field(default_factory=list)  # FSDP's step edges and memory, by rank and step
    _stacks: list[stacks.StackSource] = dataclasses.field(repr=False, default_factory=list)

    @classmethod
    def empty(cls, name: str, why: str) -> Summary:
        """A Summary of nothing, saying ``why`` (e.g. profiling was disabled): every table empty, one finding."""
        return cls(
            name=name,
            files=[],
            steps=[],
            ops=[],
            ops_by_shape=[],
            kernels=[],
            labels=[],
            ranks=[],
            step_skew=[],
            diagnostics=[Diagnostic("nothing recorded", "info", why)],
            problems=[],
            memory_snapshots=[],
            per_step=perstep.PerStep([], [], np.zeros((0, 0)), np.zeros((0, 0)), []),
        )

    @property
    def has_gpu(self) -> bool:
        """Whether the traces recorded any GPU activity."""
        return bool(self.kernels)

    def render(self, top: int = 10, sort: str = "cuda") -> str:
        """The report as text: `top` rows per table, operators sorted by self `cuda`, `cpu` or `memory`."""
        _check_report_options(top, sort)
        return report.render(self, top=top, sort=sort)

    def __str__(self) -> str:
        return self.render()

    def print(self, top: int = 10, sort: str = "cuda", file: TextIO | None = None) -> None:
        """Print the text report (to stdout unless `file` is given)."""
        print(self.render(top=top, sort=sort), file=file or sys.stdout)

    def to_dict(self) -> dict[str, Any]:
        """All tables as JSON-safe lists of dicts, with the per-step rows `kprof.diff` tests (`from_dict` reads it
        back: a saved summary can be a side of a diff)."""

        def rows(items: Iterable[Any]) -> list[dict[str, Any]]:
            return [dataclasses.asdict(r) for r in items]

        return {
            saved.FORMAT_KEY: saved.VERSION,
            "name": self.name,
            "files": [str(p) for p in self.files],
            "steps": rows(self.steps),
            "ops": rows(self.ops),
            "ops_by_shape": rows(self.ops_by_shape),
            "kernels": rows(self.kernels),
            "labels": rows(self.labels),
            "ranks": [
                dict(dataclasses.asdict(r), comm_share=r.comm_share, overlap_share=r.overlap_share) for r in self.ranks
            ],
            "step_skew": rows(self.step_skew),
            "comm": rows(self.comm),
            "fsdp": rows(self.fsdp),
            "diagnostics": rows(self.diagnostics),
            "problems": [{"path": str(p.path), "reason": p.reason} for p in self.problems],
            "memory_snapshots": [str(p) for p in self.memory_snapshots],
            "per_step": self.per_step.to_dict(self.steps),
            "machine": machine.to_dict(self.series),  # what the machine did: a saved side of a diff says it too
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Summary:
        """The Summary `to_dict` wrote (parsed JSON): every table, the findings, the per-step rows and the machine's
        samples; its call stacks and the other scalar series stay with the trace files."""
        saved.check_version(data)

        def rows(row: type, items: Iterable[dict[str, Any]]) -> list[Any]:
            names = {f.name for f in dataclasses.fields(row)}
            return [row(**{k: v for k, v in item.items() if k in names}) for item in items]

        steps = rows(StepStats, data["steps"])
        return cls(
            name=data["name"],
            files=[Path(p) for p in data["files"]],
            steps=steps,
            ops=rows(OpStats, data["ops"]),
            ops_by_shape=rows(OpStats, data["ops_by_shape"]),
            kernels=rows(KernelStats, data["kernels"]),
            labels=[
                dataclasses.replace(label, contains=tuple(label.contains)) for label in rows(LabelStats, data["labels"])
            ],
            ranks=rows(RankStats, data["ranks"]),
            step_skew=rows(StepSkew, data["step_skew"]),
            diagnostics=rows(Diagnostic, data["diagnostics"]),
            problems=[Problem(Path(p["path"]), p["reason"]) for p in data["problems"]],
            memory_snapshots=[Path(p) for p in data["memory_snapshots"]],
            per_step=perstep.PerStep.from_dict(data["per_step"], steps),
            comm=rows(CommStats, data["comm"]),
            fsdp=rows(FsdpStep, data["fsdp"]),
            series=machine.from_dict(data.get("machine", {})),
        )

    def to_pandas(self) -> dict[str, pandas.DataFrame]:
        """One DataFrame per table (steps, ops, ops_by_shape, kernels, labels, ranks, step_skew, comm, fsdp,
        diagnostics)."""
        import pandas as pd

        tables = {
            "steps": StepStats,
            "ops": OpStats,
            "ops_by_shape": OpStats,
            "kernels": KernelStats,
            "labels": LabelStats,
            "ranks": RankStats,
            "step_skew": StepSkew,
            "comm": CommStats,
            "fsdp": FsdpStep,
            "diagnostics": Diagnostic,
        }
        data = self.to_dict()
        return {
            key: pd.DataFrame(data[key], columns=[f.name for f in dataclasses.fields(row)] if not data[key] else None)
            for key, row in tables.items()
        }

    def to_markdown(self, top: int = 10, sort: str = "cuda") -> str:
        """The report as GitHub-flavoured Markdown (a pull-request comment): the findings and the tables of
        `render(top, sort)`."""
        _check_report_options(top, sort)
        return report.markdown(self, top=top, sort=sort)

    def _repr_html_(self) -> str:
        """The HTML report as a notebook shows it: no page around it, no scripts, nothing fetched."""
        return html.fragment(html.summary_body(self, 10, "cuda"))

    def to_html(self, path: str | Path, top: int = 20, sort: str = "cuda") -> Path:
        """Write a self-contained HTML report (inline SVG plots and timelines, no scripts, no network): the tables of
        `render(top, sort)`."""
        _check_report_options(top, sort)
        return html.write_html({self.name: self}, Path(path), top=top, sort=sort)

    def export_stacks(self, path: str | Path, metric: str = "self_cpu") -> Path:
        """Write flamegraph folded stacks (`self_cpu` or `self_cuda` microseconds) to `path`."""
        folded = stacks.folded(self._stacks, metric)
        if not any(s.has_python for s in self._stacks):
            log.warning(
                "no Python stacks in the traces (profile with with_stack=True): "
                "the folded stacks show operator nesting only"
            )
        if metric == "self_cuda" and not folded:
            log.warning("no GPU kernels in the traces: %s is empty", path)
        stacks.write_folded(folded, path)
        return Path(path)


def _check_report_options(top: int, sort: str) -> None:
    if sort not in SORT_KEYS:
        raise ValueError(f"sort must be one of {SORT_KEYS}, got {sort!r}")
    if top < 1:
        raise ValueError(f"top must be >= 1, got {top}")


@dataclasses.dataclass
class _FileResult:
    rank: int | None
    worker: str
    times: steps.StepTimes
    ops: ops.Totals
    ops_by_shape: ops.Totals
    labels: ops.Totals
    label_nesting: set[tuple[str, str]]
    kernels: ops.Totals
    evidence: diagnostics.Evidence
    stack: stacks.StackSource
    per_step: perstep.PerStep
    comm: comm.FileComm
    health: health.FileHealth


def _analyze(trace: TraceFile) -> _FileResult:
    tl = build(trace)
    host = tl.host
    tree = nest(host.thread, host.start, host.end, host.name)
    costs = ops.host_costs(tl, tree)
    times = steps.step_times(tl, trace.rank, tree)
    launcher = tree.kept(ops.launcher_of_device_events(tl))
    return _FileResult(
        rank=trace.rank,
        worker=trace.worker,
        times=times,
        ops=ops.op_totals(tl, tree, costs, by_shape=False),
        ops_by_shape=ops.op_totals(tl, tree, costs, by_shape=True) if tl.shapes else {},
        labels=ops.label_totals(tl, tree, costs),
        label_nesting=ops.label_nesting(tl, tree),
        kernels=ops.kernel_totals(tl),
        evidence=diagnostics.gather(tl, times.windows, tree),
        stack=stacks.StackSource(
            names=tl.names,
            name=host.name,
            parent=tree.parent,
            depth=tree.depth,
            keep=tree.keep,
            self_cpu_us=costs.self_cpu,
            kernel_name=tl.device.name,
            kernel_launcher=launcher,
            kernel_us=(tl.device.end - tl.device.start) / 1000.0,
            has_python=bool((host.kind == PYTHON).any()),
        ),
        per_step=perstep.from_timeline(tl, tree, costs, times),
        comm=comm.analyze(tl, times),
        health=health.gather(tl, times, trace.columns.clipped, trace.world_size),
    )


PROGRESS_BYTES = 100 << 20  # runs bigger than this show a progress bar (summarize(progress=True), kprof summary)
# Runs smaller than _POOL_BYTES are read in this process, and a pool gets a process per _JOB_BYTES at most: a worker
# is a fresh interpreter (0.1-0.2 s to start, 16 at once, on a 16-core GPU host), and the columns it decodes come
# back pickled. There a 102 MB GPT trace was summarized in 0.54 s with 16 processes against 0.80 s in one, while a
# 53 MB CPU trace took 0.49 s against 0.43 s: the start-up eats what 16 processes save on half as much decoding.
_POOL_BYTES = 64 << 20
_JOB_BYTES = 4 << 20


def _guarded(path: Path, work: Callable[[], _FileResult]) -> _FileResult | Problem:
    """``work()``, or the Problem that says why the file could not be used."""
    try:
        return work()
    except (TraceError, WorkerError) as exc:
        return Problem(path, str(exc))
    except Exception as exc:  # a file no check foresaw: it is a problem of that file, never of the whole run
        log.debug("analyzing %s failed", path, exc_info=True)
        return Problem(path, f"could not be analyzed ({type(exc).__name__}: {exc}); please report it")


def _read_here(path: Path, progress: Progress) -> _FileResult:
    return _analyze(reader.read_trace(path, progress.add))


def _read_whole(path: Path, jobs: int) -> _FileResult:
    """A worker's task: read and analyze one whole file, its pieces decoded by up to ``jobs`` processes (this one and
    helpers of its own) where the file is big enough to pay for them."""
    quiet = Progress(False, 0, "")
    with _workers(jobs, [path]) as helpers:
        return _read_here(path, quiet) if helpers is None else _analyze(_read_in(helpers, path, quiet)())


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


def _analyze_files(paths: list[Path], workers: Workers | None, progress: Progress) -> list[_FileResult | Problem]:
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
        return [read if isinstance(read, Problem) else _guarded(path, lambda: _analyze(read()))]
    analyses = {
        path: read if isinstance(read, Problem) else _guarded(path, lambda read=read: workers.submit(_analyze, read()))
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


def summarize_runs(
    runs: list[tuple[str, layout.RunContents]], *, progress: ProgressArg = False, jobs: int = 1
) -> list[Summary | ValueError]:
    """One Summary per (name, files) pair, in order, all runs' files read together: ``jobs`` worker processes decode
    and analyze them in parallel. A run with nothing readable gives the ValueError that says why."""
    paths = [p for _, found in runs for p in found.traces]
    meter = Progress(
        progress,
        sum(_size(p) for p in paths),
        f"summarizing {', '.join(n for n, _ in runs)}"[:60],
        in_bytes=True,
        min_total=PROGRESS_BYTES,
    )
    try:
        with _workers(jobs, paths) as workers:
            results = dict(zip(paths, _analyze_files(paths, workers, meter)))
    finally:
        meter.close()
    out: list[Summary | ValueError] = []
    for name, found in runs:
        try:
            out.append(_assemble(name, found, [results[p] for p in found.traces]))
        except ValueError as exc:
            out.append(exc)
    return out


def summarize_contents(name: str, found: layout.RunContents, progress: ProgressArg = False, jobs: int = 1) -> Summary:
    """One Summary of the files ``found`` lists, for a caller that listed (and vetted) a run folder itself."""
    (result,) = summarize_runs([(name, found)], progress=progress, jobs=jobs)
    if isinstance(result, ValueError):
        raise result
    return result


def _assemble(name: str, found: layout.RunContents, analyzed: list[_FileResult | Problem]) -> Summary:
    """The run's Summary from its files' analyses; ValueError when none could be read."""
    problems = [Problem(p, f"skipped, still being written (*{layout.PARTIAL})") for p in found.partial]
    problems += [r for r in analyzed if isinstance(r, Problem)]
    results = [r for r in analyzed if not isinstance(r, Problem)]
    files = [p for p, r in zip(found.traces, analyzed) if not isinstance(r, Problem)]
    for problem in problems:
        log.warning("%s", problem)
    if not results:
        raise ValueError(f"nothing readable in {name}: " + ("; ".join(map(str, problems)) or "no trace files"))

    workers: dict[tuple, ranks.Worker] = {}
    for r in results:
        key = ("rank", r.rank) if r.rank is not None else ("worker", r.worker)
        worker = workers.setdefault(key, ranks.Worker(r.rank, r.worker, []))
        worker.times.append(r.times)
        worker.transfers.append(r.comm.transfers)
    ordered = sorted(workers.values(), key=lambda w: (w.rank is None, w.rank or 0, w.worker))
    step_rows = [row for w in ordered for t in w.times for row in t.rows]
    evidence = diagnostics.Evidence()
    for r in results:
        evidence.add(r.evidence)
    rank_rows = ranks.rank_stats(ordered)
    skew = ranks.step_skew(ordered)
    per_step = perstep.merge([r.per_step for r in results])
    series = read_series(files[0].parent)
    comm_rows, fsdp_rows = [c for r in results for c in r.comm.rows], [f for r in results for f in r.comm.fsdp]
    found_all = health.check([r.health for r in results], ordered)  # the capture's own health first
    found_all += machine.findings(series)  # then the machine's: starved of CPU, a GPU slowed
    found_all += diagnostics.diagnose(step_rows, rank_rows, evidence, per_step, fsdp=bool(fsdp_rows))
    found_all += comm.findings(comm_rows, fsdp_rows, step_rows, evidence.has_gpu) + ranks.findings(rank_rows, skew)
    ends: dict[str, list[int]] = {}
    for r in results:
        ends.setdefault(r.worker, []).extend(s.step for s in r.times.rows[-1:])
    gpus = list(evidence.gpus)
    found_all += trends.findings(
        series,
        found.snapshots,
        evidence.matmul_flops,
        sum(s.wall_us for s in step_rows),
        len(step_rows),
        ends,
        gpus[0] if len(gpus) == 1 else "",
    )
    return Summary(
        name=name,
        files=files,
        steps=step_rows,
        ops=ops.op_rows(r.ops for r in results),
        ops_by_shape=ops.op_rows(r.ops_by_shape for r in results),
        kernels=ops.kernel_rows(r.kernels for r in results),
        labels=ops.label_rows(
            (r.labels for r in results),
            sum(s.wall_us for s in step_rows),
            set().union(*(r.label_nesting for r in results)),
        ),
        ranks=rank_rows,
        step_skew=skew,
        diagnostics=sorted(found_all, key=lambda d: d.severity != "warning"),
        problems=problems,
        memory_snapshots=found.snapshots,
        per_step=per_step,
        series=series,
        comm=comm_rows,
        fsdp=fsdp_rows,
        _stacks=[r.stack for r in results],
    )


def runs_of(path: str | Path) -> tuple[bool, dict[str, layout.RunContents]]:
    """What ``path`` names: (whether it is a logdir of runs, its runs by name). FileNotFoundError for a missing path,
    ValueError for one that holds no trace file or is no file or folder at all."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a trace file, run folder or logdir (str or Path), got {type(path).__name__}")
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"no such trace file or folder: {root}")
    if root.is_file():
        return False, {root.name: layout.RunContents([root], [], layout.contents(root.parent).snapshots, None)}
    if not root.is_dir():
        raise ValueError(f"{root} is neither a trace file nor a folder")
    runs = {} if layout.contents(root).is_run else layout.find_runs(root)
    if not runs:  # a run folder; without *.pt.trace.json files, any *.json[.gz] (export_chrome_trace names)
        found = layout.contents(root, any_json=True)
        if not found.is_run:
            raise ValueError(f"no trace files ({', '.join('*' + s for s in layout.TRACE_SUFFIXES)}) in {root}")
        return False, {root.resolve().name: found}
    return True, {name: layout.contents(folder) for name, folder in runs.items()}


def summarize(path: str | Path, *, progress: ProgressArg = False, jobs: int = 1) -> Summary | dict[str, Summary]:
    """Summarize torch.profiler traces on disk.

    `path` is a trace file, a run folder (trace files directly inside: one Summary, with a
    row per rank when several processes wrote traces), or a logdir whose subfolders are
    runs (a dict run name -> Summary). Unreadable files become lines in `Summary.problems`;
    a missing path raises FileNotFoundError, and nothing readable at all raises ValueError.
    `jobs` > 1 reads big runs in that many worker processes (fresh interpreters, never forks of this one);
    `progress=True` shows a bar on stderr for runs over 100 MB, a callable gets (bytes done, bytes in all).
    A summary saved as JSON (`kprof summary --json`) is read back as it was saved (`Summary.from_dict`).
    """
    if isinstance(path, (str, os.PathLike)) and saved.is_saved(Path(path)):
        return saved.read(Path(path))
    many, runs = runs_of(path)
    results = summarize_runs(list(runs.items()), progress=progress, jobs=jobs)
    if not many:
        (result,) = results
        if isinstance(result, ValueError):
            raise result
        return result
    out = {name: r for name, r in zip(runs, results) if not isinstance(r, ValueError)}
    for failure in results:
        if isinstance(failure, ValueError):
            log.warning("%s", failure)
    if not out:
        raise ValueError("; ".join(map(str, results)))
    return out
