"""Multi-rank view: per rank compute vs communication and their overlap, and the straggler.

In data-parallel training every rank waits for the slowest one inside the collective, so
step wall times look alike across ranks; the straggler shows in *compute* time (and in
the others' longer communication). Ranks are matched step by step on ProfilerStep#N.

Who arrives last at each collective needs the ranks' clocks on one time line. Ranks of one host share a clock;
hosts do not. A collective ends at about the same moment on every rank (each waits for the last to arrive, then all
finish together), so the offset of a host's clock is the median, over the collectives it shares with the reference
host (rank 0's), of the difference between their ends. Collectives are matched as the n-th transfer of a collective
in step N (every rank issues the same sequence).
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter, defaultdict

import numpy as np

from . import fmt
from .comm import Transfers
from .steps import WHOLE_TRACE, StepTimes
from .tables import Diagnostic, RankStats, StepSkew

STRAGGLER_LAG = 0.10  # straggler: computes this part longer than the others (median)
LATE_SHARE = 0.5  # late rank: the others spend half their waiting on it (and 1.3x its fair share: 65% with 2 ranks)
LATE_WAIT = 0.10  # either: the others wait for it this part of a step


@dataclasses.dataclass
class Worker:
    """The traces of one rank (or one non-distributed process), possibly several profiling cycles."""

    rank: int | None
    worker: str
    times: list[StepTimes]
    transfers: list[Transfers] = dataclasses.field(default_factory=list)


def workers_of(files: list[tuple[int | None, str, StepTimes, Transfers]]) -> list[Worker]:
    """The run's ranks (or processes) from its files' (rank, worker, step times, transfers), rank by rank: the files
    of a rank (one per profiling cycle) go together."""
    workers: dict[tuple, Worker] = {}
    for rank, name, times, transfers in files:
        key = ("rank", rank) if rank is not None else ("worker", name)
        worker = workers.setdefault(key, Worker(rank, name, []))
        worker.times.append(times)
        worker.transfers.append(transfers)
    return sorted(workers.values(), key=lambda w: (w.rank is None, w.rank or 0, w.worker))


def rank_stats(workers: list[Worker]) -> list[RankStats]:
    """Means per step for each worker, with its arrivals at the collectives it shares with other ranks."""
    arrived = arrivals(workers)
    out = []
    for w in workers:
        rows = [r for t in w.times for r in t.rows]
        wall = np.array([r.wall_us for r in rows])
        gpu = any(r.gpu_busy_us for r in rows)
        compute, comm, overlap = (
            np.concatenate([getattr(t, f) for t in w.times]) for f in ("compute_us", "comm_us", "overlap_us")
        )
        out.append(
            RankStats(
                rank=w.rank,
                worker=w.worker,
                steps=int(wall.size),
                step_us=float(wall.mean()),
                compute_us=float(compute.mean()),
                comm_us=float(comm.mean()),
                overlap_us=float(overlap.mean()),
                exposed_comm_us=float((comm - overlap).mean()),
                host_only_us=float(np.mean([r.cpu_only_us for r in rows])) if gpu else 0.0,
                **arrived.get(w.rank, {}),
            )
        )
    return sorted(out, key=lambda r: (r.rank is None, r.rank if r.rank is not None else 0, r.worker))


def step_skew(workers: list[Worker]) -> list[StepSkew]:
    """For each step number seen on two or more ranks: the rank that computed longest."""
    if len(workers) < 2 or any(w.rank is None for w in workers):
        return []
    per_step: dict[int, dict[int, float]] = defaultdict(dict)
    for w in workers:
        for t in w.times:
            for n, c in zip(t.windows.number.tolist(), t.compute_us.tolist()):
                if n != WHOLE_TRACE:
                    per_step[n][w.rank] = per_step[n].get(w.rank, 0.0) + c
    return skew_of(per_step)


def skew_of(per_step: dict[int, dict[int, float]]) -> list[StepSkew]:
    """`per_step`: step number -> rank -> its compute (us)."""
    out = []
    for step in sorted(per_step):
        by_rank = per_step[step]
        if len(by_rank) < 2:
            continue
        slowest = max(by_rank, key=by_rank.__getitem__)
        others = float(np.median([c for r, c in by_rank.items() if r != slowest]))
        out.append(StepSkew(step, slowest, by_rank[slowest], others, by_rank[slowest] - others))
    return out


def ended_early(files: list[tuple[int | None, StepTimes]]) -> tuple[set[int], list[Diagnostic]]:
    """Ranks that stopped before the others (one died half-way, or its traces were lost): the files (indices) whose
    last step the rank's end cut in mid-step, to be left out of every average, and a warning per such rank.

    A rank's last file is cut when another rank's trace of the same window holds more steps and goes on past its
    last one, unless the file ended with the empty range torch closes when a window stops between two steps (its
    last step is whole then). A rank is named when a file of it is cut, or when other ranks recorded a whole window
    after its last step; ranks whose own triggers start windows a step apart are neither."""
    ranked = [(i, r, t) for i, (r, t) in enumerate(files) if r is not None and t.rows and t.rows[0].step != WHOLE_TRACE]
    last: dict[int, int] = {}
    for _, rank, t in ranked:
        last[rank] = max(last.get(rank, t.rows[-1].step), t.rows[-1].step)
    if len(last) < 2:
        return set(), []
    cut = {i for i, rank, t in ranked if t.rows[-1].step == last[rank] and _went_on(rank, t, ranked)}
    found = []
    for rank, end in sorted(last.items()):
        later = [(r, t) for _, r, t in ranked if r != rank and t.rows[-1].step > end]
        if not (any(t.rows[0].step > end for _, t in later) or any(i in cut for i, r, _ in ranked if r == rank)):
            continue
        missing = fmt.ranges(s.step for _, t in later for s in t.rows if s.step > end)
        cut_note = (
            f"its step {end} was cut in mid-step and is left out; "
            if any(i in cut for i, r, _ in ranked if r == rank)
            else ""
        )
        found.append(
            Diagnostic(
                "rank_ended_early",
                "warning",
                f"Rank {rank} ended before the others: {cut_note}it has no trace of steps {missing}, which "
                f"{_ranks(sorted({r for r, _ in later}))} recorded. Did it die, or were its traces lost? Its averages "
                "cover only the steps it recorded whole.",
            )
        )
    return cut, found


def _went_on(rank: int, t: StepTimes, ranked: list[tuple[int, int, StepTimes]]) -> bool:
    """Whether another rank's trace of the window ``t`` ends in holds more steps and goes on past ``t``'s last."""
    if t.stopped_between_steps or len(t.rows) < 2:  # a rank keeps a step of each file
        return False
    end = t.rows[-1].step
    for _, other, o in ranked:
        steps = {s.step for s in o.rows}
        if other != rank and end in steps and end + 1 in steps and len(o.rows) > len(t.rows):
            return True
    return False


def _ranks(numbers: list[int]) -> str:
    return f"rank {numbers[0]}" if len(numbers) == 1 else f"ranks {fmt.ranges(numbers)}"


def host_of(worker: str) -> str:
    """The host in a worker name (`rank3_node7_4211` -> `node7`; torch's own `node7_4211` -> `node7`)."""
    return re.sub(r"_\d+$", "", re.sub(r"^rank\d+_", "", worker))


@dataclasses.dataclass
class Matched:
    """The transfers matched across ranks: one column per collective seen on two or more ranks (ns)."""

    ranks: list[int]
    hosts: list[str]
    start: np.ndarray  # (ranks, collectives), NaN where a rank lacks it
    end: np.ndarray
    keys: np.ndarray  # (collectives, 4): step number, process group (index into `groups`), KINDS index, order
    groups: list[str]  # `eventcolumns.group_text` of each process group ("" where the traces do not say)

    @property
    def step(self) -> np.ndarray:
        return self.keys[:, 0]


def match(workers: list[Worker]) -> Matched | None:
    """The collectives that two or more ranks of `workers` ran, matched as the n-th of a collective in a process
    group and step (None with fewer than two ranks that communicate)."""
    ranked = [w for w in workers if w.rank is not None and w.transfers]
    if len(ranked) < 2:
        return None
    groups: dict[str, int] = {}  # process groups by `eventcolumns.group_text`: alike on every rank of one group
    keys = [np.concatenate([_keys(t, groups) for t in w.transfers]) for w in ranked]
    columns, column, counts = np.unique(np.concatenate(keys), axis=0, return_inverse=True, return_counts=True)
    shared = counts >= 2
    index = np.cumsum(shared) - 1  # column number among the shared ones
    start, end = np.full((2, len(ranked), int(shared.sum())), np.nan)
    at = 0
    for i, (w, key) in enumerate(zip(ranked, keys)):
        mine = column.reshape(-1)[at : at + len(key)]
        at += len(key)
        ok = shared[mine]
        start[i, index[mine[ok]]] = np.concatenate([t.start for t in w.transfers])[ok]
        end[i, index[mine[ok]]] = np.concatenate([t.end for t in w.transfers])[ok]
    hosts = [host_of(w.worker) for w in ranked]
    return Matched([w.rank for w in ranked], hosts, start, end, columns[shared], list(groups))


def _keys(t: Transfers, groups: dict[str, int]) -> np.ndarray:
    """One row per transfer that is alike on every rank that runs it: step, process group, collective, order."""
    group = np.array([groups.setdefault(g, len(groups)) for g in t.groups], np.int64)
    return np.stack([t.step, group[t.group] if group.size else t.group, t.kind, t.order], axis=1).reshape(-1, 4)


def clock_offsets(m: Matched) -> np.ndarray:
    """Per rank of `m`: its host clock minus the reference host's (ns; 0 on the reference host, and where the host
    shares no collective with it)."""
    ref = int(np.argmin(m.ranks))
    offsets = np.zeros(len(m.ranks))
    for host in set(m.hosts) - {m.hosts[ref]}:
        mine = [i for i, h in enumerate(m.hosts) if h == host]
        diffs = (m.end[mine] - m.end[ref]).ravel()
        diffs = diffs[~np.isnan(diffs)]
        if diffs.size:
            offsets[mine] = np.median(diffs)
    return offsets


@dataclasses.dataclass
class Arrivals:
    """The matched collectives on aligned clocks (ns; rows: ranks of `Matched`, columns: collectives, NaN where a rank
    lacks one): when each rank arrived, how long it waited there for the last rank, who came last and how long the
    others waited for that one (its lead on their median arrival)."""

    start: np.ndarray
    end: np.ndarray
    waited: np.ndarray
    last: np.ndarray  # per column: row of the rank that arrived last
    lead: np.ndarray  # per column: the others' wait for it


def arrival_times(m: Matched, offsets: np.ndarray) -> Arrivals:
    """`m` on the clock of the reference host, given each rank's `clock_offsets`."""
    start, end = m.start - offsets[:, None], m.end - offsets[:, None]
    present = ~np.isnan(start)
    took = m.end - m.start
    waited = np.fmin(np.nanmax(start, axis=0) - start, took)  # no longer than its transfer lasted
    last = np.argmax(np.where(present, start, -np.inf), axis=0)
    columns = np.arange(last.size)
    rest, rest_took = start.copy(), took.copy()
    rest[last, columns] = rest_took[last, columns] = np.nan
    lead = np.fmin(start[last, columns] - np.nanmedian(rest, axis=0), np.nanmedian(rest_took, axis=0))
    return Arrivals(start, end, waited, last, lead)


def arrivals(workers: list[Worker]) -> dict[int, dict[str, float]]:
    """Per rank, its RankStats arrival fields: at each collective shared by two or more ranks, on aligned clocks,
    how long it waited for the last rank, and how long the others waited for it where it was the last."""
    m = match(workers)
    if m is None or not m.step.size:
        return {}
    offsets = clock_offsets(m)
    a = arrival_times(m, offsets)
    present = ~np.isnan(a.start)
    out = {}
    for i, rank in enumerate(m.ranks):
        steps = max(np.unique(m.step[present[i]]).size, 1)
        out[rank] = {
            "collectives": int(present[i].sum()),
            "waited_us": float(np.nansum(a.waited[i]) / steps / 1000.0),
            "late_us": float(np.nansum(a.lead[a.last == i]) / steps / 1000.0),
            "clock_offset_us": float(offsets[i] / 1000.0),
        }
    return out


def findings(ranks: list[RankStats], skew: list[StepSkew]) -> list[Diagnostic]:
    """The ranks the others wait for, and why: the one that computes longest (`straggler`) and the one whose time goes
    outside computation (`late_rank`), each when the others' wait for it is long enough to matter. Where ranks share
    collectives the wait is measured (`late_us`); elsewhere a straggler's extra computation stands for it."""
    found = [f for f in (_straggler(ranks, skew), _late_rank(ranks)) if f]
    if len(found) == 2 and found[0][0] == found[1][0]:
        del found[0]  # one rank, computing a little longer but waited for far longer: late_rank says both
    return [d for _, d in found]


def _straggler(ranks: list[RankStats], skew: list[StepSkew]) -> tuple[int, Diagnostic] | None:
    """The rank slowest to compute in at least half the steps, by STRAGGLER_LAG of the others' computation, which
    they wait for at least LATE_WAIT of a step. Where waits are measured, its computation must explain at least half
    of theirs: otherwise its time goes elsewhere, and `late_rank` says so."""
    if not skew:
        return None
    rank, times = Counter(s.slowest_rank for s in skew).most_common(1)[0]
    mine = [s for s in skew if s.slowest_rank == rank]
    lag = sum(s.lag_us for s in mine) / len(mine)
    base = sum(s.median_compute_us for s in mine) / len(mine)
    me = next((r for r in ranks if r.rank == rank), None)
    measured = me is not None and any(r.collectives for r in ranks)
    waited = me.late_us if measured else lag
    step = float(np.mean([r.step_us for r in ranks]))
    if (
        times * 2 < len(skew)
        or not base
        or lag < STRAGGLER_LAG * base
        or waited < LATE_WAIT * step
        or (measured and lag < waited / 2)
    ):
        return None
    wait = (
        f"the others wait {fmt.duration(waited)} per step for it in the collectives ({fmt.share(waited / step)} of the "
        "step)"
        if measured
        else "the others wait for it in the collectives"
    )
    return rank, Diagnostic(
        "straggler",
        "warning",
        (
            f"Rank {rank} is the straggler: slowest in {times} of {len(skew)} steps, computing "
            f"{fmt.duration(lag)} (+{fmt.share(lag / base)}) longer than the other ranks (median); {wait}. Check "
            "uneven batch sizes or sequence lengths, its data loading, and its GPU (clocks, temperature, other "
            "processes)."
        ),
    )


def _late_rank(ranks: list[RankStats]) -> tuple[int, Diagnostic] | None:
    """A rank the others wait for although it computes no longer than they do: most of their waiting is for it (more
    than by chance), long enough to matter, and not explained by its computation: its time goes elsewhere."""
    shared = [r for r in ranks if r.collectives]
    blame = sum(r.late_us for r in shared)
    if len(shared) < 2 or not blame:
        return None
    late = max(shared, key=lambda r: r.late_us)
    step = float(np.mean([r.step_us for r in shared]))
    compute_lag = late.compute_us - float(np.median([r.compute_us for r in shared if r is not late]))
    if (
        late.late_us < max(LATE_SHARE, 1.3 / len(shared)) * blame
        or late.late_us < LATE_WAIT * step
        or compute_lag >= late.late_us / 2
    ):
        return None
    hosts = len({r.clock_offset_us for r in shared})
    waited = (
        f"Rank {late.rank} is the one the others wait for: {fmt.duration(late.late_us)} per step "
        f"({fmt.share(late.late_us / step)} of the step, {fmt.share(late.late_us / blame)} of all waiting for "
        f"a last rank; clocks aligned across {hosts} host clock{'s' * (hosts != 1)})"
    )
    return late.rank, Diagnostic("late_rank", "warning", waited + _late_cause(late, shared, compute_lag))


_HOST_ADVICE = "Look at its data loading, host-side work between steps and its CPU (other processes, fewer cores)."


def _late_cause(late: RankStats, shared: list[RankStats], compute_lag: float) -> str:
    """What the late rank's own numbers say of where its time goes: host-side work while its GPU idles (data loading,
    its CPU), or, where its host explains no more than its computation does, a wait built up at many collectives."""
    computes = f"it computes only {fmt.duration(max(compute_lag, 0.0))} longer than they do"
    if not late.host_only_us:  # no GPU: nothing tells host work from the rest
        return f", but {computes}: its time goes outside computation. {_HOST_ADVICE}"
    others = float(np.median([r.host_only_us for r in shared if r is not late]))
    host = (
        f"its host works while its GPU is idle {fmt.duration(late.host_only_us)} per step, against "
        f"{fmt.duration(others)} on the others"
    )
    if late.host_only_us - others >= late.late_us / 2:
        return f", but {computes}: its time goes outside computation. {host[0].upper()}{host[1:]}. {_HOST_ADVICE}"
    return (
        f", but neither its computation explains it ({computes}) nor its host ({host}): the wait builds up a little "
        "at many collectives, each reached a little later. Look at its GPU between collectives (clocks, temperature, "
        "other processes on it) and at work queued on its other streams."
    )
