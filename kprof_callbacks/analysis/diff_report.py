"""A Diff as text, as one headline paragraph, as Markdown, and as HTML (shared tables of strings); the regression
gate's answer in words."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import stats
from . import explain, fmt, outside
from .breakdown import CHANGE_COLORS
from .events import DEVICE_KINDS
from .fmt import clip
from .html import page, table
from .memory_diff import memory_order
from .report import NAME_WIDTH
from .report_table import Table, markdown_table, md_text, text_table

if TYPE_CHECKING:
    from .tracediff import Change, Diff, Side

HEADLINE_ROWS = 3
GROUPS = (  # title, kinds, what a row's value is
    ("GPU activities (GPU time per step)", DEVICE_KINDS, "time"),
    ("Operators (self CPU time per step)", ("op",), "time"),
    ("Labels (wall time per step)", ("label",), "time"),
    ("Modules (GPU time per step, children included; host time without a GPU)", ("module",), "time"),
    ("Outside operators (host time between them, GPU idle, data loading per step)", (outside.KIND,), "time"),
    ("Counts per step", ("count",), "count"),
    ("Memory at the peak (bytes per step)", ("memory",), "bytes"),
)


def _count(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"


def _unit(kind: str) -> Callable[[float], str]:
    """How a row of ``kind`` writes its values: bytes for memory, a number for counts, else a duration."""
    return fmt.size if kind == "memory" else _count if kind == "count" else fmt.duration


def _signed(value: float, unit: Callable[[float], str]) -> str:
    return ("+" if value > 0 else "-" if value < 0 else "") + unit(abs(value))


def _side(s: Side) -> str:
    steps = fmt.ranges(n for n in s.steps if n >= 0) or "whole trace"
    per = f", {s.samples} samples over ranks" if s.samples != len(s.steps) else ""
    return f"{s.source} (run {s.run}; steps {steps}: {len(s.steps)} step{'s' * (len(s.steps) != 1)}{per})"


def _step_line(d: Diff) -> str:
    """The step-time verdict in one sentence, with why the mean says otherwise when it does."""
    t = d.step_time
    pct = fmt.level(d.confidence)
    times = f"{fmt.duration(t.a_median_us)} -> {fmt.duration(t.b_median_us)} (medians)"
    if t.verdict == stats.TOO_FEW:
        line = (
            f"Step time: {times}, speedup {t.speedup:.3f}x (typical step): too few steps for a verdict "
            f"({t.a_steps} against {t.b_steps}; the rank test needs {t.min_steps} a side at {pct})."
        )
    else:
        interval = f"speedup {t.speedup:.3f}x [{pct} CI {t.low:.3f}x-{t.high:.3f}x] (typical step, rank test)"
        line = f"Step time: {times}, {interval}: " + (
            "no significant difference." if t.verdict == stats.SAME else f"B is {t.verdict}."
        )
    a_out, b_out = t.window_starts
    if a_out or b_out:
        line += (
            f" Each window's first step is left out ({a_out} of A's, {b_out} of B's): the profiler's start and, on a "
            "GPU, the steps queued before the window land in it."
        )
    return f"{line} {t.note}" if t.note else line


def interval_header(d: Diff) -> str:
    """What the rows' interval column holds: Welch's interval at the false-coverage-adjusted level."""
    return f"{fmt.level(d.row_confidence)} CI (FDR-adjusted)"


def _table(d: Diff, title: str, kinds: Sequence[str], value: str, top: int, width: int) -> Table | None:
    rows = memory_order([c for c in d.changes if c.kind in kinds])
    if not rows:
        return None
    unit = _unit(kinds[0])
    shown = [c for c in rows if c.significant or c.presence_changed][:top]
    shown += [c for c in rows if c not in shown][: max(top - len(shown), 0)]
    body = []
    for c in shown:
        cells = [clip(fmt.row_name(c.kind, c.name), width)] + ([c.kind] if len(kinds) > 1 else [])
        interval = "-" if math.isnan(c.low) else f"[{_signed(c.low, unit)}, {_signed(c.high, unit)}]"
        cells += [unit(c.a), unit(c.b), _signed(c.change, unit), interval]
        if value == "time":
            cells.append(_count(c.a_calls) if c.a_calls == c.b_calls else f"{_count(c.a_calls)} -> {_count(c.b_calls)}")
        body.append(cells + [c.verdict])
    headers = ["name"] + (["kind"] if len(kinds) > 1 else []) + ["A", "B", "change", interval_header(d)]
    headers += (["calls/step"] if value == "time" else []) + ["verdict"]
    n_sig = sum(c.significant for c in rows)
    more = len(rows) - len(shown)
    left = sum(c.significant for c in rows if c not in shown)
    tail = f"; {more} more rows, {left} of them significant" if more else ""
    return Table(kinds[0], f"{title}: {n_sig} of {len(rows)} significant{tail}", headers, body)


def tables(d: Diff, top: int, width: int = NAME_WIDTH) -> list[Table]:
    """The row tables that have rows, in report order."""
    return [t for title, kinds, value in GROUPS if (t := _table(d, title, kinds, value, top, width)) is not None]


def _explained(d: Diff, top: int) -> str:
    """Which rows account for the step-time change, largest share first, and the share they explain together."""
    found = explain.explain(d, top)
    if found.rows:
        return (
            f"Accounting for it, by share of the change in mean step time: {found.words()}; the rows that moved "
            f"with it explain {fmt.share(found.together)} of it together."
        )
    return f"No significant change of a row accounts for {fmt.share(explain.MIN_SHARE)} of it or more."


def headline(d: Diff, top: int) -> str:
    """The step-time verdict, what accounts for it when B is faster or slower, and the largest significant rows."""
    parts = [_step_line(d)]
    if d.machine is not None:  # the machine before the rows: it may be what changed
        parts.append(d.machine.sentence())
    if d.step_time.significant:
        parts.append(_explained(d, top))
    rows = [c for c in d.significant() if c.kind != "count"]
    if rows:
        named = ", ".join(f"{fmt.row_label(c.kind, c.name)} {_change_word(c)}" for c in rows[:top])
        parts.append(f"{len(rows)} of {len(d.changes)} rows changed significantly; the largest: {named}.")
    else:
        parts.append("No row changed significantly.")
    return " ".join(parts)


def _change_word(c: Change) -> str:
    """How a row changed, in a word or a signed time per step."""
    return f"({c.status})" if c.presence_changed else f"{_signed(c.change, _unit(c.kind))} per step"


def _grew(d: Diff, top: int) -> str:
    """The rows that explain the growth, largest share of the change in mean step time first, with the share they
    explain together; else the rows that grew, largest first."""
    found = explain.explain(d, top)
    if found.rows:
        return (
            f"What grew, largest share of the change in mean step time first: {found.words()}; the rows that grew "
            f"explain {fmt.share(found.together)} of it together."
        )
    grown = sorted((c for c in d.significant() if c.kind != "count" and c.change > 0), key=lambda c: -c.change)
    if not grown:
        return "No row grew significantly: the rows vary too much for their steps."
    rows = explain.Explanation(grown[:top], [d.share_of_step_change(c) for c in grown[:top]], 0.0)
    return (
        f"What grew: {rows.words()}; no row that grew significantly accounts for {fmt.share(explain.MIN_SHARE)} of "
        "the change in mean step time."
    )


def _relative(change: float) -> str:
    """B's relative change in step time in words: `12.0% slower`, `41.1% faster`, `as long` (under 0.05%)."""
    if not round(abs(change), 3):
        return "as long"
    return f"{abs(change):.1%} {'slower' if change > 0 else 'faster'}"


