"""A step's timeline as static SVG, for the HTML report: no script, it opens from disk anywhere.

One lane per CPU thread (operators nested under your labels and ProfilerStep#N) and per GPU stream; each event a
rectangle whose title (the browser's tooltip) gives its name, kind, duration, input shapes and innermost Python
frames. Hovering a kernel draws the link from the runtime call that launched it (CSS only). Events narrower than a
pixel are merged with their neighbours into one block that says how many it holds, so a step of 50,000 events
stays a page of a few hundred kilobytes.
"""

from __future__ import annotations

import dataclasses
import math
from html import escape
from typing import TYPE_CHECKING

import numpy as np

from .breakdown import KIND_COLORS
from .slices import DEVICE_KIND, KINDS, Slice

if TYPE_CHECKING:
    from .ranktimeline import RankStep

WIDTH, GUTTER, ROW, GAP, AXIS = 1060, 180, 14, 8, 22  # px
_FRAMES = 4  # Python frames in a title
CSS = (
    ".tl text{font:11px system-ui,sans-serif;fill:#333}.tl .ax{fill:#666}.tl rect{stroke:#fff;stroke-width:.3}"
    ".tl .ln{display:none;fill:none;stroke:#222;stroke-width:1.2;pointer-events:none}"
    ".tl .k:hover .ln{display:inline}.tl rect:hover{stroke:#000;stroke-width:1}"
    ".tl .wait{fill:#000;fill-opacity:.35;stroke:none}"
)


def duration(ns: float) -> str:
    """`1.23 ms` for a duration in ns (the tab's timeline prints the same)."""
    for unit, size in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(ns) >= size:
            value = ns / size
            return f"{value:.{max(0, 2 - int(math.log10(abs(value))))}f} {unit}"
    return f"{ns:.0f} ns"


def tick_step(span: float, count: int = 8) -> float:
    """The tick step (1, 2 or 5 x 10^k) that puts about `count` ticks across `span`."""
    raw = span / count
    base = 10 ** math.floor(math.log10(raw))
    return next(m * base for m in (1, 2, 5, 10) if m * base >= raw)


def _title(piece: Slice, i: int) -> str:
    kind = KINDS[piece.kind[i]]
    lines = [
        piece.names[piece.name[i]],
        f"{kind} on {piece.lanes[piece.lane[i]].name}: {duration(piece.dur[i])}, at {duration(piece.start[i])}",
    ]
    if piece.shape[i] >= 0:
        lines.append(f"input shapes {piece.shapes[piece.shape[i]]}")
    frames, p = [], int(piece.parent[i])
    while p >= 0 and len(frames) < _FRAMES:
        if KINDS[piece.kind[p]] == "python":
            frames.append(piece.names[piece.name[p]])
        p = int(piece.parent[p])
    lines += [f"  in {f}" for f in frames]
    if piece.link[i] >= 0:
        lines.append(
            f"launched by {piece.names[piece.name[piece.link[i]]]} "
            f"{duration(piece.start[i] - piece.start[piece.link[i]])} before it started"
        )
    return escape("\n".join(lines))


@dataclasses.dataclass
class Overlay:
    """What the timeline of all ranks adds to a step's picture: per event a fill that replaces its kind's colour
    (None: keep it), a wait at its start drawn darker (ns), and a line for its title; per lane a mark in the margin
    (text, colour)."""

    fills: list[str | None]
    waits: np.ndarray
    notes: list[str]
    marks: dict[int, tuple[str, str]]


