"""`summarize(path)`: trace files on disk -> `Summary` (tables, findings, exports).

Each file is analyzed alone (``file_analysis``, in this process or in workers: ``reading``); the files of one run are
then added up here, with one entry per rank (or worker) for the multi-rank view, and the run's findings drawn.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from .. import layout
from ..progress import ProgressArg
from . import comm, diagnostics, health, html, machine, ops, perstep, ranks, reading, report, saved, stacks, trends
from . import modules as by_module
from .file_analysis import FileResult, without_last_step
from .memory import MemorySummary, merge_memory
from .memory_findings import memory_findings
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

if TYPE_CHECKING:
    import pandas

log = logging.getLogger(__name__)


class Unreadable(ValueError):
    """No file of a run could be read: the message names each file and why (``problems``)."""

    def __init__(self, message: str, problems: list[Problem]) -> None:
        super().__init__(message)
        self.problems = problems


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
    memory: MemorySummary | None = None  # at each step's memory peak: by kind and module (memory.py)
    _stacks: list[stacks.StackSource] = dataclasses.field(repr=False, default_factory=list)
    # time by module and by source line (kprof.session(model=...), with_stack=True, torch.compile): modules.py
    modules: list[by_module.ModuleStats] = dataclasses.field(default_factory=list)
    lines: list[by_module.LineStats] = dataclasses.field(default_factory=list)
    compiled: dict[str, Any] = dataclasses.field(default_factory=dict)  # graphs, graph breaks, recompiles per step

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
            "modules": rows(self.modules),
            "lines": rows(self.lines),
            "compiled": self.compiled,
            "memory": None if self.memory is None else self.memory.to_dict(),
            "machine": machine.to_dict(self.series),  # what the machine did: a saved side of a diff says it too
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Summary:
        """The Summary `to_dict` wrote (parsed JSON): every table, the findings, the per-step rows and the machine's
        samples; its call stacks and the other scalar series stay with the trace files."""
        saved.check(data)

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
            modules=rows(by_module.ModuleStats, data.get("modules", [])),
            lines=rows(by_module.LineStats, data.get("lines", [])),
            compiled=data.get("compiled", {}),
            memory=MemorySummary.from_dict(data["memory"]) if data.get("memory") else None,
            series=machine.from_dict(data.get("machine", {})),
        )

    def to_pandas(self) -> dict[str, pandas.DataFrame]:
        """One DataFrame per table (steps, ops, ops_by_shape, kernels, labels, ranks, step_skew, comm, fsdp,
        diagnostics, modules, lines; memory, memory_blocks and memory_modules when memory was recorded)."""
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
            "modules": by_module.ModuleStats,
            "lines": by_module.LineStats,
        }
        data = self.to_dict()
        frames = {
            key: pd.DataFrame(data[key], columns=[f.name for f in dataclasses.fields(row)] if not data[key] else None)
            for key, row in tables.items()
        }
        return frames if self.memory is None else {**frames, **self.memory.to_pandas()}

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


def summarize_runs(
    runs: list[tuple[str, layout.RunContents]], *, progress: ProgressArg = False, jobs: int = 1
) -> list[Summary | ValueError]:
    """One Summary per (name, files) pair, in order, all runs' files read together: ``jobs`` worker processes decode
    and analyze them in parallel. A run with nothing readable gives the ValueError that says why."""
    paths = [p for _, found in runs for p in found.traces]
    results = reading.read_files(paths, jobs, progress, f"summarizing {', '.join(n for n, _ in runs)}")
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


def _assemble(name: str, found: layout.RunContents, analyzed: list[FileResult | Problem]) -> Summary:
    """The run's Summary from its files' analyses; ValueError when none could be read."""
    files, results, problems, ended = _readable(name, found, analyzed)
    ordered = ranks.workers_of([(r.rank, r.worker, r.times, r.comm.transfers) for r in results])
    step_rows = [row for w in ordered for t in w.times for row in t.rows]
    evidence = diagnostics.Evidence()
    for r in results:
        evidence.add(r.evidence)
    rank_rows, skew = ranks.rank_stats(ordered), ranks.step_skew(ordered)
    per_step = perstep.merge([r.per_step for r in results])
    series = read_series(files[0].parent)
    comm_rows, fsdp_rows = [c for r in results for c in r.comm.rows], [f for r in results for f in r.comm.fsdp]
    memory = merge_memory([r.memory for r in results], found.snapshots)
    attributed = by_module.assemble([r.modules for r in results if r.modules is not None], step_rows, evidence.has_gpu)
    found_all = health.check([r.health for r in results], ordered)  # the capture's own health first
    found_all += machine.findings(series)  # then the machine's: starved of CPU, a GPU slowed
    found_all += diagnostics.diagnose(step_rows, rank_rows, evidence, per_step, fsdp=bool(fsdp_rows))
    found_all += comm.findings(comm_rows, fsdp_rows, step_rows, evidence.has_gpu) + ranks.findings(rank_rows, skew)
    found_all += ended + memory_findings(memory, series) + _trend_findings(results, step_rows, evidence, series, found)
    wall = sum(s.wall_us for s in step_rows)
    return Summary(
        name=name,
        files=files,
        steps=step_rows,
        ops=ops.op_rows(r.ops for r in results),
        ops_by_shape=ops.op_rows(r.ops_by_shape for r in results),
        kernels=ops.kernel_rows(r.kernels for r in results),
        labels=ops.label_rows((r.labels for r in results), wall, set().union(*(r.label_nesting for r in results))),
        ranks=rank_rows,
        step_skew=skew,
        diagnostics=sorted(found_all, key=lambda d: d.severity != "warning"),
        problems=problems,
        memory_snapshots=found.snapshots,
        per_step=per_step,
        series=series,
        comm=comm_rows,
        fsdp=fsdp_rows,
        memory=memory,
        _stacks=[r.stack for r in results],
        modules=attributed.modules,
        lines=attributed.lines,
        compiled=attributed.compiled,
    )


def _readable(
    name: str, found: layout.RunContents, analyzed: list[FileResult | Problem]
) -> tuple[list[Path], list[FileResult], list[Problem], list[Diagnostic]]:
    """The files that could be read and their analyses (a rank that ended early less its cut step), the problems of
    the others (each logged), and the findings of the ranks that ended early; Unreadable when no file could be."""
    problems = [Problem(p, f"skipped, still being written (*{layout.PARTIAL})") for p in found.partial]
    problems += [r for r in analyzed if isinstance(r, Problem)]
    results = [r for r in analyzed if not isinstance(r, Problem)]
    files = [p for p, r in zip(found.traces, analyzed) if not isinstance(r, Problem)]
    cut, ended = ranks.ended_early([(r.rank, r.times) for r in results])
    results = [without_last_step(r) if i in cut else r for i, r in enumerate(results)]
    for problem in problems:
        log.warning("%s", problem)
    if not results:
        why = "; ".join(map(str, problems)) or "no trace files"
        raise Unreadable(f"nothing readable in {name}: {why}", problems)
    return files, results, problems, ended


def _trend_findings(
    results: list[FileResult],
    step_rows: list[StepStats],
    evidence: diagnostics.Evidence,
    series: dict[str, dict[str, Series]],
    found: layout.RunContents,
) -> list[Diagnostic]:
    """The findings of the per-step scalars (kprof's cost, MFU, memory growth) beside the profiled steps."""
    ends: dict[str, list[int]] = {}
    for r in results:
        ends.setdefault(r.worker, []).extend(s.step for s in r.times.rows[-1:])
    gpus = list(evidence.gpus)
    wall = sum(s.wall_us for s in step_rows)
    device = gpus[0] if len(gpus) == 1 else ""
    return trends.findings(series, found.snapshots, evidence.matmul_flops, wall, len(step_rows), ends, device)


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
        return read_saved(Path(path))
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


def read_saved(path: Path) -> Summary | dict[str, Summary]:
    """The Summary saved in ``path``, or a dict run name -> Summary for a file of several runs (a logdir's)."""
    try:
        raw = path.read_bytes()
        data = json.loads(raw.decode(saved.encoding(raw)))
        if saved.FORMAT_KEY in data:
            return Summary.from_dict(data)
        return {name: Summary.from_dict(run) for name, run in data.items()}
    except (OSError, ValueError, AttributeError, IndexError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: cannot read this saved kprof summary ({type(exc).__name__}: {exc})") from None
