"""The module view as report tables (text, Markdown, HTML, notebooks share them): "Top modules" (the tree collapsed
to the modules that hold at least MIN_SHARE of the time, repeated instances summed as ``blocks.*``), the top source
lines, and what ran compiled (graphs a step, graph breaks, recompilations, how much of each graph's GPU time
the record attributed)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from . import fmt
from .fmt import clip
from .modules import GROUP_MIN, ModuleStats, ancestors, is_module, label, pattern, rollup, tree
from .report_table import Table

LINES = 30  # source lines the module view lists

if TYPE_CHECKING:
    from .summary import Summary

MIN_SHARE = 0.02  # of the GPU busy time (or wall time): a module below it is left out of "Top modules"
_DIRECTIONS = ("forward", "backward", "")


def grouped_rows(rows: list[ModuleStats]) -> dict[str, dict[str, np.ndarray]]:
    """name -> direction -> [calls, CPU, self CPU, GPU, self GPU], with instances summed as ``blocks.*`` where there
    are GROUP_MIN or more of them; grouped names carry their count: ``blocks.* (12)``."""
    members: dict[str, set[str]] = {}
    for r in rows:
        members.setdefault(pattern(r.name), set()).add(r.name)
    out: dict[str, dict[str, np.ndarray]] = {}
    for r in rows:
        key = pattern(r.name) if len(members[pattern(r.name)]) >= GROUP_MIN else r.name
        values = np.array([r.calls, r.cpu_us, r.self_cpu_us, r.gpu_us, r.self_gpu_us], np.float64)
        mine = out.setdefault(key, {})
        mine[r.direction] = mine[r.direction] + values if r.direction in mine else values
    return {
        f"{k} ({len(members[k])})" if k in members and len(members[k]) >= GROUP_MIN else k: v for k, v in out.items()
    }


def _bare(name: str) -> str:
    return name.rpartition(" (")[0] if name.endswith(")") and " (" in name else name


def modules_table(s: Summary, width: int) -> Table | None:
    """The tree of modules holding MIN_SHARE or more of the time, in tree order, each with its forward and backward
    time (its children's included), its share and its own (self) time."""
    if not s.modules:
        return None
    gpu = s.has_gpu
    column = 3 if gpu else 1
    rows = grouped_rows(s.modules)
    total = sum(r.gpu_us if gpu else r.cpu_us for r in s.modules if r.depth == 0)
    time = {name: sum(v[column] for v in d.values()) for name, d in rows.items()}
    shown = [n for n in rows if total and (time[n] / total >= MIN_SHARE or n.startswith("(unattributed)") and time[n])]
    order = rollup({_bare(n): np.array([time[n]]) for n in shown})

    def path(name: str) -> tuple:
        bare = _bare(name)
        chain = [*reversed(ancestors(bare)), bare] if is_module(bare) else [bare]
        return (not is_module(bare), *((-float(order.get(n, [0])[0]), n) for n in chain))

    body = []
    for name in sorted(shown, key=path):
        d = rows[name]
        fwd, bwd, other = (d.get(k, np.zeros(5)) for k in _DIRECTIONS)
        mine = fwd + bwd + other
        indent = "  " * min(_bare(name).count(".") + 1, 6) if is_module(_bare(name)) and _bare(name) else ""
        body.append(
            [
                clip(indent + label(name), width),
                str(int(fwd[0] + other[0])),
                fmt.duration(fwd[column] + other[column]),
                fmt.duration(bwd[column]),
                fmt.duration(mine[column]),
                fmt.share(mine[column] / total),
                fmt.duration(mine[column + 1]),
            ]
        )
    what = "GPU" if gpu else "CPU"
    title = (
        f"Top modules by {what} time (a module's time includes its children's; shown from "
        f"{fmt.share(MIN_SHARE)} of the {what} time on; {len({r.name for r in s.modules})} rows in all)"
    )
    headers = ["module", "calls", f"forward {what}", f"backward {what}", f"{what} time", f"% {what}", f"self {what}"]
    return Table("modules", title, headers, body)


def lines_table(s: Summary, top: int, width: int) -> Table | None:
    """The source lines with the most time."""
    if not s.lines:
        return None
    gpu = s.has_gpu
    rows = sorted(s.lines, key=lambda r: -(r.gpu_us if gpu else r.cpu_us))[:top]
    what = "GPU" if gpu else "CPU"
    return Table(
        "lines",
        f"Top {len(rows)} source lines by {what} time ({len(s.lines)} in all; compiled code by statement, eager code "
        "by the innermost function of your own and the call it makes)",
        ["line", "pass", f"{what} time", f"% {what}"] + (["CPU time"] if gpu else []),
        [
            [clip(r.line, width), r.direction or "-", fmt.duration(r.gpu_us if gpu else r.cpu_us), fmt.share(r.share)]
            + ([fmt.duration(r.cpu_us)] if gpu else [])
            for r in rows
        ],
    )


def compiled_table(s: Summary, width: int) -> Table | None:
    """The compiled graphs that ran (by recorded function and pass), with the share of their GPU time the record
    attributed; the title says graphs per step, graph breaks and recompilations."""
    facts = s.compiled
    if not facts or not (facts.get("graphs") or facts.get("graphs_per_step")):
        return None
    breaks = facts.get("breaks_per_step", 0)
    recompiled = facts.get("recompiled", [])
    title = (
        f"Compiled code: {facts.get('graphs_per_step', 0):g} graph{'s' * (facts.get('graphs_per_step') != 1)} a step, "
        f"{breaks:g} graph break{'s' * (breaks != 1)} a step"
        + (f" (resuming: {', '.join(facts['resumed'])})" if facts.get("resumed") else "")
        + (f", recompiled: {', '.join(recompiled)}" if recompiled else ", no recompilation")
    )
    body = [
        [
            clip(name, width),
            str(g["calls"]),
            fmt.duration(g["gpu_us"]),
            fmt.share(g["matched_us"] / g["gpu_us"]) if g["gpu_us"] else "-",
        ]
        for name, g in sorted(facts.get("graphs", {}).items(), key=lambda kv: -kv[1]["gpu_us"])
    ]
    body += [[clip(f"note: {note}", width), "", "", ""] for note in facts.get("notes", [])]
    return Table("compiled", title, ["graph", "calls", "GPU time", "attributed"], body)


def tables(s: Summary, top: int, width: int) -> list[Table]:
    """The module view's tables that have rows, in report order."""
    found = [modules_table(s, width), lines_table(s, top, width), compiled_table(s, width)]
    return [t for t in found if t is not None]


def module_view(s: Summary) -> dict[str, Any]:
    """The module view as the kprof tab draws it: the module tree (GPU time, or host time without a GPU), the top
    lines, what ran compiled."""
    lines = sorted(s.lines, key=lambda r: -(r.gpu_us if s.has_gpu else r.cpu_us))[:LINES]
    return {
        "gpu": s.has_gpu,
        "tree": tree(s.modules, s.has_gpu),
        "lines": [dataclasses.asdict(r) for r in lines],
        "compiled": s.compiled,
    }
