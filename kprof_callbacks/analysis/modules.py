"""Time by module and by source line over a run (``Summary.modules``, ``Summary.lines``), from each file's shares.

A module's row holds its own share and its children's: ``blocks.3`` includes ``blocks.3.attn``, the model itself
(``""``, shown as "(model)") every module; ``self_*`` is the module's own. The rows that are no module (optimizer,
data loading, outside modules, unattributed) sit beside the model. Instances of one repeated module
(``blocks.0.mlp`` ... ``blocks.11.mlp``) are summed as ``blocks.*.mlp`` where a view shows many of them at once: the
terminal's "Top modules", and the per-step rows ``kprof.diff`` tests.
"""

from __future__ import annotations

import dataclasses
import re
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

ROOT, ROOT_LABEL = "", "(model)"  # the model itself: its qualified name, and how tables show it
GROUP_MIN = 3  # instances of a module (blocks.0, blocks.1, ...) summed as one row (blocks.*) from this many on
_INDEX = re.compile(r"(?<![^.])\d+(?![^.])")


@dataclasses.dataclass(frozen=True)
class ModuleStats:
    """A module (by qualified name; ``""`` is the model) in one direction, or a row that is no module."""

    name: str
    depth: int  # 0 for the model and the rows that are no module, 1 for its children, ...
    direction: str  # "forward", "backward", or "" (optimizer, data loading, unattributed)
    calls: int  # module calls (forward), autograd nodes (backward), ranges (optimizer, data loading)
    cpu_us: float  # host time, its children's included
    self_cpu_us: float
    gpu_us: float  # GPU time, its children's included
    self_gpu_us: float
    share: float  # of the steps' GPU busy time (without a GPU: of the steps' wall time)


@dataclasses.dataclass(frozen=True)
class LineStats:
    """A source line of the user's code in one direction: eager code by its innermost own frame and the call it
    makes there, compiled code by the statement a kernel's nodes came from."""

    line: str
    direction: str
    cpu_us: float
    gpu_us: float
    share: float


def is_module(name: str) -> bool:
    """Whether a row is a module (not "(optimizer)" and the like)."""
    return not name.startswith("(")


def label(name: str) -> str:
    """A row's name as tables show it."""
    return ROOT_LABEL if name == ROOT else name


def ancestors(name: str) -> list[str]:
    """``blocks.3.attn`` -> ``blocks.3``, ``blocks``, ``""``; none for the model and rows that are no module."""
    if name == ROOT or not is_module(name):
        return []
    parts = name.split(".")
    return [".".join(parts[:k]) for k in range(len(parts) - 1, 0, -1)] + [ROOT]


def depth(name: str) -> int:
    return 0 if name == ROOT or not is_module(name) else name.count(".") + 1


def pattern(name: str) -> str:
    """``blocks.3.mlp`` -> ``blocks.*.mlp``: the name with each index part as ``*``."""
    return _INDEX.sub("*", name)


