"""`summarize(path)`: trace files on disk -> `Summary` (tables, diagnostics, exports).

One pass per file: decode (reader), columns (timeline), call tree (tree), then per-step
breakdown, operator/label/kernel totals and diagnostic evidence; files of one run are then
merged, with one entry per rank (or worker) for the multi-rank view.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from .. import layout
from . import diagnostics, html, ops, perstep, ranks, report, stacks, steps, trends
from .reader import TraceError, TraceFile, read_trace
from .series import Series, read_series
from .tables import Diagnostic, KernelStats, LabelStats, OpStats, Problem, RankStats, StepSkew, StepStats
from .timeline import PYTHON, build
from .tree import nest

if TYPE_CHECKING:
    import pandas

log = logging.getLogger(__name__)

SORT_KEYS = ("cuda", "cpu", "memory")


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
    _stacks: list[stacks.StackSource] = dataclasses.field(repr=False, default_factory=list)

    @classmethod
    def empty(cls, name: str, why: str) -> Summary:
        """A Summary of nothing, saying ``why`` (e.g. profiling was disabled): every table empty, one finding."""
        return cls(name=name, files=[], steps=[], ops=[], ops_by_shape=[], kernels=[], labels=[], ranks=[],
                   step_skew=[], diagnostics=[Diagnostic("nothing recorded", "info", why)], problems=[],
                   memory_snapshots=[], per_step=perstep.PerStep([], [], np.zeros((0, 0)), np.zeros((0, 0)), []))

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
        """All tables as JSON-safe lists of dicts."""

        def rows(items: Iterable[Any]) -> list[dict[str, Any]]:
            return [dataclasses.asdict(r) for r in items]

        return {
            "name": self.name,
            "files": [str(p) for p in self.files],
            "steps": rows(self.steps),
            "ops": rows(self.ops),
            "ops_by_shape": rows(self.ops_by_shape),
            "kernels": rows(self.kernels),
            "labels": rows(self.labels),
            "ranks": [dict(dataclasses.asdict(r), comm_share=r.comm_share, overlap_share=r.overlap_share) for r in self.ranks],
            "step_skew": rows(self.step_skew),
            "diagnostics": rows(self.diagnostics),
            "problems": [{"path": str(p.path), "reason": p.reason} for p in self.problems],
            "memory_snapshots": [str(p) for p in self.memory_snapshots],
        }

    def to_pandas(self) -> dict[str, pandas.DataFrame]:
        """One DataFrame per table (steps, ops, ops_by_shape, kernels, labels, ranks, step_skew, diagnostics)."""
        import pandas as pd

        tables = {"steps": StepStats, "ops": OpStats, "ops_by_shape": OpStats, "kernels": KernelStats,
                  "labels": LabelStats, "ranks": RankStats, "step_skew": StepSkew, "diagnostics": Diagnostic}
        data = self.to_dict()
        return {key: pd.DataFrame(data[key], columns=[f.name for f in dataclasses.fields(row)] if not data[key] else None)
                for key, row in tables.items()}

    def to_html(self, path: str | Path, top: int = 20, sort: str = "cuda") -> Path:
        """Write a self-contained HTML report (inline SVG plots and timelines, no scripts, no network): the tables of
        `render(top, sort)`."""
        _check_report_options(top, sort)
        return html.write_html({self.name: self}, Path(path), top=top, sort=sort)

    def export_stacks(self, path: str | Path, metric: str = "self_cpu") -> Path:
        """Write flamegraph folded stacks (`self_cpu` or `self_cuda` microseconds) to `path`."""
        folded = stacks.folded(self._stacks, metric)
        if not any(s.has_python for s in self._stacks):
            log.warning("no Python stacks in the traces (profile with with_stack=True): "
                        "the folded stacks show operator nesting only")
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


def _analyze(trace: TraceFile) -> _FileResult:
    tl = build(trace)
    host = tl.host
    tree = nest(host.thread, host.start, host.end, host.name)
    costs = ops.host_costs(tl, tree)
    times = steps.step_times(tl, trace.rank)
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
        evidence=diagnostics.gather(tl, times.windows),
        stack=stacks.StackSource(
            names=tl.names, name=host.name, parent=tree.parent, depth=tree.depth, keep=tree.keep,
            self_cpu_us=costs.self_cpu, kernel_name=tl.device.name, kernel_launcher=launcher,
            kernel_us=(tl.device.end - tl.device.start) / 1000.0, has_python=bool((host.kind == PYTHON).any()),
        ),
        per_step=perstep.from_timeline(tl, tree, costs, times),
    )


def _with_progress(paths: list[Path], progress: bool, desc: str) -> Iterator[Path]:
    if not progress:
        yield from paths
        return
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm ships with lightning; fall back to a counter on stderr
        for i, p in enumerate(paths, 1):
            print(f"\r{desc}: {i}/{len(paths)} {p.name}", end="", file=sys.stderr, flush=True)
            yield p
        print(file=sys.stderr)
        return
    yield from tqdm(paths, desc=desc, unit="file", file=sys.stderr)


def summarize_contents(name: str, found: layout.RunContents, progress: bool = False) -> Summary:
    """One Summary of the files ``found`` lists, for a caller that listed (and vetted) a run folder itself."""
    problems = [Problem(p, f"skipped, still being written (*{layout.PARTIAL})") for p in found.partial]
    results: list[_FileResult] = []
    files: list[Path] = []
    for path in _with_progress(found.traces, progress, f"summarizing {name}"):
        try:
            results.append(_analyze(read_trace(path)))
        except TraceError as exc:
            problems.append(Problem(path, str(exc)))
            continue
        except Exception as exc:  # a file no check foresaw: it is a problem of that file, never of the whole run
            log.debug("analyzing %s failed", path, exc_info=True)
            problems.append(Problem(path, f"could not be analyzed ({type(exc).__name__}: {exc}); please report it"))
            continue
        files.append(path)
    for problem in problems:
        log.warning("%s", problem)
    if not results:
        raise ValueError(f"nothing readable in {name}: " + ("; ".join(map(str, problems)) or "no trace files"))

    workers: dict[tuple, ranks.Worker] = {}
    for r in results:
        key = ("rank", r.rank) if r.rank is not None else ("worker", r.worker)
        workers.setdefault(key, ranks.Worker(r.rank, r.worker, [])).times.append(r.times)
    ordered = sorted(workers.values(), key=lambda w: (w.rank is None, w.rank or 0, w.worker))
    step_rows = [row for w in ordered for t in w.times for row in t.rows]
    evidence = diagnostics.Evidence()
    for r in results:
        evidence.add(r.evidence)
    rank_rows = ranks.rank_stats(ordered)
    skew = ranks.step_skew(ordered)
    per_step = perstep.merge([r.per_step for r in results])
    series = read_series(files[0].parent)
    found_all = diagnostics.diagnose(step_rows, rank_rows, skew, evidence, per_step)
    ends: dict[str, list[int]] = {}
    for r in results:
        ends.setdefault(r.worker, []).extend(s.step for s in r.times.rows[-1:])
    found_all += trends.findings(series, found.snapshots, evidence.matmul_flops, sum(s.wall_us for s in step_rows),
                                 len(step_rows), ends)
    return Summary(
        name=name,
        files=files,
        steps=step_rows,
        ops=ops.op_rows(r.ops for r in results),
        ops_by_shape=ops.op_rows(r.ops_by_shape for r in results),
        kernels=ops.kernel_rows(r.kernels for r in results),
        labels=ops.label_rows((r.labels for r in results), sum(s.wall_us for s in step_rows),
                              set().union(*(r.label_nesting for r in results))),
        ranks=rank_rows,
        step_skew=skew,
        diagnostics=sorted(found_all, key=lambda d: d.severity != "warning"),
        problems=problems,
        memory_snapshots=found.snapshots,
        per_step=per_step,
        series=series,
        _stacks=[r.stack for r in results],
    )


def summarize(path: str | Path, *, progress: bool = False) -> Summary | dict[str, Summary]:
    """Summarize torch.profiler traces on disk.

    `path` is a trace file, a run folder (trace files directly inside: one Summary, with a
    row per rank when several processes wrote traces), or a logdir whose subfolders are
    runs (a dict run name -> Summary). Unreadable files become lines in `Summary.problems`;
    a missing path raises FileNotFoundError, and nothing readable at all raises ValueError.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a trace file, run folder or logdir (str or Path), got {type(path).__name__}")
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"no such trace file or folder: {root}")
    if root.is_file():
        found = layout.RunContents([root], [], layout.contents(root.parent).snapshots, None)
        return summarize_contents(root.name, found, progress)
    runs = {} if layout.contents(root).is_run else layout.find_runs(root)
    if not runs:  # a run folder; without *.pt.trace.json files, any *.json[.gz] (export_chrome_trace names)
        found = layout.contents(root, any_json=True)
        if not found.is_run:
            raise ValueError(f"no trace files ({', '.join('*' + s for s in layout.TRACE_SUFFIXES)}) in {root}")
        return summarize_contents(root.resolve().name, found, progress)
    out, failures = {}, []
    for name, folder in runs.items():
        try:
            out[name] = summarize_contents(name, layout.contents(folder), progress)
        except ValueError as exc:
            failures.append(str(exc))
            log.warning("%s", exc)
    if not out:
        raise ValueError("; ".join(failures))
    return out
