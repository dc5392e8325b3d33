"""A self-contained HTML report: inline CSS and SVG plots, no scripts, nothing fetched.

It opens from disk in any browser (or as a CI artifact) without a server or network; its body, with the style
scoped to it (`fragment`), is what a notebook shows for a Summary, Diff or Comparison. It holds the tables the
terminal prints (the same `top` and `sort`), their plots, and the timeline of the median and the slowest profiled
step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING

from . import breakdown, fmt, health, memory_report, svgtimeline
from .ranktimeline import COLLAPSE_RANKS, RunSlices
from .reader import TraceError
from .report import MEMORY_VIEWER, first_worker_steps, op_sort, rank_label, tables
from .slices import find_steps, median_step

if TYPE_CHECKING:
    from .summary import Summary
    from .tables import StepStats

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}h3{font-size:1em}
table{border-collapse:collapse;font-size:13px}td,th{padding:2px 8px;text-align:right}
td:first-child,th:first-child{text-align:left;max-width:480px;overflow-wrap:anywhere}
tr:nth-child(even){background:#f6f6f6}th{border-bottom:1px solid #999}
.warning{color:#a40}.info{color:#555}.legend span{display:inline-block;margin-right:1em}
.sw{display:inline-block;width:10px;height:10px;margin-right:4px}
figure{margin:1em 0}figcaption{font-size:13px;color:#555;margin-bottom:4px}
"""
_NAME_WIDTH = 300  # the page wraps long kernel names; the terminal clips them
_SCOPE = "kprof"  # the class of a fragment's div, which its style is limited to
_BAR = breakdown.PARTS[0].color


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _legend(items: Sequence[tuple[str, str, str]]) -> str:
    """Colour swatches with a name each, and what the name means as its tooltip: (name, colour, meaning)."""
    spans = "".join(
        f'<span title="{escape(meaning)}"><i class="sw" style="background:{color}"></i>{escape(name)}</span>'
        for name, color, meaning in items
    )
    return f'<div class="legend">{spans}</div>'


def _bars(
    items: Sequence[tuple[str, float]], label: Callable[[float], str], width: int = 900, colors: Sequence[str] = ()
) -> str:
    """Horizontal bar chart, one bar per (name, value), in `colors` (one per bar) or all in one."""
    if not items:
        return ""
    top = max(v for _, v in items) or 1.0
    row, text = 18, 330
    out = [f'<svg width="{width}" height="{row * len(items) + 4}" role="img">']
    for i, (name, value) in enumerate(items):
        y, w = i * row + 2, max(1.0, (width - text - 90) * value / top)
        out.append(
            f'<text x="0" y="{y + 13}" font-size="12">{escape(name[:48])}</text>'
            f'<rect x="{text}" y="{y}" width="{w:.1f}" height="{row - 4}" '
            f'fill="{colors[i] if colors else _BAR}">'
            f"<title>{escape(name)}: {escape(label(value))}</title></rect>"
            f'<text x="{text + w + 4:.1f}" y="{y + 13}" font-size="12">{escape(label(value))}</text>'
        )
    return "".join(out) + "</svg>"