def rollup(values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each row's values plus its descendants' (an ancestor without values of its own gets a row)."""
    out: dict[str, np.ndarray] = {}
    for name, value in values.items():
        for key in (name, *ancestors(name)):
            out[key] = out[key] + value if key in out else np.array(value, np.float64)
    return out


def grouped(values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Instances summed by ``pattern`` where there are GROUP_MIN or more; other rows as they are."""
    members: dict[str, list[str]] = {}
    for name in values:
        members.setdefault(pattern(name), []).append(name)
    out = {}
    for key, names in members.items():
        if len(names) >= GROUP_MIN:
            out[key] = sum((values[n] for n in names[1:]), np.array(values[names[0]], np.float64))
        else:
            out.update((n, values[n]) for n in names)
    return out


def rollup_steps(names: Sequence[str], own: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Per-step rows for kprof.diff from each target's own time per step (``own``: targets x steps): children
    included, instances grouped, the model named ``(model)``; rows with no time left out."""
    values = grouped(rollup({n: own[k] for k, n in enumerate(names) if own[k].any()}))
    keys = sorted(values, key=lambda n: (not is_module(n), n))
    table = np.stack([values[k] for k in keys]) if keys else np.zeros((0, own.shape[1]))
    return [label(k) for k in keys], table


def _merge(parts: Iterable[dict]) -> dict:
    out: dict = {}
    for part in parts:
        for key, value in part.items():
            out[key] = out[key] + value if key in out else np.array(value, np.float64)
    return out


def module_rows(parts: Iterable[dict], total_us: float, gpu: bool) -> list[ModuleStats]:
    """Rows over files from their (name, direction) -> [calls, CPU, GPU] of each target's own; ``total_us`` is what
    ``share`` divides (GPU busy time, or wall time without a GPU). In tree order: a parent before its children,
    siblings by time."""
    own = _merge(parts)
    rows = []
    for direction in {d for _, d in own}:
        mine = {n: v for (n, d), v in own.items() if d == direction}
        for name, value in rollup(mine).items():
            calls, self_cpu, self_gpu = mine.get(name, np.zeros(3)).tolist()
            _, cpu, gpu_us = value.tolist()
            share = (gpu_us if gpu else cpu) / total_us if total_us else 0.0
            rows.append(ModuleStats(name, depth(name), direction, int(calls), cpu, self_cpu, gpu_us, self_gpu, share))
    return tree_order(rows)


def tree_order(rows: list[ModuleStats]) -> list[ModuleStats]:
    """The model's tree depth first, children by their time (forward and backward together), forward first; then
    the rows that are no module."""
    time: Counter = Counter()
    for r in rows:
        time[r.name] += r.gpu_us or r.cpu_us

    def path(name: str) -> tuple:
        chain = [*reversed(ancestors(name)), name] if is_module(name) else [name]
        return (not is_module(name), *((-time[n], n) for n in chain))

    return sorted(rows, key=lambda r: (path(r.name), r.direction != "forward"))


def line_rows(parts: Iterable[dict], total_us: float, gpu: bool) -> list[LineStats]:
    """Line rows over files ((line, direction) -> [calls, CPU, GPU]), by time."""
    rows = [
        LineStats(
            line, direction, float(v[1]), float(v[2]), float(v[2] if gpu else v[1]) / total_us if total_us else 0.0
        )
        for (line, direction), v in _merge(parts).items()
    ]
    return sorted(rows, key=lambda r: -(r.gpu_us if gpu else r.cpu_us))


def compiled_facts(parts: Iterable[dict]) -> dict[str, Any]:
    """What ran compiled, over files: graphs per step (median over steps of the Dynamo frames that ran), the frames
    that resume after a graph break, the recompiled ones, per recorded graph its calls, GPU time and how much of it
    matched the record, and the records' notes."""
    parts = [p for p in parts if p]
    frames = [len(v) for p in parts for v in p["frames"].values()]
    graphs: dict[str, list[float]] = {}
    for p in parts:
        for label, seen in p["graphs"].items():
            graphs[label] = [a + b for a, b in zip(graphs.get(label, [0.0, 0.0, 0.0]), seen)]
    return {
        "graphs_per_step": statistics.median(frames) if frames else 0,
        "breaks_per_step": statistics.median(_breaks(p) for p in parts) if frames else 0,
        "resumed": sorted({f for p in parts for f in p["resumed"]}),
        "recompiled": sorted({f for p in parts for f in p["recompiled"]}),
        "functions": {k: v for p in parts for k, v in p["functions"].items()},
        "graphs": {k: {"calls": int(c), "gpu_us": g, "matched_us": m} for k, (c, g, m) in graphs.items()},
        "notes": sorted({p["note"] for p in parts if p["note"]}),
    }


def _breaks(part: dict) -> float:
    """Graph breaks per step in one file: frames that ran there and resume after a break (median over steps)."""
    resumed = {int(f.split("/")[0]) for f in part["resumed"]}
    counts = [len(set(v) & resumed) for v in part["frames"].values()]
    return statistics.median(counts) if counts else 0


@dataclasses.dataclass(frozen=True)
class Assembled:
    """A run's module rows, line rows and what ran compiled."""

    modules: list[ModuleStats]
    lines: list[LineStats]
    compiled: dict[str, Any]


def assemble(parts: Sequence[Any], steps: Sequence[Any], gpu: bool) -> Assembled:
    """The run's rows from its files' ``attribution.FileAttribution`` and step rows: shares of the steps' GPU busy
    time (of their wall time without a GPU)."""
    if not parts:
        return Assembled([], [], {})
    total = sum(s.gpu_busy_us if gpu else s.wall_us for s in steps)
    return Assembled(
        module_rows((p.modules for p in parts), total, gpu),
        line_rows((p.lines for p in parts), total, gpu),
        compiled_facts(p.compiled for p in parts),
    )


def tree(rows: Sequence[ModuleStats], gpu: bool) -> list[dict[str, Any]]:
    """The module rows as a tree for the kprof tab: per module its forward, backward and total time (GPU time, or
    host time without a GPU; children included), its own, its share and calls, and its children by time; the rows
    that are no module after the model."""
    nodes: dict[str, dict[str, Any]] = {}
    for r in rows:
        node = nodes.setdefault(
            r.name,
            {
                "name": r.name,
                "label": label(r.name),
                "forward_us": 0.0,
                "backward_us": 0.0,
                "total_us": 0.0,
                "self_us": 0.0,
                "share": 0.0,
                "calls": 0,
                "children": [],
            },
        )
        time, own = (r.gpu_us, r.self_gpu_us) if gpu else (r.cpu_us, r.self_cpu_us)
        node["backward_us" if r.direction == "backward" else "forward_us"] += time
        node["total_us"] += time
        node["self_us"] += own
        node["share"] += r.share
        node["calls"] += r.calls if r.direction != "backward" else 0
    roots = []
    for name, node in nodes.items():
        parents = [p for p in ancestors(name) if p in nodes]
        (nodes[parents[0]]["children"] if parents else roots).append(node)
    for node in nodes.values():
        node["children"].sort(key=lambda n: -n["total_us"])
    return sorted(roots, key=lambda n: (not is_module(n["name"]), -n["total_us"]))
