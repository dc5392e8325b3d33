"""A self-contained HTML report: inline CSS and SVG plots, no scripts, nothing fetched.

It opens from disk in any browser (or as a CI artifact) without a server or network.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING

from . import fmt
from .report import MEMORY_VIEWER, op_sort, step_columns

if TYPE_CHECKING:
    from .summary import Summary

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:13px}td,th{padding:2px 8px;text-align:right}
td:first-child,th:first-child{text-align:left;max-width:480px;overflow-wrap:anywhere}
tr:nth-child(even){background:#f6f6f6}th{border-bottom:1px solid #999}
.warning{color:#a40}.info{color:#555}.legend span{display:inline-block;margin-right:1em}
.sw{display:inline-block;width:10px;height:10px;margin-right:4px}
"""
_COLORS = ("#4e79a7", "#f28e2b", "#bab0ac", "#59a14f", "#e15759", "#76b7b2", "#edc948")


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _legend(names: Sequence[str]) -> str:
    items = "".join(f'<span><i class="sw" style="background:{_COLORS[i]}"></i>{escape(n)}</span>' for i, n in enumerate(names))
    return f'<div class="legend">{items}</div>'


def _bars(items: Sequence[tuple[str, float]], label: Callable[[float], str], width: int = 900) -> str:
    """Horizontal bar chart, one bar per (name, value)."""
    if not items:
        return ""
    top = max(v for _, v in items) or 1.0
    row, text = 18, 330
    out = [f'<svg width="{width}" height="{row * len(items) + 4}" role="img">']
    for i, (name, value) in enumerate(items):
        y, w = i * row + 2, max(1.0, (width - text - 90) * value / top)
        out.append(f'<text x="0" y="{y + 13}" font-size="12">{escape(name[:48])}</text>'
                   f'<rect x="{text}" y="{y}" width="{w:.1f}" height="{row - 4}" fill="{_COLORS[0]}">'
                   f"<title>{escape(name)}: {escape(label(value))}</title></rect>"
                   f'<text x="{text + w + 4:.1f}" y="{y + 13}" font-size="12">{escape(label(value))}</text>')
    return "".join(out) + "</svg>"


