"""Communication by collective: per rank and step, the time each all-gather, reduce-scatter, all-reduce, ... ran, how
much of it computation hid (overlapped) and how much the step waited for (exposed).

One accounting for every data-parallel flavour (DDP's gradient all-reduce, FSDP's all-gather and reduce-scatter, and
whatever else a trace holds), over the events `steps.comm_events` counts as communication:
- NCCL kernels, named by the c10d collective kineto copies onto them ("Collective name"), else by their own name;
- gloo's host ranges (`gloo:all_gather`, ...) on gloo's worker threads; gloo runs a reduce-scatter as an all-reduce,
  so an all-reduce range takes the collective of the last reduction c10d issued before it started;
- on a CPU-only run, also c10d's host ops that issue them.
A collective belongs to the step and FSDP phase in which the host issued it. Each file is analysed on its own (a few
rows per step, plus each transfer's step, collective, order and times for matching ranks), so the files of a run can be
summarized in parallel and merged by concatenation.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import numpy as np

from . import fsdp
from . import intervals as iv
from .events import Events, launch_times, unique_ids
from .steps import StepTimes, Windows, comm_events
from .tables import CommStats, Diagnostic, FsdpStep, StepStats

KINDS = (
    "all_gather",
    "reduce_scatter",
    "all_reduce",
    "broadcast",
    "reduce",
    "all_to_all",
    "send_recv",
    "gather",
    "scatter",
    "barrier",
    "other",
)
"""The collectives, as the tables name them."""

_WORDS = (
    ("reducescatter", "reduce_scatter"),
    ("allgather", "all_gather"),
    ("allreduce", "all_reduce"),
    ("alltoall", "all_to_all"),
    ("broadcast", "broadcast"),
    ("barrier", "barrier"),
    ("sendrecv", "send_recv"),
    ("send", "send_recv"),
    ("recv", "send_recv"),
    ("reduce", "reduce"),
    ("gather", "gather"),
    ("scatter", "scatter"),
)
QUEUED_NS = 10_000  # an all-gather starting this soon after a reduce-scatter ended was waiting for it


def collective_kind(name: str) -> str:
    """The collective a name says, in any of its spellings (`ncclDevKernel_AllGather_RING_LL`, `_allgather_base`,
    `gloo:all_gather`, `c10d::_reduce_scatter_base_`, ...); `other` when it says none."""
    key = name.lower().replace("_", "")
    return next((kind for word, kind in _WORDS if word in key), "other")


@dataclasses.dataclass
class Calls:
    """The communication events of one trace, with their collective and when the host issued them."""

    kind: np.ndarray  # int8 index into KINDS
    start: np.ndarray  # int64 ns
    end: np.ndarray
    launch: np.ndarray  # when the host issued it: its step and FSDP phase follow from this
    carrier: np.ndarray  # bool: the transfer itself (NCCL kernel, gloo range), not the host op that issues it
    group: np.ndarray  # int32 id into the trace's names of its process group (`eventcolumns.group_text`), -1: none


@dataclasses.dataclass
class Transfers:
    """One file's transfers, to match the same collective across ranks: the n-th `kind` in process group `group` of
    step `step`."""

    step: np.ndarray  # step number
    kind: np.ndarray
    order: np.ndarray  # its place among the step's transfers of that collective in that group, by start
    start: np.ndarray
    end: np.ndarray
    group: np.ndarray  # index into `groups`
    groups: list[str]  # `eventcolumns.group_text` of each process group; "" where the trace does not say


@dataclasses.dataclass
class FileComm:
    """What one trace file says about communication."""

    rows: list[CommStats]
    fsdp: list[FsdpStep]
    transfers: Transfers


def _kinds_of(tl: Events, ids: np.ndarray) -> np.ndarray:
    """KINDS index of each name id (evaluated once per distinct name)."""
    uniq, inverse = unique_ids(ids)
    return np.array([KINDS.index(collective_kind(tl.names[k])) for k in uniq.tolist()], np.int8)[inverse].reshape(-1)


def _issued_kinds(tl: Events, rows: np.ndarray, kind: np.ndarray) -> np.ndarray:
    """gloo runs a reduce-scatter as an all-reduce: a `gloo:all_reduce` range among host `rows` is a reduce-scatter
    when the last reduction c10d issued before it started was one."""
    host = tl.host
    reduce = (KINDS.index("all_reduce"), KINDS.index("reduce_scatter"))
    issuers = np.flatnonzero(np.array([n.startswith("c10d::") for n in tl.names], bool)[host.name])
    issuer_kind = _kinds_of(tl, host.name[issuers])
    issuers, issuer_kind = issuers[np.isin(issuer_kind, reduce)], issuer_kind[np.isin(issuer_kind, reduce)]
    gloo = np.array([n.startswith("gloo:") for n in tl.names], bool)[host.name[rows]] & (kind == reduce[0])
    if not issuers.size or not gloo.any():
        return kind
    order = np.argsort(host.start[issuers], kind="stable")
    last = np.searchsorted(host.start[issuers][order], host.start[rows], side="right") - 1
    take = gloo & (last >= 0)
    out = kind.copy()
    out[take] = issuer_kind[order][last[take]]
    return out


def calls(tl: Events) -> Calls:
    """The collectives of one trace."""
    host, dev = tl.host, tl.device
    host_comm, dev_comm = comm_events(tl)
    rows = np.flatnonzero(host_comm)
    host_kind = _issued_kinds(tl, rows, _kinds_of(tl, host.name[rows]))
    said = dev.collective[dev_comm]
    dev_kind = _kinds_of(tl, np.where(said >= 0, said, dev.name[dev_comm]))
    ranges = np.array([n.startswith(("gloo:", "nccl:")) for n in tl.names], bool)[host.name[rows]]
    carrier = ranges if ranges.any() or dev_comm.any() else np.ones(rows.size, bool)
    return Calls(
        kind=np.concatenate([dev_kind, host_kind]).astype(np.int8),
        start=np.concatenate([dev.start[dev_comm], host.start[rows]]),
        end=np.concatenate([dev.end[dev_comm], host.end[rows]]),
        launch=np.concatenate([launch_times(tl)[dev_comm], host.start[rows]]),
        carrier=np.concatenate([np.ones(int(dev_comm.sum()), bool), carrier]),
        group=np.concatenate([dev.group[dev_comm], np.full(rows.size, -1, np.int32)]),
    )


def group_parts(text: str) -> tuple[str, int]:
    """A process group's label and size from its `eventcolumns.group_text` ("", 0 where the trace does not say)."""
    label, _, rest = text.partition("\t")
    size = rest.partition("\t")[0]
    return label, int(size) if size.isdigit() else 0


