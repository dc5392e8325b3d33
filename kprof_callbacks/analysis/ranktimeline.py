"""All ranks of a run in one step, on one clock: every rank's GPU streams (and, when asked, its main CPU thread)
stacked, each collective drawn in one colour on every rank that ran it with the part a rank spent waiting for the last
one to arrive, and the ranks the others wait for.

The traces are decoded by `slices.TraceSlices`, as for one file's timeline, and cut into the same step windows. The
clocks are aligned and the collectives matched as `ranks` does for the summary (host clock offsets from the ends of
the collectives ranks share; the n-th collective of a kind in a process group and step), so the picture and the
ranks table say the same. On a CPU-only run the lanes are each rank's step thread and the threads that carry its
collectives (gloo's).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import intervals as iv
from . import ranks
from .comm import KINDS as COLLECTIVES
from .comm import Transfers, group_parts
from .slices import DEVICE_KIND, KINDS, Lane, Slice, TraceSlices, median_step
from .svgtimeline import duration
from .tables import StepSkew

COLORS = ("#edc948", "#9467bd", "#17becf", "#e377c2", "#8c564b", "#bcbd22", "#d62728", "#2ca02c")
"""The collectives' colours, by their place in the step (none the kernels' blue or the operators' orange): neighbours
differ, and one collective has one colour on every rank."""
COLLAPSE_RANKS = 8  # more ranks than this: one busy row per rank in the HTML report
THREAD_ROWS = 3  # rows of a step thread kept: ProfilerStep#N, your labels, the operators right under them
_COMM, _KERNEL, _OPERATOR = KINDS.index("communication"), KINDS.index("kernel"), KINDS.index("operator")


@dataclasses.dataclass(frozen=True)
class RankLanes:
    """One rank in the merged step: its lanes (`first_lane`, `lanes` of them) and what it waited."""

    rank: int
    worker: str
    host: str
    clock_offset_ns: float  # its host clock minus rank 0's host's: subtracted from its times
    first_lane: int
    lanes: int
    waited_ns: float  # in this step's collectives, waiting for the last rank to arrive


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective as every rank that ran it ran it: the n-th `kind` in process group `group` of the step."""

    kind: str
    group: str
    order: int
    color: str
    last_rank: int  # the rank that arrived last
    lead_ns: float  # how long the others waited for it (its lead on their median arrival)


