"""The Summary as compact text tables (what `kprof summary` and `Summary.print()` show)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from statistics import mean
from typing import TYPE_CHECKING

from . import fmt
from .tables import OpStats, StepStats

if TYPE_CHECKING:
    from .summary import Summary

NAME_WIDTH = 55
SHAPES_WIDTH = 50
MEMORY_VIEWER = "https://pytorch.org/memory_viz"


def clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned first column, right-aligned numbers, a rule under the header."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(headers), "  ".join("-" * w for w in widths), *(line(r) for r in rows)])


StepColumn = tuple[str, Callable[[StepStats], str]]


def step_columns(s: Summary) -> list[StepColumn]:
    """Columns of the step table that carry information for this run."""
    cols: list[StepColumn] = [("wall", lambda r: fmt.duration(r.wall_us))]
    if s.has_gpu:
        cols += [("GPU busy", lambda r: fmt.duration(r.gpu_busy_us)),
                 ("GPU idle", lambda r: f"{fmt.duration(r.gpu_idle_us)} ({fmt.share(r.gpu_idle_us / r.wall_us if r.wall_us else 0)})"),
                 ("kernel", lambda r: fmt.duration(r.kernel_us))]
        if any(r.memcpy_us for r in s.steps):
            cols.append(("memcpy", lambda r: fmt.duration(r.memcpy_us)))
        if any(r.memset_us for r in s.steps):
            cols.append(("memset", lambda r: fmt.duration(r.memset_us)))
    if any(r.comm_us for r in s.steps):
        cols.append(("comm", lambda r: fmt.duration(r.comm_us)))
    cols.append(("host-only" if s.has_gpu else "host ops", lambda r: fmt.duration(r.cpu_only_us)))
    if any(r.dataloader_us for r in s.steps):
        cols.append(("data", lambda r: fmt.duration(r.dataloader_us)))
    if any(r.peak_memory for r in s.steps):
        cols.append(("peak mem", lambda r: fmt.size(r.peak_memory)))
    return cols


def _mean_step(rows: list[StepStats]) -> StepStats:
    first = rows[0]
    values = {f: mean(getattr(r, f) for r in rows) for f in StepStats.__dataclass_fields__ if f.endswith("_us")}
    return StepStats(step=-1, rank=first.rank, worker=first.worker, peak_memory=max(r.peak_memory for r in rows), **values)


def _steps(s: Summary, top: int) -> list[str]:
    first = s.steps[0]
    rows = [r for r in s.steps if (r.rank, r.worker) == (first.rank, first.worker)]
    who = "" if len(s.ranks) < 2 else f" (rank {first.rank})" if first.rank is not None else f" ({first.worker})"
    cols = step_columns(s)
    shown = rows if len(rows) <= 2 * top else rows[:top]
    body = [[("all" if r.step < 0 else str(r.step))] + [f(r) for _, f in cols] for r in shown]
    if len(rows) > 1:
        body.append(["mean"] + [f(_mean_step(rows)) for _, f in cols])
    more = f", first {len(shown)} shown" if len(shown) < len(rows) else ""
    return [f"Steps{who}: {len(rows)} profiled{more}", table(["step"] + [c for c, _ in cols], body)]


def _ranks(s: Summary, top: int) -> list[str]:
    body = [[str(r.rank) if r.rank is not None else r.worker, str(r.steps), fmt.duration(r.step_us), fmt.duration(r.compute_us),
             fmt.duration(r.comm_us), fmt.share(r.comm_share), fmt.share(r.overlap_share), fmt.duration(r.exposed_comm_us)]
            for r in s.ranks]
    out = ["Ranks (means per step)", table(["rank", "steps", "step", "compute", "comm", "comm %", "overlapped", "exposed comm"], body)]
    if s.step_skew:
        worst = sorted(s.step_skew, key=lambda k: -k.lag_us)[:top]
        out += ["", "Slowest rank per step (by compute)", table(
            ["step", "slowest rank", "compute", "other ranks", "lag"],
            [[str(k.step), str(k.slowest_rank), fmt.duration(k.slowest_compute_us), fmt.duration(k.median_compute_us),
              fmt.duration(k.lag_us)] for k in sorted(worst, key=lambda k: k.step)])]
    return out


def op_sort(s: Summary, sort: str) -> tuple[Callable[[OpStats], float], str]:
    """Sort key and title for the operator tables."""
    if sort == "cuda" and s.has_gpu:
        return (lambda o: o.self_cuda_us), "self CUDA time"
    if sort == "memory" and any(o.self_cuda_memory for o in s.ops):
        return (lambda o: o.self_cuda_memory), "self CUDA memory"
    if sort == "memory" and any(o.self_cpu_memory for o in s.ops):
        return (lambda o: o.self_cpu_memory), "self CPU memory"
    return (lambda o: o.self_cpu_us), "self CPU time"


def _ops(s: Summary, ops: list[OpStats], top: int, sort: str, shapes: bool) -> list[str]:
    key, title = op_sort(s, sort)
    rows = sorted(ops, key=key, reverse=True)[:top]
    headers = ["name"] + (["input shapes"] if shapes else []) + ["calls", "self CPU", "CPU total"]
    gpu = s.has_gpu
    cpu_mem = any(o.cpu_memory for o in ops)
    cuda_mem = any(o.cuda_memory for o in ops)
    headers += (["self CUDA", "CUDA total"] if gpu else []) + (["self CPU mem"] if cpu_mem else []) + (["self CUDA mem"] if cuda_mem else [])
    body = []
    for o in rows:
        cells = [clip(o.name, NAME_WIDTH)] + ([clip(o.input_shapes, SHAPES_WIDTH)] if shapes else [])
        cells += [str(o.calls), fmt.duration(o.self_cpu_us), fmt.duration(o.cpu_total_us)]
        cells += [fmt.duration(o.self_cuda_us), fmt.duration(o.cuda_total_us)] if gpu else []
        cells += ([fmt.size(o.self_cpu_memory)] if cpu_mem else []) + ([fmt.size(o.self_cuda_memory)] if cuda_mem else [])
        body.append(cells)
    label = "operators by input shape" if shapes else "operators"
    return [f"Top {len(rows)} {label} by {title} ({len(ops)} in all)", table(headers, body)]


def _kernels(s: Summary, top: int) -> list[str]:
    busy = sum(k.total_us for k in s.kernels)
    rows = [[clip(k.name, NAME_WIDTH), k.kind, str(k.count), fmt.duration(k.total_us), fmt.share(k.total_us / busy if busy else 0),
             fmt.duration(k.mean_us), fmt.duration(k.max_us)] for k in s.kernels[:top]]
    return [f"Top {len(rows)} GPU kernels by total time ({len(s.kernels)} in all)",
            table(["name", "kind", "count", "total", "% GPU", "mean", "max"], rows)]


def _labels(s: Summary, top: int) -> list[str]:
    gpu = s.has_gpu
    rows = [[clip(lb.name, NAME_WIDTH), str(lb.count), fmt.duration(lb.total_us), fmt.duration(lb.mean_us), fmt.share(lb.step_share)]
            + ([fmt.duration(lb.cuda_total_us)] if gpu else []) for lb in s.labels[:top]]
    return [f"Labels (record_function ranges, {len(s.labels)} in all)",
            table(["label", "count", "total", "mean", "of steps"] + (["GPU time"] if gpu else []), rows)]


def render(s: Summary, *, top: int, sort: str) -> str:
    """The whole text report."""
    n_workers = len(s.ranks)
    head = f"kprof summary: {s.name}: {len(s.files)} trace file{'s' * (len(s.files) != 1)}"
    head += f", {n_workers} ranks" if n_workers > 1 else ""
    parts: list[list[str]] = [[head, "=" * len(head)]]
    if n_workers > 1:
        parts.append(_ranks(s, top))
    if s.steps:
        parts.append(_steps(s, top))
    if s.ops:
        parts.append(_ops(s, s.ops, top, sort, shapes=False))
    if s.ops_by_shape:
        parts.append(_ops(s, s.ops_by_shape, top, sort, shapes=True))
    if s.kernels:
        parts.append(_kernels(s, top))
    if s.labels:
        parts.append(_labels(s, top))
    if s.diagnostics:
        parts.append(["Diagnostics"] + [("! " if d.severity == "warning" else "- ") + d.message for d in s.diagnostics])
    if s.memory_snapshots:
        parts.append([f"Memory snapshot: {p} (open it at {MEMORY_VIEWER})" for p in s.memory_snapshots])
    if s.problems:
        parts.append(["Problems"] + [f"x {p}" for p in s.problems])
    return "\n\n".join("\n".join(p) for p in parts)