def _rows(
    tl: Events, win: Windows, compute: iv.Intervals, c: Calls, owner: np.ndarray, phase: np.ndarray
) -> list[CommStats]:
    """One row per step, collective and phase that ran."""
    rows = []
    inside = owner >= 0
    for k, g, p in sorted(set(zip(c.kind[inside].tolist(), c.group[inside].tolist(), phase[inside].tolist()))):
        pick = inside & (c.kind == k) & (c.group == g) & (phase == p)
        group, size = group_parts(tl.names[g]) if g >= 0 else ("", 0)
        spans = iv.union(c.start[pick], c.end[pick])
        total = iv.length_in(spans, win.lo, win.hi)
        overlap = iv.length_in(iv.intersect(spans, compute), win.lo, win.hi)
        count = np.bincount(owner[pick & c.carrier], minlength=win.lo.size)
        for i in np.flatnonzero((total > 0) | (count > 0)).tolist():
            rows.append(
                CommStats(
                    tl.source.rank,
                    tl.source.worker,
                    int(win.number[i]),
                    KINDS[k],
                    fsdp.PHASES[p],
                    int(count[i]),
                    float(total[i]) / 1000.0,
                    float(overlap[i]) / 1000.0,
                    float(total[i] - overlap[i]) / 1000.0,
                    group=group,
                    group_size=size,
                )
            )
    return rows


def transfers(tl: Events, win: Windows, c: Calls | None = None) -> Transfers:
    """The transfers of one trace in its step windows `win`, numbered within step, collective and process group."""
    c = calls(tl) if c is None else c
    owner = win.index_of(c.launch)
    pick = (owner >= 0) & c.carrier
    ids, group = np.unique(c.group[pick], return_inverse=True)
    groups = [tl.names[g] if g >= 0 else "" for g in ids.tolist()]
    step, kind, start, end = win.number[owner[pick]], c.kind[pick], c.start[pick], c.end[pick]
    by = np.lexsort((start, group, kind, step))
    step, kind, group, start, end = step[by], kind[by], group[by].astype(np.int32), start[by], end[by]
    first = np.ones(step.size, bool)
    first[1:] = (step[1:] != step[:-1]) | (kind[1:] != kind[:-1]) | (group[1:] != group[:-1])
    index = np.arange(step.size)
    order = index - np.maximum.accumulate(np.where(first, index, 0))
    return Transfers(step, kind, order, start, end, group, groups)


def _edge(c: Calls, owner: np.ndarray, n: int, kind: str, last: bool) -> iv.Intervals:
    """Per step window: the first (or last) transfer of `kind` issued in it, as [start, end) (empty where none)."""
    lo, hi = np.zeros(n, np.int64), np.zeros(n, np.int64)
    pick = np.flatnonzero((owner >= 0) & c.carrier & (c.kind == KINDS.index(kind)))
    pick = pick[np.argsort(c.start[pick], kind="stable")]
    if last:
        pick = pick[::-1]
    steps_of, first = np.unique(owner[pick], return_index=True)
    lo[steps_of], hi[steps_of] = c.start[pick[first]], c.end[pick[first]]
    return lo, hi