def render(piece: Slice, caption: str, overlay: Overlay | None = None) -> str:
    """`piece` as an SVG figure with `caption` above it (and `overlay`'s colours, waits and marks)."""
    scale = (WIDTH - GUTTER) / max(int(piece.span_ns), 1)
    lane_top = np.cumsum([AXIS] + [lane.rows * ROW + GAP for lane in piece.lanes])
    height = int(lane_top[-1])
    out = [
        f'<figure><figcaption>{escape(caption)}</figcaption><svg class="tl" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{escape(caption)}">'
    ]
    step = tick_step(max(int(piece.span_ns), 1))
    for k in range(int(piece.span_ns // step) + 1):
        px = GUTTER + k * step * scale
        out.append(f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{AXIS - 6}" y2="{height}" stroke="#eee"/>')
        if px < WIDTH - 50:  # room for the label
            out.append(f'<text class="ax" x="{px + 2:.1f}" y="{AXIS - 9}">{duration(k * step)}</text>')
    marks = overlay.marks if overlay else {}
    for k, (lane, top) in enumerate(zip(piece.lanes, lane_top.tolist())):
        text, color = marks.get(k, ("", ""))
        if text:
            out.append(
                f'<rect x="0" y="{top}" width="3" height="{lane.rows * ROW}" fill="{color}">'
                f"<title>{escape(text)}</title></rect>"
            )
        style = f' style="fill:{color};font-weight:600"' if text else ""
        out.append(
            f'<text x="5" y="{top + ROW - 3}"{style}>{escape(lane.name[:30])}</text>'
            f'<line x1="0" x2="{WIDTH}" y1="{top + lane.rows * ROW + GAP / 2}" '
            f'y2="{top + lane.rows * ROW + GAP / 2}" stroke="#ddd"/>'
        )
    out += _events(piece, scale, lane_top, overlay)
    return "".join(out) + "</svg></figure>"


def _events(piece: Slice, scale: float, lane_top: np.ndarray, overlay: Overlay | None) -> list[str]:
    """One rectangle per event (sub-pixel neighbours merged into one), with its title and launch link."""
    start = np.clip(piece.start, 0, piece.span_ns)  # events that began before the step or end after it
    end = np.clip(piece.start + piece.dur, 0, piece.span_ns)
    x = (GUTTER + start * scale).tolist()
    w = ((end - start) * scale).tolist()
    y = (lane_top[piece.lane] + piece.row * ROW).tolist()
    out: list[str] = []
    merged: list[int] = []  # sub-pixel events waiting to be drawn as one block

    def fill(i: int) -> str:
        return (overlay and overlay.fills[i]) or KIND_COLORS[KINDS[piece.kind[i]]]

    def flush() -> None:
        if merged:
            first, last = merged[0], merged[-1]
            names = list(dict.fromkeys(piece.names[piece.name[i]] for i in merged))
            more = " …" if len(names) > 5 else ""
            title = f"{len(merged)} events under a pixel wide: " + ", ".join(names[:5]) + more
            width = max(x[last] + w[last] - x[first], 1)
            out.append(
                f'<rect x="{x[first]:.1f}" y="{y[first] + 1}" width="{width:.1f}" '
                f'height="{ROW - 2}" fill="{fill(first)}"><title>{escape(title)}</title></rect>'
            )
            merged.clear()

    for i in np.lexsort((piece.start, piece.row, piece.lane)).tolist():
        if merged and (y[i] != y[merged[-1]] or x[i] - (x[merged[-1]] + w[merged[-1]]) > 1 or w[i] >= 1):
            flush()
        if w[i] < 1:
            merged.append(i)
            continue
        title = _title(piece, i) + (escape("\n" + overlay.notes[i]) if overlay and overlay.notes[i] else "")
        rect = (
            f'<rect x="{x[i]:.1f}" y="{y[i] + 1}" width="{w[i]:.1f}" height="{ROW - 2}" '
            f'fill="{fill(i)}"><title>{title}</title></rect>'
        )
        wait = float(overlay.waits[i]) * scale if overlay else 0.0
        if wait >= 0.5:
            rect += (
                f'<rect class="wait" x="{x[i]:.1f}" y="{y[i] + 1}" width="{min(wait, w[i]):.1f}" '
                f'height="{ROW - 2}" pointer-events="none"/>'
            )
        if w[i] > 40:
            label = piece.names[piece.name[i]][: int((w[i] - 6) / 6.2)]
            rect += f'<text x="{x[i] + 3:.1f}" y="{y[i] + ROW - 3}" pointer-events="none">{escape(label)}</text>'
        launcher = int(piece.link[i])
        if piece.kind[i] >= DEVICE_KIND and launcher >= 0:
            x0, y0 = x[launcher] + w[launcher] / 2, y[launcher] + ROW / 2
            rect = (
                f'<g class="k">{rect}<path class="ln" d="M{x0:.1f},{y0:.1f} C{x0:.1f},{(y0 + y[i]) / 2:.1f} '
                f'{x[i]:.1f},{(y0 + y[i]) / 2:.1f} {x[i]:.1f},{y[i] + 1}"/></g>'
            )
        out.append(rect)
    flush()
    return out


STRAGGLER, LATE = "#c0392b", "#7d3c98"  # the margin marks of the straggler and of the rank the others wait for


def ranks_overlay(step: RankStep) -> Overlay:
    """The collectives' colours and waits, and the marks of the straggler and of the rank the others waited for."""
    notes = [step.note(i) for i in range(len(step.piece))]
    fills = [step.collectives[c].color if c >= 0 else None for c in step.coll.tolist()]
    marks: dict[int, tuple[str, str]] = {}
    for r in step.ranks:
        said = []
        if step.straggler and step.straggler[0] == r.rank:
            said.append(("straggler", STRAGGLER))
        if step.late and step.late[0] == r.rank:
            said.append(("waited for", LATE))
        if said:
            text = ", ".join(t for t, _ in said)
            marks.update({k: (text, said[0][1]) for k in range(r.first_lane, r.first_lane + r.lanes)})
    return Overlay(fills, step.wait, notes, marks)
