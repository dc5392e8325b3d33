"""The Summary as tables of strings (shared by the text and HTML reports) and as text.

Only columns that carry information for the run are shown: no GPU columns for a CPU-only
profile, no memory columns unless memory was recorded, and so on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from statistics import mean
from typing import TYPE_CHECKING

from . import breakdown, comm, fmt, health, memory_report, modules_report
from .fmt import clip
from .report_table import Table, markdown_table, md_text, text_table
from .tables import OpStats, StepStats

if TYPE_CHECKING:
    from .summary import Summary

NAME_WIDTH = 55
SHAPES_WIDTH = 50
CONTAINS_WIDTH = 40
MEMORY_VIEWER = "https://pytorch.org/memory_viz"


def first_worker_steps(s: Summary) -> list[StepStats]:
    """The steps of the first rank (or worker): the per-step views show one process."""
    first = s.steps[0]
    return [r for r in s.steps if (r.rank, r.worker) == (first.rank, first.worker)]


def rank_label(rank: int | None, worker: str) -> str:
    """`rank 3`, or the worker name of a process that is not a distributed rank."""
    return f"rank {rank}" if rank is not None else worker


def _idle(r: StepStats) -> str:
    return f"{fmt.duration(r.gpu_idle_us)} ({fmt.share(r.gpu_idle_us / r.wall_us if r.wall_us else 0)})"


def _step_columns(s: Summary) -> list[tuple[str, Callable[[StepStats], str]]]:
    """The per-step figures that carry information for this run, named as every report names them."""
    gpu = s.has_gpu
    shown = {
        "wall_us": True,
        "gpu_busy_us": gpu,
        "gpu_idle_us": gpu,
        "kernel_us": gpu,
        "memcpy_us": gpu and any(r.memcpy_us for r in s.steps),
        "memset_us": gpu and any(r.memset_us for r in s.steps),
        "comm_us": any(r.comm_us for r in s.steps),
        "cpu_only_us": True,
        "other_us": True,
        "dataloader_us": any(r.dataloader_us for r in s.steps),
        "peak_memory": any(r.peak_memory for r in s.steps),
    }
    cell = {
        "gpu_idle_us": _idle,
        "other_us": lambda r: fmt.duration(breakdown.other_us(r)),
        "peak_memory": lambda r: fmt.size(r.peak_memory),
    }
    return [
        (breakdown.COLUMNS[key], cell.get(key, lambda r, key=key: fmt.duration(getattr(r, key))))
        for key, show in shown.items()
        if show
    ]


def _mean_step(rows: list[StepStats]) -> StepStats:
    values = {
        f.name: mean(getattr(r, f.name) for r in rows) for f in dataclasses.fields(StepStats) if f.name.endswith("_us")
    }
    return dataclasses.replace(rows[0], peak_memory=max(r.peak_memory for r in rows), **values)


def steps_table(s: Summary, top: int) -> Table:
    """Per-step breakdown of the first rank; at most 2 x `top` steps, then a mean row."""
    rows = first_worker_steps(s)
    who = "" if len(s.ranks) < 2 else f" ({rank_label(rows[0].rank, rows[0].worker)})"
    cols = _step_columns(s)
    shown = rows if len(rows) <= 2 * top else rows[:top]
    body = [["all" if r.step < 0 else str(r.step)] + [f(r) for _, f in cols] for r in shown]
    if len(rows) > 1:
        body.append(["mean"] + [f(_mean_step(rows)) for _, f in cols])
    more = f", first {len(shown)} shown" if len(shown) < len(rows) else ""
    return Table("steps", f"Steps{who}: {len(rows)} profiled{more}", ["step"] + [c for c, _ in cols], body)


def ranks_table(s: Summary) -> Table:
    """Per rank: means per step of compute and communication (and, on GPUs, of host work while the GPU is idle);
    where ranks share collectives, how long each waited for the last to arrive and the others for it (and its host
    clock's offset, when ranks span hosts)."""
    host_only = any(r.host_only_us for r in s.ranks)
    arrivals = any(r.collectives for r in s.ranks)
    hosts = any(r.clock_offset_us for r in s.ranks)
    return Table(
        "ranks",
        "Ranks (means per step)",
        ["rank", "steps", "step", "compute", "comm", "comm %", "overlapped", "exposed comm"]
        + (["host only"] if host_only else [])
        + (["waits for others", "others wait for it"] if arrivals else [])
        + (["clock offset"] if hosts else []),
        [
            [
                str(r.rank) if r.rank is not None else r.worker,
                str(r.steps),
                fmt.duration(r.step_us),
                fmt.duration(r.compute_us),
                fmt.duration(r.comm_us),
                fmt.share(r.comm_share),
                fmt.share(r.overlap_share),
                fmt.duration(r.exposed_comm_us),
            ]
            + ([fmt.duration(r.host_only_us)] if host_only else [])
            + ([fmt.duration(r.waited_us), fmt.duration(r.late_us)] if arrivals else [])
            + ([fmt.duration(r.clock_offset_us)] if hosts else [])
            for r in s.ranks
        ],
    )


def skew_table(s: Summary, top: int) -> Table:
    """The `top` steps with the largest lag of the slowest rank, in step order."""
    worst = sorted(sorted(s.step_skew, key=lambda k: -k.lag_us)[:top], key=lambda k: k.step)
    return Table(
        "step_skew",
        "Slowest rank per step (by compute)",
        ["step", "slowest rank", "compute", "other ranks", "lag"],
        [
            [
                str(k.step),
                str(k.slowest_rank),
                fmt.duration(k.slowest_compute_us),
                fmt.duration(k.median_compute_us),
                fmt.duration(k.lag_us),
            ]
            for k in worst
        ],
    )


def comm_table(s: Summary) -> Table:
    """Each collective (by process group, where the traces name them, and FSDP phase): means per step and rank, and
    the rank that waited for it longest."""
    step = mean(r.wall_us for r in s.steps)
    phases = any(r.phase for r in s.comm)
    groups = len({r.group for r in s.comm}) > 1 or any(r.group_size for r in s.comm)
    return Table(
        "comm",
        "Communication by collective (means per step and rank; exposed: no computation ran)",
        ["collective"]
        + (["group"] if groups else [])
        + (["phase"] if phases else [])
        + ["calls", "time", "overlapped", "exposed", "of step", "most exposed"],
        [
            [t.collective]
            + ([t.group or "-"] if groups else [])
            + ([t.phase or "-"] if phases else [])
            + [
                f"{t.calls:.1f}",
                fmt.duration(t.total_us),
                fmt.duration(t.overlap_us),
                fmt.duration(t.exposed_us),
                fmt.share(t.exposed_us / step if step else 0),
                f"{fmt.duration(t.worst_exposed_us)} (rank {t.worst_rank})" if t.ranks > 1 else "-",
            ]
            for t in comm.totals(s.comm, s.steps)
        ],
    )


def op_sort(s: Summary, sort: str) -> tuple[Callable[[OpStats], float], str]:
    """Sort key and its description for the operator tables (falls back to self CPU time)."""
    if sort == "cuda" and s.has_gpu:
        return (lambda o: o.self_cuda_us), "self CUDA time"
    if sort == "memory" and any(o.self_cuda_memory for o in s.ops):
        return (lambda o: o.self_cuda_memory), "self CUDA memory"
    if sort == "memory" and any(o.self_cpu_memory for o in s.ops):
        return (lambda o: o.self_cpu_memory), "self CPU memory"
    if sort == "memory":
        return (lambda o: o.self_cpu_us), "self CPU time (no memory recorded: profile with profile_memory=True)"
    return (lambda o: o.self_cpu_us), "self CPU time"


def ops_table(s: Summary, top: int, sort: str, *, by_shape: bool, width: int = NAME_WIDTH) -> Table:
    ops = s.ops_by_shape if by_shape else s.ops
    key, title = op_sort(s, sort)
    rows = sorted(ops, key=key, reverse=True)[:top]
    gpu = s.has_gpu
    cpu_mem, cuda_mem = any(o.cpu_memory for o in ops), any(o.cuda_memory for o in ops)
    headers = ["name"] + (["input shapes"] if by_shape else []) + ["calls", "self CPU", "CPU total"]
    headers += (
        (["self CUDA", "CUDA total"] if gpu else [])
        + (["self CPU mem"] if cpu_mem else [])
        + (["self CUDA mem"] if cuda_mem else [])
    )
    body = []
    for o in rows:
        cells = [clip(o.name, width)] + ([clip(o.input_shapes, SHAPES_WIDTH)] if by_shape else [])
        cells += [str(o.calls), fmt.duration(o.self_cpu_us), fmt.duration(o.cpu_total_us)]
        cells += [fmt.duration(o.self_cuda_us), fmt.duration(o.cuda_total_us)] if gpu else []
        cells += ([fmt.size(o.self_cpu_memory)] if cpu_mem else []) + (
            [fmt.size(o.self_cuda_memory)] if cuda_mem else []
        )
        body.append(cells)
    what = "operators by input shape" if by_shape else "operators"
    return Table(
        "ops_by_shape" if by_shape else "ops", f"Top {len(rows)} {what} by {title} ({len(ops)} in all)", headers, body
    )


def kernels_table(s: Summary, top: int, width: int = NAME_WIDTH) -> Table:
    busy = sum(k.total_us for k in s.kernels)
    return Table(
        "kernels",
        f"Top {min(top, len(s.kernels))} GPU kernels by total time ({len(s.kernels)} in all)",
        ["name", "kind", "count", "total", "% GPU", "mean", "max"],
        [
            [
                clip(k.name, width),
                k.kind,
                str(k.count),
                fmt.duration(k.total_us),
                fmt.share(k.total_us / busy if busy else 0),
                fmt.duration(k.mean_us),
                fmt.duration(k.max_us),
            ]
            for k in s.kernels[:top]
        ],
    )


def labels_table(s: Summary, top: int, width: int = NAME_WIDTH) -> Table:
    """Labels by total time; a label that holds others (Lightning's `Optimizer.step#...` holds forward and backward)
    names them, since its time includes theirs."""
    gpu = s.has_gpu
    nested = any(lb.contains for lb in s.labels)
    title = f"Labels (record_function ranges, {len(s.labels)} in all)"
    if nested:
        title += "; a label's time includes the labels it contains"
    return Table(
        "labels",
        title,
        ["label", "count", "total", "mean", "of steps"]
        + (["GPU time"] if gpu else [])
        + (["contains"] if nested else []),
        [
            [
                clip(lb.name, width),
                str(lb.count),
                fmt.duration(lb.total_us),
                fmt.duration(lb.mean_us),
                fmt.share(lb.step_share),
            ]
            + ([fmt.duration(lb.cuda_total_us)] if gpu else [])
            + ([clip(", ".join(lb.contains), CONTAINS_WIDTH)] if nested else [])
            for lb in s.labels[:top]
        ],
    )


def tables(s: Summary, top: int, sort: str, width: int = NAME_WIDTH) -> list[Table]:
    """Every table that has rows, in report order; names clipped to `width` characters."""
    out = []
    if len(s.ranks) > 1:
        out.append(ranks_table(s))
        if s.step_skew:
            out.append(skew_table(s, top))
    if s.comm:
        out.append(comm_table(s))
    if s.steps:
        out.append(steps_table(s, top))
    if s.ops:
        out.append(ops_table(s, top, sort, by_shape=False, width=width))
    if s.ops_by_shape:
        out.append(ops_table(s, top, sort, by_shape=True, width=width))
    if s.kernels:
        out.append(kernels_table(s, top, width))
    if s.labels:
        out.append(labels_table(s, top, width))
    return out + modules_report.tables(s, top, width) + memory_report.tables(s.memory, top, width)


_NAMED = {  # tables whose first cells are names
    "ops": (0,),
    "ops_by_shape": (0, 1),
    "kernels": (0,),
    "labels": (0,),
    "modules": (0,),
    "lines": (0,),
    "compiled": (0,),
    "memory_modules": (0,),
}


def markdown(s: Summary, *, top: int, sort: str) -> str:
    """The report as GitHub-flavoured Markdown: a heading, the findings, each table under its title."""
    parts = [f"### kprof summary: {md_text(s.name)}", f"{len(s.files)} trace file{'s' * (len(s.files) != 1)}"]
    capture, found = health.split(s.diagnostics)
    if capture:
        parts.append("\n".join(f"- **{md_text(d.message)}**" for d in capture))
    if found:
        parts.append(
            "\n".join(f"- {'**warning**: ' if d.severity == 'warning' else ''}{md_text(d.message)}" for d in found)
        )
    parts += [
        f"**{md_text(t.title)}**\n\n{markdown_table(t.headers, t.rows, _NAMED.get(t.key, ()))}"
        for t in tables(s, top, sort)
    ]
    if s.problems:
        parts.append("\n".join(f"- could not read {md_text(str(p))}" for p in s.problems))
    return "\n\n".join(parts)


def render(s: Summary, *, top: int, sort: str) -> str:
    """The whole text report."""
    head = f"kprof summary: {s.name}: {len(s.files)} trace file{'s' * (len(s.files) != 1)}"
    if len(s.ranks) > 1:
        head += f", {len(s.ranks)} {'ranks' if all(r.rank is not None for r in s.ranks) else 'processes'}"
    parts = [f"{head}\n{'=' * len(head)}"]
    capture, found = health.split(s.diagnostics)
    if capture:  # the capture's own health, before anything drawn from it
        parts.append("\n".join(f"! {d.message}" for d in capture))
    parts += [f"{t.title}\n{text_table(t.headers, t.rows)}" for t in tables(s, top, sort)]
    if found:
        parts.append("\n".join(["Findings"] + [("! " if d.severity == "warning" else "- ") + d.message for d in found]))
    if s.memory_snapshots:
        parts.append("\n".join(f"Memory snapshot: {p} (open it at {MEMORY_VIEWER})" for p in s.memory_snapshots))
    if s.problems:
        parts.append("\n".join(["Problems"] + [f"x {p}" for p in s.problems]))
    return "\n\n".join(parts)