def _relative_interval(low: float, high: float) -> str:
    """The interval of a relative change in the words of ``_relative``, so estimate and interval read alike:
    `7.3% to 11.4% slower`, `86.6% faster to 48.3% slower`."""
    if low > 0 and round(low, 3):
        return f"{low:.1%} to {high:.1%} slower"
    if high < 0 and round(high, 3):
        return f"{-high:.1%} to {-low:.1%} faster"
    return f"{_relative(low)} to {_relative(high)}"


def gate(d: Diff, pct: float, top: int = HEADLINE_ROWS) -> str:
    """The regression gate's answer (``Diff.regressed(pct)``) in words: B's slowdown with its interval, against the
    limit; when it failed, what grew, or that the machine changed (``Diff.machine_changed``: "inconclusive"); with
    too few steps, why there is no answer."""
    stats.regression_limit(pct)
    try:
        failed = d.regressed(pct)
    except ValueError as exc:
        return f"No verdict (limit {fmt.limit(pct)}): {exc}."
    t = d.step_time
    moved = _relative(t.change)
    change = (
        f"B's typical step is {moved} {'as' if moved == 'as long' else 'than'} A's "
        f"[{fmt.level(d.confidence)} CI: {_relative_interval(*t.change_interval)}]"
    )
    limit = f"limit {fmt.limit(pct)}"
    if failed and d.machine_changed:
        return (
            f"Inconclusive, the machine changed ({limit}): {change}, all of the interval above the limit, "
            f"but {d.machine.sentence()}"
        )
    if failed:
        machine = f" {d.machine.sentence()}" if d.machine else ""
        return f"Regression ({limit}): {change}, all of the interval above the limit. {_grew(d, top)}{machine}"
    if d.masked(pct):
        return (
            f"Inconclusive, the machine changed ({limit}): {change}, which would pass, but "
            f"{d.machine.sentence()} That made A's steps {d.machine.lost:.0%} longer: a regression of B past the limit "
            "could hide behind it; rerun both sides on one quiet machine."
        )
    return (
        f"No regression ({limit}): {change}; the gate fails only when B is significantly slower and the "
        "whole interval lies above the limit."
    )


