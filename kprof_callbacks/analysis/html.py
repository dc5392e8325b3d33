"""A self-contained HTML report: inline CSS and SVG plots, no scripts, nothing fetched.

It opens from disk in any browser (or as a CI artifact) without a server or network.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING

from . import fmt
from .report import MEMORY_VIEWER, first_worker_steps, op_sort, rank_label, tables

if TYPE_CHECKING:
    from .summary import Summary

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}h3{font-size:1em}
table{border-collapse:collapse;font-size:13px}td,th{padding:2px 8px;text-align:right}
td:first-child,th:first-child{text-align:left;max-width:480px;overflow-wrap:anywhere}
tr:nth-child(even){background:#f6f6f6}th{border-bottom:1px solid #999}
.warning{color:#a40}.info{color:#555}.legend span{display:inline-block;margin-right:1em}
.sw{display:inline-block;width:10px;height:10px;margin-right:4px}
"""
_NAME_WIDTH = 300  # the page wraps long kernel names; the terminal clips them
_COLORS = ("#4e79a7", "#f28e2b", "#bab0ac", "#59a14f", "#e15759", "#76b7b2", "#edc948")


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
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


def _steps_chart(s: Summary) -> str:
    """Stacked bar per step (first rank) and the mean step's breakdown: disjoint parts of the wall time."""
    rows = first_worker_steps(s)
    if s.has_gpu:
        columns = [("GPU busy", [r.gpu_busy_us for r in rows]), ("host only", [r.cpu_only_us for r in rows])]
    else:
        columns = [("host ops", [r.cpu_only_us for r in rows])]
    columns.append(("other", [max(r.wall_us - sum(c[i] for _, c in columns), 0.0) for i, r in enumerate(rows)]))
    mean_wall = sum(r.wall_us for r in rows) / len(rows)
    breakdown = [(f"{n} ({fmt.share(sum(c) / len(rows) / mean_wall if mean_wall else 0)})", sum(c) / len(rows)) for n, c in columns]
    return (_legend([n for n, _ in columns]) + _stacked(columns, ["all" if r.step < 0 else str(r.step) for r in rows])
            + f"<h3>Mean step: {escape(fmt.duration(mean_wall))}</h3>" + _bars(breakdown, fmt.duration))


def _chart(s: Summary, key: str, top: int) -> str:
    """The plot drawn above a table, if it has one."""
    if key == "steps":
        return _steps_chart(s)
    if key == "ranks":
        items = [(f"{rank_label(r.rank, r.worker)} compute", r.compute_us) for r in s.ranks]
        items += [(f"{rank_label(r.rank, r.worker)} exposed comm", r.exposed_comm_us) for r in s.ranks]
        return _bars(items, fmt.duration)
    if key == "kernels":
        return _bars([(k.name, k.total_us) for k in s.kernels[:top]], fmt.duration)
    if key == "ops":
        sort_key, title = op_sort(s, "cuda")
        return _bars([(o.name, sort_key(o)) for o in sorted(s.ops, key=sort_key, reverse=True)[:top]],
                     fmt.size if "memory" in title else fmt.duration)
    return ""


def _summary_html(s: Summary, top: int) -> str:
    names = ", ".join(escape(p.name) for p in s.files[:8]) + (" ..." if len(s.files) > 8 else "")
    parts = [f"<h1>{escape(s.name)}</h1><p>{len(s.files)} trace file(s): {names}</p>"]
    if s.diagnostics:
        parts.append("<h2>Diagnostics</h2><ul>" + "".join(
            f'<li class="{d.severity}">{escape(d.message)}</li>' for d in s.diagnostics) + "</ul>")
    for t in tables(s, top, "cuda", width=_NAME_WIDTH):
        parts.append(f"<h2>{escape(t.title)}</h2>{_chart(s, t.key, top)}{table(t.headers, t.rows)}")
    if s.memory_snapshots:
        parts.append("<h2>Memory snapshots</h2><ul>" + "".join(
            f"<li>{escape(str(p))}: open it at {escape(MEMORY_VIEWER)}</li>" for p in s.memory_snapshots) + "</ul>")
    if s.problems:
        parts.append("<h2>Problems</h2><ul>" + "".join(f'<li class="warning">{escape(str(p))}</li>' for p in s.problems) + "</ul>")
    return "<section>" + "".join(parts) + "</section>"


def write_html(summaries: dict[str, Summary], path: Path, top: int = 20) -> Path:
    """Write one page holding every run's report."""
    title = "kprof summary: " + ", ".join(summaries)
    body = "".join(_summary_html(s, top) for s in summaries.values())
    path.write_text(page(title, body), encoding="utf-8")
    return path


def page(title: str, body: str) -> str:
    """A whole HTML document around `body`, with the report's inline style."""
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f"<style>{_CSS}</style></head><body>{body}</body></html>")
