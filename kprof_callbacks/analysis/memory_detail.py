"""The shown step of `memory_trace` in detail: its allocated-memory curve, its phases, its largest blocks alive at the
peak, its modules by kind, and the activations of its repeated modules (what activation checkpointing would free)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np

from . import memory_context as mc
from .events import ANNOTATION, Events
from .memory import BEFORE, KINDS, MemoryBlock, ModuleMemory, RepeatedModule
from .steps import Windows

if TYPE_CHECKING:
    from .memory_trace import _Blocks

_REPEATED = re.compile(r"^(?P<head>(?:.*?\.)?)(?P<index>\d+)(?:\.|$)")  # blocks.3.attn -> blocks., 3


def curve(time: np.ndarray, total: np.ndarray, mine: np.ndarray, start: int, points: int) -> list[list[float]]:
    """Allocated bytes over the step as [[us from its start, bytes], ...]: every event when they are few, else the
    lowest and the highest of each of ``points`` / 2 spans of time (the peak is always kept)."""
    idx = np.flatnonzero(mine)
    if not idx.size:
        return []
    t, y = (time[idx] - start) / 1e3, total[idx]
    if idx.size > points:
        span = np.minimum(((t - t[0]) / max(t[-1] - t[0], 1e-9) * (points // 2)).astype(np.int64), points // 2 - 1)
        keep = []
        for k in np.unique(span).tolist():
            part = np.flatnonzero(span == k)
            keep += sorted({int(part[np.argmin(y[part])]), int(part[np.argmax(y[part])])})
        t, y = t[keep], y[keep]
    return [[round(float(a), 3), int(b)] for a, b in zip(t.tolist(), y.tolist())]


def phases(time: np.ndarray, phase: np.ndarray, mine: np.ndarray, start: int) -> list[list]:
    """The step's stretches of one phase, from its memory events: [[phase, from us, to us], ...]."""
    idx = np.flatnonzero(mine)
    out: list[list] = []
    for i in idx.tolist():
        at = round(float(time[i] - start) / 1e3, 3)
        name = mc.PHASES[phase[i]]
        if out and out[-1][0] == name:
            out[-1][2] = at
        else:
            out.append([name, at, at])
    return out


def blocks(b: _Blocks, tl: Events, alive: np.ndarray, names: list[str], start: int, top: int) -> list[MemoryBlock]:
    """The ``top`` largest blocks alive at the peak, with what allocated them and when (from the step's start)."""
    s, n = b.sites, b.time.size
    size = np.abs(b.nbytes[alive])
    out = []
    for k in np.argsort(-size, kind="stable")[:top].tolist():
        i = int(alive[k])
        before = b.nbytes[i] < 0
        alloc = None if before else i
        freed = i if before else (int(b.partner[i]) if b.partner[i] < n else None)

        def name(ids: np.ndarray, at: int | None = alloc) -> str:
            return s.names[ids[at]] if at is not None and ids[at] >= 0 else ""

        out.append(
            MemoryBlock(
                bytes=int(size[k]),
                kind=KINDS[b.kind[i]],
                where=names[k],
                op=name(s.op),
                inner=name(s.inner),
                shapes=tl.shapes[s.shapes[i]] if alloc is not None and s.shapes[i] >= 0 else "",
                phase="" if before else mc.PHASES[s.phase[i]],
                allocated_us=None if before else round(float(b.time[i] - start) / 1e3, 3),
                freed_us=None if freed is None else round(float(b.time[freed] - start) / 1e3, 3),
            )
        )
    return out


def module_kinds(b: _Blocks, alive: np.ndarray, names: list[str], residual: dict[str, int]) -> list[ModuleMemory]:
    """Bytes alive at the peak by (module, kind), largest first; what the trace never saw allocated is under the
    blocks from before it."""
    totals: dict[tuple[str, str], int] = {}
    for name, kind, nbytes in zip(names, b.kind[alive].tolist(), np.abs(b.nbytes[alive]).tolist()):
        totals[name, KINDS[kind]] = totals.get((name, KINDS[kind]), 0) + nbytes
    for kind, nbytes in residual.items():
        if nbytes:
            totals[BEFORE, kind] = totals.get((BEFORE, kind), 0) + nbytes
    rows = [ModuleMemory(module, kind, nbytes) for (module, kind), nbytes in totals.items()]
    return sorted(rows, key=lambda r: (-r.bytes, r.module, r.kind))


def _forward_us(tl: Events, win: Windows, i: int) -> dict[str, float]:
    """Per module name, the time its ``kprof.module:`` ranges took in step window ``i`` (all calls)."""
    host = tl.host
    rows = np.flatnonzero(
        (host.kind == ANNOTATION)
        & (win.index_of(host.start) == i)
        & np.array([n.startswith(mc.MODULE_PREFIX) for n in tl.names] or [False], bool)[host.name]
    )
    out: dict[str, float] = {}
    for r in rows.tolist():
        name = tl.names[host.name[r]].removeprefix(mc.MODULE_PREFIX)
        out[name] = out.get(name, 0.0) + float(host.end[r] - host.start[r]) / 1e3
    return out


def repeated(b: _Blocks, tl: Events, alive: np.ndarray, names: list[str], win: Windows, i: int) -> list[RepeatedModule]:
    """Per instance of a repeated module (a numbered child: ``blocks.3``), the activations alive at the peak that it
    allocated, the last of them (its output) and its forward time; only families of at least two instances."""
    acts = b.kind[alive] == KINDS.index("activations")
    found: dict[str, list[int]] = {}
    for k in np.flatnonzero(acts).tolist():
        match = _REPEATED.match(names[k])
        if match:
            found.setdefault(f"{match['head']}{match['index']}", []).append(int(alive[k]))
    families: dict[str, list[str]] = {}
    for name in found:
        families.setdefault(f"{_REPEATED.match(name)['head']}*", []).append(name)
    times = _forward_us(tl, win, i)
    out = []
    for family, members in families.items():
        if len(members) < 2:
            continue
        for name in members:
            events = found[name]
            last = max(events, key=lambda e: b.time[e])
            total = int(np.abs(b.nbytes[events]).sum())
            out.append(RepeatedModule(name, family, total, int(b.nbytes[last]), round(times.get(name, 0.0), 3)))
    return sorted(out, key=lambda r: (r.family, _index(r.name)))


def _index(name: str) -> int:
    match = _REPEATED.match(name)
    return int(match["index"]) if match else 0