def _rule(d: Diff) -> str:
    return (
        "Step time: the typical step, the median of the A/B ratios over all pairs of steps, with the Mann-Whitney "
        "rank test's interval (it excludes 1 exactly when the test finds a shift). Rows: per-step means; a change "
        "is significant when Welch's t-test passes the Benjamini-Hochberg false-discovery control across all "
        f"rows (rate {fmt.share(1 - d.confidence)}) and it exceeds the noise threshold "
        f"({fmt.share(d.noise_threshold)} of A); each row's interval is Welch's at the level that control used "
        f"({fmt.level(d.row_confidence)}), so it excludes 0 for the rows it kept; new and gone rows are tested on "
        "their calls per step"
    )


def render(d: Diff, top: int) -> str:
    """The whole text report."""
    head = "kprof diff: B against A"
    parts = [f"{head}\n{'=' * len(head)}\nA: {_side(d.a)}\nB: {_side(d.b)}"]
    if d.capture:  # each side's capture checked before anything drawn from it
        parts.append("\n".join(f"! {line}" for line in d.capture))
    parts.append(headline(d, HEADLINE_ROWS))
    parts += [f"{t.title}\n{text_table(t.headers, t.rows)}" for t in tables(d, top)]
    if d.diagnostics:
        parts.append(
            "\n".join(
                ["Findings"]
                + [f"{'+' if x.change == 'appeared' else '-'} {x.change}: {x.message}" for x in d.diagnostics]
            )
        )
    parts.append("\n".join([f"{_rule(d)}."] + [f"Note: {n}" for n in d.notes]))
    return "\n\n".join(parts)


def markdown(d: Diff, top: int, gate_text: str | None = None) -> str:
    """The report as GitHub-flavoured Markdown for a pull request: the gate (when given), the headline, the tables."""
    parts = ["### kprof diff: B against A", f"A: {md_text(_side(d.a))}  \nB: {md_text(_side(d.b))}"]
    if d.capture:
        parts.append("\n".join(f"- **{md_text(line)}**" for line in d.capture))
    if gate_text:
        parts.append(f"**{md_text(gate_text)}**")
    parts.append(md_text(headline(d, HEADLINE_ROWS)))
    parts += [f"**{md_text(t.title)}**\n\n{markdown_table(t.headers, t.rows)}" for t in tables(d, top)]
    if d.diagnostics:
        parts.append("\n".join(f"- {x.change}: {md_text(x.message)}" for x in d.diagnostics))
    parts.append("\n".join([f"<sub>{md_text(_rule(d))}.</sub>"] + [f"- Note: {md_text(n)}" for n in d.notes]))
    return "\n\n".join(parts)