def _stacked(columns: Sequence[tuple[str, Sequence[float]]], labels: Sequence[str], width: int = 900, height: int = 220) -> str:
    """Vertical stacked bars: one bar per label, one colored segment per column (microseconds)."""
    n = len(labels)
    totals = [sum(col[i] for _, col in columns) for i in range(n)]
    top = max(totals, default=0) or 1.0
    left, bottom = 60, 20
    step = (width - left) / max(n, 1)
    out = [f'<svg width="{width}" height="{height + bottom}" role="img">',
           f'<text x="0" y="12" font-size="11">{escape(fmt.duration(top))}</text>',
           f'<line x1="{left - 2}" y1="0" x2="{left - 2}" y2="{height}" stroke="#999"/>']
    for i, name in enumerate(labels):
        y = float(height)
        for c, (col_name, col) in enumerate(columns):
            h = height * col[i] / top
            y -= h
            out.append(f'<rect x="{left + i * step:.1f}" y="{y:.1f}" width="{max(step * 0.8, 1):.1f}" height="{h:.1f}" '
                       f'fill="{_COLORS[c]}"><title>step {escape(name)} {escape(col_name)}: {escape(fmt.duration(col[i]))}</title></rect>')
        if n <= 40 or i % (n // 20 + 1) == 0:
            out.append(f'<text x="{left + i * step:.1f}" y="{height + 14}" font-size="10">{escape(name)}</text>')
    return "".join(out) + "</svg>"


def _steps_section(s: Summary) -> str:
    first = s.steps[0]
    rows = [r for r in s.steps if (r.rank, r.worker) == (first.rank, first.worker)]
    if s.has_gpu:
        columns = [("GPU busy", [r.gpu_busy_us for r in rows]), ("host only", [r.cpu_only_us for r in rows])]
    else:
        columns = [("host ops", [r.cpu_only_us for r in rows])]
    columns.append(("other", [max(r.wall_us - sum(c[i] for _, c in columns), 0.0) for i, r in enumerate(rows)]))
    names = ["all" if r.step < 0 else str(r.step) for r in rows]
    mean_wall = sum(r.wall_us for r in rows) / len(rows)
    breakdown = [(n, sum(c) / len(rows)) for n, c in columns]
    cols = step_columns(s)
    table = _table(["step"] + [c for c, _ in cols], [[n] + [f(r) for _, f in cols] for n, r in zip(names, rows)])
    who = f" (rank {first.rank})" if len(s.ranks) > 1 and first.rank is not None else ""
    return (f"<h2>Step time{who}</h2>{_legend([n for n, _ in columns])}{_stacked(columns, names)}"
            f"<h2>Mean step: {escape(fmt.duration(mean_wall))}</h2>"
            + _bars([(f"{n} ({fmt.share(v / mean_wall if mean_wall else 0)})", v) for n, v in breakdown], fmt.duration)
            + f"<h2>Steps</h2>{table}")


def _ranks_section(s: Summary) -> str:
    rows = [[str(r.rank) if r.rank is not None else r.worker, str(r.steps), fmt.duration(r.step_us), fmt.duration(r.compute_us),
             fmt.duration(r.comm_us), fmt.share(r.overlap_share), fmt.duration(r.exposed_comm_us)] for r in s.ranks]
    compute = [(f"rank {r.rank if r.rank is not None else r.worker} compute", r.compute_us) for r in s.ranks]
    exposed = [(f"rank {r.rank if r.rank is not None else r.worker} exposed comm", r.exposed_comm_us) for r in s.ranks]
    return ("<h2>Ranks (means per step)</h2>"
            + _table(["rank", "steps", "step", "compute", "comm", "overlapped", "exposed comm"], rows)
            + _bars(compute + exposed, fmt.duration))


def _summary_html(s: Summary, top: int) -> str:
    parts = [f"<h1>{escape(s.name)}</h1><p>{len(s.files)} trace file(s): "
             + ", ".join(escape(p.name) for p in s.files[:8]) + (" ..." if len(s.files) > 8 else "") + "</p>"]
    if s.diagnostics:
        parts.append("<h2>Diagnostics</h2><ul>" + "".join(
            f'<li class="{d.severity}">{escape(d.message)}</li>' for d in s.diagnostics) + "</ul>")
    if len(s.ranks) > 1:
        parts.append(_ranks_section(s))
    if s.steps:
        parts.append(_steps_section(s))
    if s.kernels:
        parts.append(f"<h2>Top {min(top, len(s.kernels))} GPU kernels</h2>"
                     + _bars([(k.name, k.total_us) for k in s.kernels[:top]], fmt.duration)
                     + _table(["name", "kind", "count", "total", "mean", "max"],
                              [[k.name, k.kind, str(k.count), fmt.duration(k.total_us), fmt.duration(k.mean_us),
                                fmt.duration(k.max_us)] for k in s.kernels[:top]]))
    if s.ops:
        key, title = op_sort(s, "cuda")
        ops = sorted(s.ops, key=key, reverse=True)[:top]
        parts.append(f"<h2>Top {len(ops)} operators by {title}</h2>"
                     + _bars([(o.name, key(o)) for o in ops], fmt.size if "memory" in title else fmt.duration)
                     + _table(["name", "calls", "self CPU", "CPU total", "self CUDA", "CUDA total", "self CPU mem", "self CUDA mem"],
                              [[o.name, str(o.calls), fmt.duration(o.self_cpu_us), fmt.duration(o.cpu_total_us),
                                fmt.duration(o.self_cuda_us), fmt.duration(o.cuda_total_us), fmt.size(o.self_cpu_memory),
                                fmt.size(o.self_cuda_memory)] for o in ops]))
    if s.labels:
        parts.append("<h2>Labels</h2>" + _table(
            ["label", "count", "total", "mean", "of steps", "GPU time"],
            [[lb.name, str(lb.count), fmt.duration(lb.total_us), fmt.duration(lb.mean_us), fmt.share(lb.step_share),
              fmt.duration(lb.cuda_total_us)] for lb in s.labels[:top]]))
    if s.memory_snapshots:
        parts.append("<h2>Memory snapshots</h2><ul>" + "".join(
            f"<li>{escape(str(p))}: open it at {escape(MEMORY_VIEWER)}</li>" for p in s.memory_snapshots) + "</ul>")
    if s.problems:
        parts.append("<h2>Problems</h2><ul>" + "".join(f'<li class="warning">{escape(p)}</li>' for p in s.problems) + "</ul>")
    return "<section>" + "".join(parts) + "</section>"


def write_html(summaries: dict[str, Summary], path: Path, top: int = 20) -> Path:
    """Write one page holding every run's report."""
    title = "kprof summary: " + ", ".join(summaries)
    body = "".join(_summary_html(s, top) for s in summaries.values())
    path.write_text(f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
                    f"<style>{_CSS}</style></head><body>{body}</body></html>", encoding="utf-8")
    return path
