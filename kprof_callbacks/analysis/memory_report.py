"""`Summary.memory` as report tables (text, Markdown, HTML share them) and as the HTML report's SVG: the allocated
memory over the median step, its phases shaded, and what was alive at its peak by kind."""

from __future__ import annotations

from html import escape
from statistics import median

from . import fmt
from .breakdown import MEMORY_KINDS
from .memory import KINDS, MemorySummary
from .report_table import Table

_KIND_NAME = {p.key: p.name for p in MEMORY_KINDS}
_KIND_COLOR = {p.key: p.color for p in MEMORY_KINDS}
PHASE_COLORS = {"forward": "#e8f0fa", "backward": "#fbeee0", "optimizer": "#e6f4f1", "zero_grad": "#e6f4f1"}


def _title(m: MemorySummary) -> str:
    s = m.shown
    where = f" at {s.where}" if s.where else ""
    reserved = f", {fmt.size(s.reserved)} reserved" if s.reserved else ""
    return (
        f"Memory at the peak ({m.device}): step {s.step} (the median of {len(m.steps)} by peak), "
        f"{fmt.size(s.peak)} allocated in {s.phase}{where}{reserved}"
    )


def kinds_table(m: MemorySummary) -> Table:
    """What was alive at the shown peak by kind, with each kind's median and range over the steps."""
    s = m.shown
    rows = []
    for kind in KINDS:
        values = [step.kinds.get(kind, 0) for step in m.steps]
        if not s.kinds.get(kind) and not any(values):
            continue
        spread = f"{fmt.size(min(values))}-{fmt.size(max(values))}" if min(values) != max(values) else "same"
        rows.append(
            [
                _KIND_NAME[kind],
                fmt.size(s.kinds[kind]),
                fmt.share(s.kinds[kind] / s.peak if s.peak else 0),
                fmt.size(median(values)),
                spread,
            ]
        )
    return Table("memory", _title(m), ["kind", "at the peak", "share", "median over steps", "range"], rows)


def modules_table(m: MemorySummary, top: int, width: int) -> Table:
    """Bytes alive at the shown peak by the module (or site) that allocated them, with their kinds."""
    totals: dict[str, dict[str, int]] = {}
    for row in m.modules:
        totals.setdefault(row.module, {})[row.kind] = totals.get(row.module, {}).get(row.kind, 0) + row.bytes
    ranked = sorted(totals.items(), key=lambda kv: -sum(kv[1].values()))[:top]
    peak = m.shown.peak or 1
    rows = [
        [
            fmt.clip(name, width),
            fmt.size(sum(kinds.values())),
            fmt.share(sum(kinds.values()) / peak),
            ", ".join(f"{_KIND_NAME[k]} {fmt.size(v)}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])),
        ]
        for name, kinds in ranked
    ]
    where = "module" if any("." in n or not n.startswith(("aten::", "(")) for n in totals) else "site"
    return Table(
        "memory_modules",
        f"Memory at the peak by {where} (step {m.shown.step})",
        [where, "bytes", "share", "kinds"],
        rows,
    )


def blocks_table(m: MemorySummary, top: int, width: int) -> Table:
    """The largest blocks alive at the shown peak: size, kind, what allocated them, when (ms from the step's start)."""

    def when(us: float | None, missing: str) -> str:
        return missing if us is None else f"{us / 1e3:.1f} ms"

    rows = [
        [
            fmt.size(b.bytes),
            _KIND_NAME[b.kind],
            fmt.clip(b.op + (f" ({b.inner})" if b.inner and b.inner != b.op else ""), width),
            fmt.clip(b.where, width),
            fmt.clip(b.shapes, 40),
            when(b.allocated_us, "before"),
            when(b.freed_us, "not freed"),
        ]
        for b in m.blocks[:top]
    ]
    headers = ["size", "kind", "operator", "module / site", "input shapes", "allocated", "freed"]
    if not any(r[4] for r in rows):
        headers.pop(4)
        rows = [r[:4] + r[5:] for r in rows]
    return Table("memory_blocks", f"Largest blocks at the peak (step {m.shown.step})", headers, rows)


def tables(m: MemorySummary | None, top: int, width: int) -> list[Table]:
    """The memory tables of a report: by kind, by module (``top`` rows), the largest blocks (``top // 2``)."""
    if m is None or m.shown is None:
        return []
    return [kinds_table(m), modules_table(m, top, width), blocks_table(m, max(top // 2, 3), width)]


def svg(m: MemorySummary, width: int = 900, height: int = 200) -> str:
    """The HTML report's picture of the shown step: its allocated memory over time with the phases shaded and the
    peak marked, then a bar of what was alive at the peak by kind."""
    if m.shown is None or not m.curve:
        return ""
    left, bottom = 70, 18
    t0, t1 = m.curve[0][0], max(m.curve[-1][0], m.curve[0][0] + 1e-3)
    top = max(p[1] for p in m.curve) or 1

    def x(us: float) -> float:
        return left + (width - left - 10) * (us - t0) / (t1 - t0)

    def y(nbytes: float) -> float:
        return height - height * nbytes / top

    out = [f'<svg width="{width}" height="{height + bottom + 34}" role="img" aria-label="memory over the step">']
    for name, lo, hi in m.phases:
        if name in PHASE_COLORS:
            out.append(
                f'<rect x="{x(lo):.1f}" y="0" width="{max(x(hi) - x(lo), 1):.1f}" height="{height}" '
                f'fill="{PHASE_COLORS[name]}"><title>{escape(name)}</title></rect>'
            )
    points = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in m.curve)
    out.append(f'<polyline points="{points}" fill="none" stroke="#4e79a7" stroke-width="1.5"/>')
    peak_t = m.curve[max(range(len(m.curve)), key=lambda i: m.curve[i][1])][0]
    out.append(
        f'<circle cx="{x(peak_t):.1f}" cy="{y(top):.1f}" r="4" fill="#e15759"><title>peak '
        f"{escape(fmt.size(top))} in {escape(m.shown.phase)}</title></circle>"
    )
    out.append(
        f'<text x="0" y="12" font-size="11">{escape(fmt.size(top))}</text>'
        f'<text x="{left}" y="{height + 14}" font-size="11">0 ms</text>'
        f'<text x="{width - 60}" y="{height + 14}" font-size="11">{(t1 - t0) / 1e3:.1f} ms</text>'
    )
    out.append(_kinds_bar(m, left, height + bottom + 6, width - left - 10))
    return "".join(out) + "</svg>"


def _kinds_bar(m: MemorySummary, left: int, top: float, width: int) -> str:
    """One horizontal bar: the shown peak split by kind, each part titled with its name and size."""
    out, x = [], float(left)
    for kind in KINDS:
        value = m.shown.kinds.get(kind, 0)
        if value <= 0:
            continue
        w = width * value / (m.shown.peak or 1)
        out.append(
            f'<rect x="{x:.1f}" y="{top:.1f}" width="{w:.1f}" height="14" fill="{_KIND_COLOR[kind]}">'
            f"<title>{escape(_KIND_NAME[kind])}: {escape(fmt.size(value))}</title></rect>"
        )
        x += w
    return "".join(out)


def legend() -> list[tuple[str, str, str]]:
    """(name, colour, meaning) of each kind, for the HTML report's legend."""
    return [(p.name, p.color, p.meaning) for p in MEMORY_KINDS]