def _signed_bars(rows: Sequence[Change], width: int = 900) -> str:
    """Horizontal bars from a centre line: increases to the right (red), decreases to the left (green)."""
    if not rows:
        return ""
    top = max(abs(c.change) for c in rows) or 1.0
    row, text = 18, 330
    half = (width - text - 20) / 2
    centre = text + half
    out = [
        f'<svg width="{width}" height="{row * len(rows) + 4}" role="img">',
        f'<line x1="{centre}" y1="0" x2="{centre}" y2="{row * len(rows) + 4}" stroke="#999"/>',
    ]
    for i, c in enumerate(rows):
        y, w = i * row + 2, max(1.0, (half - 70) * abs(c.change) / top)
        x = centre if c.change > 0 else centre - w
        label = f"{_signed(c.change, fmt.duration)} ({c.verdict})"
        tx = centre + w + 4 if c.change > 0 else centre - w - 4
        anchor = "start" if c.change > 0 else "end"
        color = CHANGE_COLORS["increased" if c.change > 0 else "decreased"]
        out.append(
            f'<text x="0" y="{y + 13}" font-size="12">{escape(fmt.row_label(c.kind, c.name, 48))}</text>'
            f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row - 4}" '
            f'fill="{color}"><title>{escape(c.name)}: {escape(label)}</title>'
            f'</rect><text x="{tx:.1f}" y="{y + 13}" font-size="12" text-anchor="{anchor}">'
            f"{escape(_signed(c.change, fmt.duration))}</text>"
        )
    return "".join(out) + "</svg>"


def body(d: Diff, top: int) -> str:
    """The report's HTML without the page around it (the file's body, a notebook's view)."""
    timed = [c for c in d.significant() if c.kind not in ("count", "memory")][:top]
    parts = [
        f"<h1>kprof diff: B against A</h1><p>A: {escape(_side(d.a))}<br>B: {escape(_side(d.b))}</p>",
    ]
    if d.capture:
        parts.append('<ul class="capture">' + "".join(f'<li class="warning">{escape(x)}</li>' for x in d.capture))
        parts.append("</ul>")
    parts.append(f"<p><b>{escape(headline(d, HEADLINE_ROWS))}</b></p>")
    if timed:
        parts.append(f"<h2>Significant changes in time per step</h2>{_signed_bars(timed)}")
    for t in tables(d, top, width=300):
        parts.append(f"<h2>{escape(t.title)}</h2>{table(t.headers, t.rows)}")
    if d.diagnostics:
        parts.append(
            "<h2>Findings</h2><ul>"
            + "".join(
                f'<li class="{"warning" if x.change == "appeared" else "info"}">{escape(x.change)}: '
                f"{escape(x.message)}</li>"
                for x in d.diagnostics
            )
            + "</ul>"
        )
    parts.append(f'<p class="info">{escape(_rule(d))}.</p>')
    parts += [f'<p class="info">Note: {escape(n)}</p>' for n in d.notes]
    return "<section>" + "".join(parts) + "</section>"


def write_html(d: Diff, path: Path, top: int) -> Path:
    """Write the report as one HTML page."""
    path.write_text(page(f"kprof diff: {d.a.source} vs {d.b.source}", body(d, top)), encoding="utf-8")
    return path


def diff_view(d: Diff) -> dict[str, Any]:
    """A diff as the kprof tab draws it: `to_dict()`, the headline, each row's name as the reports show it (parallel to
    `changes`) and the reports' tables (title, kinds, whether its rows are times or counts)."""
    groups = [{"title": title, "kinds": list(kinds), "value": value} for title, kinds, value in GROUPS]
    names = [fmt.row_name(c.kind, c.name) for c in d.changes]
    return {"diff": d.to_dict(), "headline": d.headline(), "names": names, "groups": groups}
