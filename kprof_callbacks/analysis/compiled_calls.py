"""Compiled graph calls in a trace: their GPU kernels matched to the session's record (``graphs.py``), time shared
by the recorded calls' modules and lines, and what ran compiled (Dynamo frames, graph breaks, recompilations)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import graphs as recorded
from .events import Events
from .owners import (
    BACKWARD,
    DATA,
    DIRECTIONS,
    FORWARD,
    GRAPH,
    NEITHER,
    OPTIMIZER,
    OUTSIDE,
    REGION,
    UNATTRIBUTED,
    Owners,
    Shares,
    Table,
    nearest,
)
from .steps import Windows


def _joined(context: str, name: str) -> str:
    return f"{context}.{name}" if context and name else context or name


class CompiledCalls:
    """The kernels of compiled graph calls, matched to the record (see graphs.py), and what ran compiled."""

    def __init__(self, tl: Events, owners: Owners, table: Table, record: recorded.Record | None) -> None:
        self.tl, self.owners, self.table = tl, owners, table
        self.record = record or recorded.Record((), (), ())
        self.graph_of: dict[int, int] = {}  # a graph call event -> the recorded graph it ran (-1: none)
        self.by_graph: dict[str, np.ndarray] = {}  # a graph's label -> [calls, GPU us, of which matched] in the steps
        self._matches: dict[tuple, tuple[int, np.ndarray]] = {}
        self._targets: dict[tuple, list[tuple[int, float]]] = {}
        self._ranges = {table[OPTIMIZER], table[DATA]}  # rows of no pass
        names = tl.names
        regions = np.array([bool(REGION.match(n)) for n in names] or [False])[tl.host.name]
        self.region = nearest(owners.tree, regions, owners.by_level) if regions.any() else np.full(regions.size, -1)

    def kernels(
        self, dev: np.ndarray, call: np.ndarray, step: np.ndarray, shares: Shares, lines: Shares, line_table: Table
    ) -> np.ndarray:
        """Share the GPU time of device events ``dev`` (launched in graph calls ``call``); returns each one's matched
        (graph, call) as one number, graph * 2**32 + call, -1 for none."""
        tl, out = self.tl, np.full(dev.size, -1, np.int64)
        order = np.lexsort((tl.device.start[dev], call))
        dev, call, step = dev[order], call[order], step[order]
        bounds = np.flatnonzero(np.diff(call)) + 1
        context, _ = self.owners.context(np.unique(call))
        where = dict(zip(np.unique(call).tolist(), context.tolist()))
        dur = (tl.device.end[dev] - tl.device.start[dev]) / 1000.0
        for lo, hi in zip(np.concatenate([[0], bounds]).tolist(), np.concatenate([bounds, [dev.size]]).tolist()):
            g = int(call[lo])
            graph, calls = self._match(g, [tl.names[k] for k in tl.device.name[dev[lo:hi]].tolist()])
            out[order[lo:hi]] = np.where(calls >= 0, graph * 2**32 + calls, -1)
            self._share(graph, calls, where[g], dur[lo:hi], step[lo:hi], shares, lines, line_table)
            inside = step[lo:hi] >= 0
            if inside.any():
                label = self.record.graphs[graph].label if graph >= 0 else NOT_RECORDED
                seen = [1.0, dur[lo:hi][inside].sum(), dur[lo:hi][inside & (calls >= 0)].sum()]
                self.by_graph[label] = self.by_graph.get(label, np.zeros(3)) + seen
        return out

    def unlaunched(
        self, dev: np.ndarray, step: np.ndarray, shares: Shares, lines: Shares, line_table: Table
    ) -> np.ndarray:
        """Share the GPU time of device events ``dev`` whose launch the trace lacks (the queue steps before the window
        left: on a busy GPU, under CUDA graphs, the rest of a replay launched before it) by the record, as one
        instance in start order run by the model; returns each one's matched call as ``kernels`` does. Without a
        record, or where no recorded kernel matches, it is unattributed."""
        order = np.argsort(self.tl.device.start[dev], kind="stable")
        names = [self.tl.names[k] for k in self.tl.device.name[dev[order]].tolist()]
        graph = recorded.best_graph(self.record, names)
        calls = recorded.align(self.record.graphs[graph].calls, names) if graph >= 0 else np.full(len(names), -1)
        dur = (self.tl.device.end - self.tl.device.start)[dev[order]] / 1000.0
        self._share(graph, calls, -1, dur, step[order], shares, lines, line_table)
        out = np.full(dev.size, -1, np.int64)
        out[order] = np.where(calls >= 0, graph * 2**32 + calls, -1)
        return out

    def relabel(self) -> None:
        """Name each compiled graph call after the graph it ran: ``## Call CompiledFxGraph <key> ## GPT.forward
        (backward)`` in the operator tables."""
        host, names = self.tl.host, self.tl.names
        index = {n: k for k, n in enumerate(names)}
        for event, graph in self.graph_of.items():
            if graph >= 0:
                name = f"{names[host.name[event]]} {self.record.graphs[graph].label}"
                if name not in index:
                    index[name] = len(names)
                    names.append(name)
                host.name[event] = index[name]

    def _match(self, event: int, names: list[str]) -> tuple[int, np.ndarray]:
        region = self.region[event]
        hint = REGION.match(self.tl.names[self.tl.host.name[region]]) if region >= 0 else None
        key = (tuple(names), f"{hint[1]}/{hint[2]}" if hint else "")
        if key not in self._matches:
            graph = recorded.best_graph(self.record, names, key[1])
            calls = recorded.align(self.record.graphs[graph].calls, names) if graph >= 0 else np.full(len(names), -1)
            self._matches[key] = graph, calls
        self.graph_of[event] = self._matches[key][0]
        return self._matches[key]

    def _share(self, graph, calls, context, dur, step, shares, lines, line_table) -> None:
        unmatched = calls < 0
        shares.add(self.table[UNATTRIBUTED], DIRECTIONS.index(NEITHER), step[unmatched], gpu=dur[unmatched])
        if graph < 0:
            return
        direction = DIRECTIONS.index(BACKWARD if self.record.graphs[graph].backward else FORWARD)
        for c in np.unique(calls[~unmatched]).tolist():
            mine = calls == c
            for target, weight in self.targets_of(graph, c, context):
                way = DIRECTIONS.index(NEITHER) if target in self._ranges else direction
                shares.add(target, way, step[mine], gpu=dur[mine] * weight)
            for line, weight in self.record.graphs[graph].calls[c].lines:
                where, code = self.record.lines[line]
                lines.add(line_table[f"{short_path(where)} {code}"], direction, step[mine], gpu=dur[mine] * weight)

    def targets_of(self, graph: int, call: int, context: int) -> list[tuple[int, float]]:
        """The targets (and weights) of one recorded call run inside ``context`` (the target around the graph call:
        a module, an optimizer's step, ...; -1 for none). Paths relative to the compiled root join the module around
        it. A call of no module is the compiled root's: the module around it, or the model; in a graph of no module at
        all (a compiled optimizer step, a free function), what is around it."""
        key = (graph, call, context)
        if key not in self._targets:
            names = self.table.names
            around = names[context] if context >= 0 else OUTSIDE
            outer = "" if around.startswith("(") else around
            found = self.record.graphs[graph].calls[call].modules
            free = not any(c.modules for c in self.record.graphs[graph].calls)
            fallback = self.table[around if free else outer]
            self._targets[key] = [
                (self.table[_joined(outer, name) if relative else name], w)
                for (name, relative), w in ((self.record.modules[m], w) for m, w in found)
            ] or [(fallback, 1.0)]
        return self._targets[key]

    def summary(self, steps: Windows) -> dict:
        """What ran compiled: per recorded graph (by label) its calls; the Dynamo frames that ran a compiled graph in
        each step (a frame Dynamo compiled to no graph, a function it only guards, is none), the recompiled ones
        (``N/M``, M > 0) and the frames that resume after a graph break; and the record's note."""
        host, names = self.tl.host, self.tl.names
        calls = np.flatnonzero(self.owners.kind == GRAPH)
        regions = np.unique(self.region[calls][self.region[calls] >= 0])
        step = steps.index_of(host.start[regions])
        frames: dict[int, set] = {}
        compiled_ids = set()
        for r, k in zip(regions[step >= 0].tolist(), step[step >= 0].tolist()):
            found = REGION.match(names[host.name[r]])
            frames.setdefault(k, set()).add(int(found[1]))
            compiled_ids.add((int(found[1]), int(found[2])))
        functions = {g.compile_id: g.function for g in self.record.graphs}
        return {
            "frames": {str(k): sorted(v) for k, v in frames.items()},
            "recompiled": sorted(f"{n}/{m}" for n, m in compiled_ids if m > 0),
            "resumed": sorted({f"{n}/{m}" for n, m in compiled_ids if _RESUME in functions.get(f"{n}/{m}", "")}),
            "functions": {f"{n}/{m}": functions.get(f"{n}/{m}", "") for n, m in sorted(compiled_ids)},
            "graphs": {k: v.tolist() for k, v in self.by_graph.items()},
            "note": self.record.note,
        }


_RESUME = "torch_dynamo_resume_in_"  # the function Dynamo makes of the code after a graph break
NOT_RECORDED = "(not in the record)"  # graph calls whose kernels match no recorded graph


def short_path(where: str) -> str:
    """``/home/me/proj/model.py:12`` -> ``proj/model.py:12``: a source location short enough for a table."""
    path, _, line = where.rpartition(":")
    parts = Path(path).parts
    return f"{'/'.join(parts[-2:])}:{line}"