@dataclasses.dataclass
class RankStep:
    """One step of every rank, as one `Slice` whose times are ns from the earliest rank's step start on the aligned
    clock, with per event its collective (`coll`, an index into `collectives`, -1 for none) and the time at its start
    that the rank spent waiting for the last one (`wait`, ns)."""

    step: int
    piece: Slice
    coll: np.ndarray
    wait: np.ndarray
    ranks: list[RankLanes]
    collectives: list[Collective]
    straggler: tuple[int, float] | None  # (rank, how much longer it computed, us): the step's slowest to compute
    late: tuple[int, float] | None  # (rank, ns): the rank the others waited for longest in this step, and how long

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: `Slice.to_dict()` with the `coll` and `wait` columns, the ranks, collectives and marks."""
        out = self.piece.to_dict()
        out["events"].update(coll=self.coll.tolist(), wait=self.wait.tolist())
        straggler, late = self.straggler, self.late
        return dict(
            out,
            notes={str(i): self.note(i) for i in np.flatnonzero(self.coll >= 0).tolist()},
            ranks=[dataclasses.asdict(r) for r in self.ranks],
            collectives=[dataclasses.asdict(c) for c in self.collectives],
            straggler={"rank": straggler[0], "lag_us": straggler[1]} if straggler else None,
            late={"rank": late[0], "wait_ns": late[1]} if late else None,
        )

    def note(self, i: int) -> str:
        """What event `i` was as a collective: which, and how long its rank waited there for the last one ("" for
        an event that is none)."""
        if self.coll[i] < 0:
            return ""
        c = self.collectives[self.coll[i]]
        first = np.array([r.first_lane for r in self.ranks])
        rank = self.ranks[int(np.searchsorted(first, self.piece.lane[i], side="right")) - 1].rank
        group = f" in {c.group}" if c.group else ""
        if rank == c.last_rank:
            wait = f"arrived last, the others waited {duration(c.lead_ns)} for it"
        else:
            wait = f"waited {duration(self.wait[i])} for rank {c.last_rank}" if self.wait[i] else "no wait"
        return f"{c.kind} #{c.order + 1}{group} of step {self.step}: {wait}"

    def collapsed(self) -> RankStep:
        """One row per rank: when its GPU (on a CPU-only run, its step thread) was busy computing, and its
        collectives on top, coloured and with their waits: what a page of 64 ranks can show."""
        p = self.piece
        rank_of_lane = np.repeat(np.arange(len(self.ranks)), [r.lanes for r in self.ranks])
        parts, rows = [], []
        for k, r in enumerate(self.ranks):
            mine = rank_of_lane[p.lane] == k
            busy = mine & (p.kind >= DEVICE_KIND) & (p.kind != _COMM)
            name, kind = "GPU busy", _KERNEL
            if not busy.any():  # a CPU-only run: what runs under ProfilerStep#N on its step thread
                busy, name, kind = mine & (p.lane == r.first_lane) & (p.row == 1), "busy", _OPERATOR
            lo, hi = iv.union(p.start[busy], p.start[busy] + p.dur[busy])
            comm = np.flatnonzero(mine & (self.coll >= 0))
            parts.append((lo, hi - lo, name, kind, comm))
            rows.append(RankLanes(**dict(dataclasses.asdict(r), first_lane=k, lanes=1)))
        return _collapse(self, parts, rows)


def _collapse(s: RankStep, parts: list, rows: list[RankLanes]) -> RankStep:
    """`RankStep.collapsed`'s step from each rank's busy intervals and collective events."""
    p = s.piece
    names = [*p.names, "GPU busy", "busy"]
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("lane", "start", "dur", "name", "kind", "coll", "wait")}
    for lane, (start, dur, name, kind, comm) in enumerate(parts):
        for key, busy, events in (
            ("lane", np.full(start.size, lane), np.full(comm.size, lane)),
            ("start", start, p.start[comm]),
            ("dur", dur, p.dur[comm]),
            ("name", np.full(start.size, names.index(name)), p.name[comm]),
            ("kind", np.full(start.size, kind), p.kind[comm]),
            ("coll", np.full(start.size, -1), s.coll[comm]),
            ("wait", np.zeros(start.size), s.wait[comm]),
        ):
            cols[key] += [busy, events]
    c = {k: np.concatenate(v) for k, v in cols.items()}
    lanes = [Lane(f"rank {r.rank}", "rank", 1) for r in rows]
    piece = dataclasses.replace(p, lanes=lanes, names=names, **_events(c, np.zeros(c["start"].size, np.int32)))
    return dataclasses.replace(s, piece=piece, coll=c["coll"].astype(np.int32), wait=c["wait"], ranks=rows)


def _events(c: dict[str, np.ndarray], row: np.ndarray) -> dict[str, Any]:
    """A Slice's event columns from the merged columns ``c`` (lane, start, dur, name, kind) on rows ``row``: no shapes,
    parents or links (a merged step draws spans, not their nesting)."""
    n = c["start"].size
    return {
        "shapes": [],
        "lane": c["lane"].astype(np.int32),
        "row": row,
        "start": c["start"].astype(np.int64),
        "dur": c["dur"].astype(np.int64),
        "name": c["name"].astype(np.int32),
        "kind": c["kind"].astype(np.int8),
        "shape": np.full(n, -1, np.int32),
        "parent": np.full(n, -1, np.int32),
        "link": np.full(n, -1, np.int32),
    }


def _in_step(t: Transfers, number: int) -> Transfers:
    pick = t.step == number
    return Transfers(t.step[pick], t.kind[pick], t.order[pick], t.start[pick], t.end[pick], t.group[pick], t.groups)


class RunSlices:
    """The trace files of a run's ranks, decoded for the merged timeline, and their host clocks' offsets (from the
    collectives of all their steps, as the summary's ranks table has them)."""

    def __init__(self, files: Sequence[Path], read: Callable[[Path], TraceSlices] = TraceSlices.read) -> None:
        self.by_rank: dict[int, list[TraceSlices]] = {}
        for path in files:
            decoded = read(path)
            if decoded.rank is not None:
                self.by_rank.setdefault(decoded.rank, []).append(decoded)
        if not self.by_rank:
            raise ValueError("no trace file of the run names its rank (rank<R>_<host>_<pid>): nothing to line up")
        self.by_rank = dict(sorted(self.by_rank.items()))
        workers = [ranks.Worker(r, t[0].worker, [], [s.transfers for s in t]) for r, t in self.by_rank.items()]
        m = ranks.match(workers)
        offsets = ranks.clock_offsets(m) if m is not None else np.zeros(0)
        self.offsets = {r: 0.0 for r in self.by_rank} | dict(zip(m.ranks if m else [], offsets.tolist()))

    def steps(self) -> list[tuple[int, float]]:
        """(step number, rank 0's wall time in us) of the steps that every rank profiled, in order."""
        common = set.intersection(*({w.step for t in ts for w in t.steps()} for ts in self.by_rank.values()))
        first = next(iter(self.by_rank.values()))
        return sorted({w.step: w.wall_us for t in first for w in t.steps() if w.step in common}.items())

    def default_step(self) -> int:
        """The median step (by rank 0's wall time) of those every rank profiled; KeyError when there is none."""
        steps = self.steps()
        if not steps:
            raise KeyError("the ranks profiled no step in common")
        return median_step(steps)

    def step(self, number: int, *, cpu: bool = False, skew: Sequence[StepSkew] = ()) -> RankStep:
        """Step `number` of every rank that profiled it (KeyError when none did), with its main CPU thread when `cpu`
        (a CPU-only run always shows it); `skew`: the summary's slowest rank per step, which marks the straggler."""
        pieces = {}
        for rank, decoded in self.by_rank.items():
            having = [t for t in decoded if number in {w.step for w in t.steps()}]
            if having:
                pieces[rank] = (having[0], having[0].step(number))
        if not pieces:
            raise KeyError(f"no rank profiled step {number}")
        shift = {r: piece.start_ns - self.offsets[r] for r, (_, piece) in pieces.items()}
        origin = min(shift.values())
        span = max(shift[r] + piece.span_ns for r, (_, piece) in pieces.items()) - origin
        merged = _Merger(number, int(span))
        for rank, (decoded, piece) in pieces.items():
            merged.add(rank, decoded, piece, int(shift[rank] - origin), cpu)
        workers = [
            ranks.Worker(r, decoded.worker, [], [_in_step(decoded.transfers, number)])
            for r, (decoded, _) in pieces.items()
        ]
        slowest = next(((k.slowest_rank, k.lag_us) for k in skew if k.step == number), None)
        return merged.finish(ranks.match(workers), self.offsets, slowest)


class _Merger:
    """Collects every rank's lanes of one step into one Slice, then matches their collectives."""

    def __init__(self, number: int, span: int) -> None:
        self.number, self.span = number, span
        self.lanes: list[Lane] = []
        self.names: dict[str, int] = {}
        self.cols: dict[str, list[np.ndarray]] = {k: [] for k in ("lane", "row", "start", "dur", "name", "kind")}
        self.rows: list[RankLanes] = []
        self.carriers: dict[tuple[int, int, int], int] = {}  # (rank, start, end) on its own clock -> event
        self.count = 0

    def add(self, rank: int, decoded: TraceSlices, piece: Slice, shift: int, cpu: bool) -> None:
        """Rank `rank`'s step `piece`, its times moved by `shift` onto the merged clock."""
        t = _in_step(decoded.transfers, self.number)
        carried = set(zip((t.start - piece.start_ns).tolist(), (t.end - t.start).tolist()))
        keyed = list(zip(piece.start.tolist(), piece.dur.tolist()))
        carries = np.array([k in carried for k in keyed], bool).reshape(-1)
        streams = [k for k, lane in enumerate(piece.lanes) if lane.kind == "stream"]
        threads = [0] if piece.lanes and piece.lanes[0].kind == "thread" and (cpu or not streams) else []
        if not streams:  # gloo: the threads that carry its collectives
            threads += sorted(set(piece.lane[carries].tolist()) - set(threads))
        shown = threads + streams
        keep = np.isin(piece.lane, shown) & ((piece.lane != 0) | (piece.row < THREAD_ROWS))
        new_lane = np.full(max(len(piece.lanes), 1), -1)
        new_lane[shown] = np.arange(len(shown)) + len(self.lanes)
        self.rows.append(RankLanes(rank, decoded.worker, ranks.host_of(decoded.worker), 0.0, len(self.lanes), 0, 0.0))
        for k in shown:
            lane = piece.lanes[k]
            rows = min(lane.rows, THREAD_ROWS) if k == 0 and lane.kind == "thread" else lane.rows
            self.lanes.append(Lane(f"rank {rank} · {lane.name}", lane.kind, rows))
        ids = np.array([self.names.setdefault(n, len(self.names)) for n in piece.names], np.int32)
        pick = np.flatnonzero(keep)
        for key, value in (
            ("lane", new_lane[piece.lane[pick]]),
            ("row", piece.row[pick]),
            ("start", piece.start[pick] + shift),
            ("dur", piece.dur[pick]),
            ("name", ids[piece.name[pick]] if ids.size else piece.name[pick]),
            ("kind", piece.kind[pick]),
        ):
            self.cols[key].append(value)
        for j in np.flatnonzero(carries[pick]).tolist():
            i = int(pick[j])
            self.carriers[(rank, int(piece.start[i]) + piece.start_ns, int(piece.dur[i]))] = self.count + j
        self.count += pick.size

    def finish(self, m: ranks.Matched | None, offsets: dict[int, float], slowest: tuple[int, float] | None) -> RankStep:
        c = {k: np.concatenate(v) if v else np.zeros(0, np.int64) for k, v in self.cols.items()}
        n = c["start"].size
        piece = Slice(
            file="",
            worker="",
            step=self.number,
            start_ns=0,
            span_ns=self.span,
            lanes=[dataclasses.replace(lane, rows=max(lane.rows, 1)) for lane in self.lanes],
            names=list(self.names),
            **_events(c, c["row"].astype(np.int32)),
        )
        coll, wait = np.full(n, -1, np.int32), np.zeros(n)
        collectives, waited, late = self._collectives(m, offsets, coll, wait)
        rows = [
            dataclasses.replace(
                r, clock_offset_ns=offsets.get(r.rank, 0.0), lanes=self._lanes_of(k), waited_ns=waited.get(r.rank, 0.0)
            )
            for k, r in enumerate(self.rows)
        ]
        return RankStep(self.number, piece, coll, wait, rows, collectives, slowest, late)

    def _lanes_of(self, k: int) -> int:
        end = self.rows[k + 1].first_lane if k + 1 < len(self.rows) else len(self.lanes)
        return end - self.rows[k].first_lane

    def _collectives(
        self, m: ranks.Matched | None, offsets: dict[int, float], coll: np.ndarray, wait: np.ndarray
    ) -> tuple[list[Collective], dict[int, float], tuple[int, float] | None]:
        """The matched collectives; fills `coll` and `wait` of the events that carried them. Returns them, each
        rank's wait in the step, and the rank the others waited for longest (with that wait)."""
        if m is None or not m.step.size:
            return [], {}, None
        a = ranks.arrival_times(m, np.array([offsets.get(r, 0.0) for r in m.ranks]))
        out = []
        for j in range(m.keys.shape[0]):
            _, group, kind, order = m.keys[j].tolist()
            last = int(a.last[j])
            out.append(
                Collective(
                    COLLECTIVES[kind],
                    group_parts(m.groups[group])[0],
                    order,
                    COLORS[j % len(COLORS)],
                    m.ranks[last],
                    float(a.lead[j]),
                )
            )
            for i, rank in enumerate(m.ranks):
                if np.isnan(m.start[i, j]):
                    continue
                event = self.carriers.get((rank, int(m.start[i, j]), int(m.end[i, j] - m.start[i, j])))
                if event is not None:
                    coll[event], wait[event] = j, max(float(a.waited[i, j]), 0.0)
        waited = {rank: float(np.nansum(a.waited[i])) for i, rank in enumerate(m.ranks)}
        blame = {rank: float(np.nansum(a.lead[a.last == i])) for i, rank in enumerate(m.ranks)}
        worst = max(blame, key=blame.__getitem__)
        return out, waited, (worst, blame[worst]) if blame[worst] > 0 else None