def _queued(c: Calls, owner: np.ndarray, n: int) -> np.ndarray:
    """Per step window (ns): how long all-gathers waited for a reduce-scatter to end, as one communicator makes them:
    each one that started as a reduce-scatter ended (within QUEUED_NS), though issued before that."""
    gather = np.flatnonzero(c.carrier & (owner >= 0) & (c.kind == KINDS.index("all_gather")))
    scatter = np.flatnonzero(c.carrier & (c.kind == KINDS.index("reduce_scatter")))
    if not gather.size or not scatter.size:
        return np.zeros(n)
    scatter = scatter[np.argsort(c.end[scatter], kind="stable")]
    before = np.searchsorted(c.end[scatter], c.start[gather], side="right") - 1
    r = scatter[np.maximum(before, 0)]
    behind = (before >= 0) & (c.start[gather] - c.end[r] <= QUEUED_NS) & (c.launch[gather] < c.end[r])
    wait = np.where(behind, c.end[r] - np.maximum(c.launch[gather], c.start[r]), 0)
    return np.bincount(owner[gather], weights=wait, minlength=n)


def analyze(tl: Events, times: StepTimes) -> FileComm:
    """Communication of one trace, by step, collective and FSDP phase."""
    c = calls(tl)
    win = times.windows
    owner = win.index_of(c.launch)
    phases = fsdp.phases(tl, win)
    phase = phases.of(owner, c.launch)

    def spans(kind: str) -> iv.Intervals:
        pick = c.kind == KINDS.index(kind)
        return iv.union(c.start[pick], c.end[pick])

    n = win.lo.size
    edges = _edge(c, owner, n, "all_gather", last=False), _edge(c, owner, n, "reduce_scatter", last=True)
    stats = fsdp.step_stats(
        tl, win, times.compute, spans("all_gather"), spans("reduce_scatter"), edges, _queued(c, owner, n), phases
    )
    return FileComm(_rows(tl, win, times.compute, c, owner, phase), stats, transfers(tl, win, c))


@dataclasses.dataclass(frozen=True)
class CollectiveTotals:
    """One collective in one process group and phase over a run: means per step and rank, and the rank that waited
    longest for it."""

    collective: str
    phase: str
    ranks: int
    calls: float
    total_us: float
    overlap_us: float
    exposed_us: float
    worst_rank: int | None
    worst_exposed_us: float
    group: str = ""  # its process group; "" where the traces do not say (gloo), or the totals are not split by group


def totals(rows: list[CommStats], steps: list[StepStats], by_group: bool = True) -> list[CollectiveTotals]:
    """Means per step and rank of each collective (in each process group, `by_group`) and phase, largest exposed time
    first. A rank's mean counts the steps in which the collective did not run as zeros."""
    n_steps: dict[tuple, int] = defaultdict(int)
    for s in steps:
        n_steps[(s.rank, s.worker)] += 1
    sums: dict[tuple, dict[tuple, np.ndarray]] = defaultdict(lambda: defaultdict(lambda: np.zeros(4)))
    for r in rows:
        key = (r.collective, _group_label(r) if by_group else "", r.phase)
        sums[key][(r.rank, r.worker)] += (r.calls, r.total_us, r.overlap_us, r.exposed_us)
    out = []
    for (collective, group, phase), by_rank in sums.items():
        means = {who: v / max(n_steps.get(who, 1), 1) for who, v in by_rank.items()}
        mean = np.mean(list(means.values()), axis=0)
        worst = max(means, key=lambda who: means[who][3])
        out.append(
            CollectiveTotals(
                collective,
                phase,
                len(means),
                float(mean[0]),
                float(mean[1]),
                float(mean[2]),
                float(mean[3]),
                worst[0],
                float(means[worst][3]),
                group,
            )
        )
    return sorted(out, key=lambda t: (-t.exposed_us, t.collective, t.group, t.phase))


def _group_label(row: CommStats) -> str:
    """`mesh_shard (2 ranks)`: a process group as the tables name it."""
    return f"{row.group} ({row.group_size} ranks)" if row.group and row.group_size else row.group


def findings(rows: list[CommStats], fsdp_rows: list[FsdpStep], steps: list[StepStats], nccl: bool) -> list[Diagnostic]:
    """Findings about communication by collective (FSDP's, where the traces have FSDP labels)."""
    return fsdp.findings(totals(rows, steps, by_group=False), fsdp_rows, steps, nccl)