def _stacked(parts: Sequence[breakdown.Part], rows: Sequence[StepStats], width: int = 900, height: int = 220) -> str:
    """Vertical stacked bars: one bar per step, one segment per part of its wall time (microseconds)."""
    n = len(rows)
    columns = [[breakdown.value(p, r) for r in rows] for p in parts]
    top = max((r.wall_us for r in rows), default=0) or 1.0
    left, bottom = 60, 20
    step = (width - left) / max(n, 1)
    out = [
        f'<svg width="{width}" height="{height + bottom}" role="img">',
        f'<text x="0" y="12" font-size="11">{escape(fmt.duration(top))}</text>',
        f'<line x1="{left - 2}" y1="0" x2="{left - 2}" y2="{height}" stroke="#999"/>',
    ]
    for i, r in enumerate(rows):
        name = "all" if r.step < 0 else str(r.step)
        y = float(height)
        for part, col in zip(parts, columns):
            h = height * col[i] / top
            y -= h
            out.append(
                f'<rect x="{left + i * step:.1f}" y="{y:.1f}" width="{max(step * 0.8, 1):.1f}" height="{h:.1f}" '
                f'fill="{part.color}"><title>step {escape(name)} {escape(part.name)}: '
                f"{escape(fmt.duration(col[i]))}</title></rect>"
            )
        if n <= 40 or i % (n // 20 + 1) == 0:
            out.append(f'<text x="{left + i * step:.1f}" y="{height + 14}" font-size="10">{escape(name)}</text>')
    return "".join(out) + "</svg>"


def _steps_chart(s: Summary) -> str:
    """Stacked bar per step (first rank) and the mean step's breakdown: disjoint parts of the wall time."""
    rows = first_worker_steps(s)
    parts = breakdown.PARTS if s.has_gpu else breakdown.PARTS[1:]
    means = [sum(breakdown.value(p, r) for r in rows) / len(rows) for p in parts]
    mean_wall = sum(r.wall_us for r in rows) / len(rows)
    bars = [(f"{p.name} ({fmt.share(m / mean_wall if mean_wall else 0)})", m) for p, m in zip(parts, means)]
    return (
        _legend([(p.name, p.color, p.meaning) for p in parts])
        + _stacked(parts, rows)
        + f"<h3>Mean step: {escape(fmt.duration(mean_wall))}</h3>"
        + _bars(bars, fmt.duration, colors=[p.color for p in parts])
    )


def _timelines(s: Summary) -> str:
    """The median and the slowest profiled step of the first rank, as SVG timelines."""
    rows = first_worker_steps(s)
    middle = median_step([(r.step, r.wall_us) for r in rows])
    slowest = max(rows, key=lambda r: r.wall_us).step
    if slowest != middle:
        wanted = {middle: "median", slowest: "slowest"}
    else:
        wanted = {middle: "only" if len(rows) == 1 else "median and slowest"}
    try:
        found = find_steps(s.files, rows[0].worker, list(wanted))
    except (TraceError, OSError) as exc:
        return f'<p class="warning">No timeline: {escape(str(exc))}</p>'
    wall = {r.step: r.wall_us for r in rows}
    figures = [
        svgtimeline.render(
            found[n], f"{which} step: " + ("the whole trace" if n < 0 else f"step {n}") + f", {fmt.duration(wall[n])}"
        )
        for n, which in wanted.items()
        if n in found
    ]
    kinds = sorted({svgtimeline.KINDS[k] for n in found for k in found[n].kind.tolist()}, key=svgtimeline.KINDS.index)
    legend = _legend([(k, breakdown.KIND_COLORS[k], k) for k in kinds])
    return (
        legend + "".join(figures) + '<p class="info">Hover an event for its name, duration, input shapes and '
        "Python frames; hover a kernel for the call that launched it. The kprof TensorBoard tab zooms into any "
        "step.</p>"
    )


def _ranks_timeline(s: Summary) -> str:
    """The median step of every rank on rank 0's clock: the timeline of all ranks (one busy row per rank beyond
    COLLAPSE_RANKS ranks)."""
    try:
        run = RunSlices(s.files)
        step = run.step(run.default_step(), skew=s.step_skew)
    except (TraceError, OSError, KeyError, ValueError) as exc:
        return f'<p class="warning">No timeline of the ranks: {escape(str(exc))}</p>'
    collapsed = len(step.ranks) > COLLAPSE_RANKS
    shown = step.collapsed() if collapsed else step
    hosts = {r.host for r in step.ranks}
    caption = (
        f"step {step.step} of {len(step.ranks)} ranks, on rank 0's clock"
        + (f" ({len(hosts)} hosts, their clocks aligned)" if len(hosts) > 1 else "")
        + ("; one row per rank: busy, and its collectives" if collapsed else "")
    )
    marks = []
    if step.straggler:
        marks.append(
            f"straggler: rank {step.straggler[0]}, the slowest to compute in this step "
            f"(+{fmt.duration(step.straggler[1])} on the others' median)"
        )
    if step.late:
        marks.append(f"waited for: rank {step.late[0]}, the others waited {fmt.duration(step.late[1] / 1000)} for it")
    return (
        svgtimeline.render(shown.piece, caption, svgtimeline.ranks_overlay(shown))
        + '<p class="info">Each collective has one colour on every rank that ran it (the n-th of its kind in its '
        "process group and step); its darker start is the time the rank waited there for the last one to arrive. "
        + escape("; ".join(marks))
        + ("." if marks else "")
        + "</p>"
    )


def _chart(s: Summary, key: str, top: int, sort: str) -> str:
    """The plot drawn above a table, if it has one."""
    if key == "steps":
        return _steps_chart(s)
    if key == "ranks":
        items = [(f"{rank_label(r.rank, r.worker)} compute", r.compute_us) for r in s.ranks]
        items += [(f"{rank_label(r.rank, r.worker)} exposed comm", r.exposed_comm_us) for r in s.ranks]
        return _bars(items, fmt.duration)
    if key == "memory":
        return _legend(memory_report.legend()) + memory_report.svg(s.memory)
    if key == "kernels":
        return _bars([(k.name, k.total_us) for k in s.kernels[:top]], fmt.duration)
    if key == "ops":
        sort_key, title = op_sort(s, sort)
        return _bars(
            [(o.name, sort_key(o)) for o in sorted(s.ops, key=sort_key, reverse=True)[:top]],
            fmt.size if "memory" in title else fmt.duration,
        )
    return ""


def summary_body(s: Summary, top: int, sort: str) -> str:
    """One run's report without the page around it (a section of the file, a notebook's view)."""
    names = ", ".join(escape(p.name) for p in s.files[:8]) + (" ..." if len(s.files) > 8 else "")
    parts = [f"<h1>{escape(s.name)}</h1><p>{len(s.files)} trace file(s): {names}</p>"]
    capture, found = health.split(s.diagnostics)
    if capture:
        lines = "".join(f'<li class="warning">{escape(d.message)}</li>' for d in capture)
        parts.append(f'<ul class="capture">{lines}</ul>')
    if found:
        parts.append(
            "<h2>Findings</h2><ul>"
            + "".join(f'<li class="{d.severity}">{escape(d.message)}</li>' for d in found)
            + "</ul>"
        )
    if s.steps:
        parts.append(f"<h2>Timeline</h2>{_timelines(s)}")
    if len(s.ranks) > 1:
        parts.append(f"<h2>All ranks on one clock</h2>{_ranks_timeline(s)}")
    for t in tables(s, top, sort, width=_NAME_WIDTH):
        parts.append(f"<h2>{escape(t.title)}</h2>{_chart(s, t.key, top, sort)}{table(t.headers, t.rows)}")
    if s.memory_snapshots:
        parts.append(
            "<h2>Memory snapshots</h2><ul>"
            + "".join(f"<li>{escape(str(p))}: open it at {escape(MEMORY_VIEWER)}</li>" for p in s.memory_snapshots)
            + "</ul>"
        )
    if s.problems:
        parts.append(
            "<h2>Problems</h2><ul>"
            + "".join(f'<li class="warning">{escape(str(p))}</li>' for p in s.problems)
            + "</ul>"
        )
    return "<section>" + "".join(parts) + "</section>"


def write_html(summaries: dict[str, Summary], path: Path, top: int = 20, sort: str = "cuda") -> Path:
    """Write one page holding every run's report: `top` rows per table, operators sorted by `sort`, as the
    terminal report does."""
    title = "kprof summary: " + ", ".join(summaries)
    body = "".join(summary_body(s, top, sort) for s in summaries.values())
    path.write_text(page(title, body), encoding="utf-8")
    return path


def page(title: str, body: str) -> str:
    """A whole HTML document around `body`, with the report's inline style."""
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f"<style>{_CSS}{svgtimeline.CSS}</style></head><body>{body}</body></html>"
    )


def fragment(body: str) -> str:
    """`body` for embedding in another page (a notebook's output): in a ``<div class="kprof">`` with the report's
    style scoped to it, so it restyles nothing around it; no scripts and nothing fetched, as in the file."""
    return f'<div class="{_SCOPE}"><style>{_scoped(_CSS + svgtimeline.CSS)}</style>{body}</div>'


def _scoped(css: str) -> str:
    """Every rule of `css` limited to the fragment's div (``body`` becomes the div itself)."""
    rules = []
    for rule in css.replace("\n", "").split("}"):
        if rule.strip():
            selectors, declarations = rule.split("{", 1)
            scoped = (
                f".{_SCOPE}" if sel.strip() == "body" else f".{_SCOPE} {sel.strip()}" for sel in selectors.split(",")
            )
            rules.append(f"{','.join(scoped)}{{{declarations}}}")
    return "".join(rules)
