"""FSDP (``fully_shard``) in a trace: its phases, the edges of each step, the memory of its unsharded parameters,
and the findings about them.

FSDP labels its work with record_function ranges: ``FSDP::root_pre_forward``, ``FSDP::pre_forward (blocks.0)``,
``FSDP::all_gather (blocks.0)``, ``FSDP::all_gather_copy_out (blocks.0)``, ``FSDP::post_forward (blocks.0)``,
``FSDP::pre_backward (...)``, ``FSDP::backward_prefetch for ...``, ``FSDP::post_backward_reduce (...)``,
``FSDP::root_post_backward_callback``. From them:
- a step's forward runs from its first forward label to its last (or to its first backward label, when activation
  checkpointing runs forward again inside backward), its backward from its first backward label to its last;
- a group's unsharded parameters are the blocks allocated inside its ``FSDP::all_gather_copy_out`` that outlive it,
  alive until freed (resharded); with ``profile_memory=True`` the trace has both ends of each block, paired by address.
"""

from __future__ import annotations

import dataclasses
from statistics import median
from typing import TYPE_CHECKING

import numpy as np

from . import fmt
from . import intervals as iv
from .events import ANNOTATION, Events
from .steps import Windows, memory_rows
from .tables import Diagnostic, FsdpStep, StepStats

if TYPE_CHECKING:
    from .comm import CollectiveTotals

PHASES = ("", "forward", "backward")
"""A collective's phase, as the tables name it ("" where the trace has no FSDP labels)."""

_FORWARD = ("FSDP::root_pre_forward", "FSDP::pre_forward", "FSDP::post_forward", "FSDP::forward_prefetch")
_BACKWARD = ("FSDP::pre_backward", "FSDP::post_backward", "FSDP::root_post_backward", "FSDP::backward_prefetch")
_COPY_OUT = "FSDP::all_gather_copy_out"
_NEVER, _ALWAYS = np.iinfo(np.int64).max, np.iinfo(np.int64).min

EXPOSED_SHARE = 0.05  # exposed all-gather (forward) or reduce-scatter, of the step: worth a finding from here...
EXPOSED_PART = 0.30  # ... when at least this part of that collective's time is exposed
CONCURRENT_PART = 0.01  # all-gather and reduce-scatter "never concurrent" below this part of the shorter one
UNSHARDED_PART = 0.50  # unsharded parameters alive at the memory peak, of the whole model's
RESIDENT_GROUPS = 3  # groups FSDP keeps unsharded at once when it reshards: the root, the current, the prefetched


@dataclasses.dataclass
class Phases:
    """Per step window: where FSDP's forward and backward run on the host (ns; lo >= hi where a step has none)."""

    fwd_lo: np.ndarray
    fwd_hi: np.ndarray
    bwd_lo: np.ndarray
    bwd_hi: np.ndarray

    @property
    def present(self) -> bool:
        return bool((self.fwd_lo < self.fwd_hi).any() or (self.bwd_lo < self.bwd_hi).any())

    def of(self, owner: np.ndarray, times: np.ndarray) -> np.ndarray:
        """Index into PHASES of each time, given the index of its step window (-1 outside all)."""
        i = np.maximum(owner, 0)
        fwd = (owner >= 0) & (times >= self.fwd_lo[i]) & (times < self.fwd_hi[i])
        bwd = (owner >= 0) & (times >= self.bwd_lo[i]) & (times < self.bwd_hi[i])
        return np.where(fwd, 1, np.where(bwd, 2, 0)).astype(np.int8)


def _labels(tl: Events, prefixes: tuple[str, ...]) -> np.ndarray:
    """Host ranges (record_function labels) whose names start with one of `prefixes`."""
    named = np.array([n.startswith(prefixes) for n in tl.names], bool)
    return np.flatnonzero(named[tl.host.name] & (tl.host.kind == ANNOTATION))


def _extent(tl: Events, win: Windows, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per step window: from the first start to the last end of the host events `rows` that start in it."""
    lo, hi = np.full(win.lo.size, _NEVER), np.full(win.lo.size, _ALWAYS)
    start, end = tl.host.start[rows], tl.host.end[rows]
    owner = win.index_of(start)
    ok = owner >= 0
    np.minimum.at(lo, owner[ok], start[ok])
    np.maximum.at(hi, owner[ok], end[ok])
    return lo, hi


def phases(tl: Events, win: Windows) -> Phases:
    """FSDP's forward and backward in each step (none where the trace has no FSDP labels)."""
    fwd_lo, fwd_hi = _extent(tl, win, _labels(tl, _FORWARD))
    bwd_lo, bwd_hi = _extent(tl, win, _labels(tl, _BACKWARD))
    return Phases(fwd_lo, np.minimum(fwd_hi, bwd_lo), bwd_lo, bwd_hi)


@dataclasses.dataclass
class _Unsharded:
    """Per step: the groups' unsharded bytes (as all-gathered) and what was alive at the memory peak."""

    groups: np.ndarray
    total: np.ndarray
    largest: np.ndarray
    at_peak: np.ndarray
    groups_at_peak: np.ndarray
    peak: np.ndarray


def _unsharded(tl: Events, win: Windows) -> _Unsharded:
    n = win.lo.size
    out = _Unsharded(*(np.zeros(n, np.int64) for _ in range(6)))
    copy_out = _labels(tl, (_COPY_OUT,))
    copy_out = copy_out[np.argsort(tl.host.start[copy_out], kind="stable")]
    label_step = win.index_of(tl.host.start[copy_out])
    for i in np.unique(label_step[label_step >= 0]).tolist():
        out.groups[i] = np.unique(tl.host.name[copy_out[label_step == i]]).size
    mem = tl.memory
    pick = memory_rows(tl)
    order = np.argsort(mem.time[pick], kind="stable")
    time, nbytes, addr, allocated = (a[pick][order] for a in (mem.time, mem.nbytes, mem.addr, mem.allocated))
    if not copy_out.size or not time.size:
        return out
    label = np.searchsorted(tl.host.start[copy_out], time, side="right") - 1
    inside = (label >= 0) & (time < tl.host.end[copy_out[np.maximum(label, 0)]])
    by_addr = np.lexsort((time, addr))
    freed = np.full(time.size, _NEVER)
    pair = (addr[by_addr][1:] == addr[by_addr][:-1]) & (nbytes[by_addr][1:] < 0)
    freed[by_addr[:-1][pair]] = time[by_addr[1:][pair]]
    # a group's unsharded parameters: what its copy-out allocated and kept past its end
    kept = inside & (nbytes > 0) & (freed > tl.host.end[copy_out[np.maximum(label, 0)]])
    per_label = np.bincount(label[kept], weights=nbytes[kept], minlength=copy_out.size).astype(np.int64)
    group = tl.host.name[copy_out]
    mem_step = win.index_of(time)
    for i in np.unique(mem_step[mem_step >= 0]).tolist():
        at = np.flatnonzero(mem_step == i)[np.argmax(allocated[mem_step == i])]
        alive = kept & (time <= time[at]) & (freed > time[at])
        out.peak[i], out.at_peak[i] = allocated[at], nbytes[alive].sum()
        out.groups_at_peak[i] = np.unique(group[label[alive]]).size
        # the groups that all-gathered in the step and those still alive from before it (kept unsharded)
        sizes: dict[int, int] = {}
        for k in np.union1d(np.flatnonzero(label_step == i), label[alive]).tolist():  # a group: its largest gather
            sizes[group[k]] = max(sizes.get(group[k], 0), int(per_label[k]))
        out.total[i], out.largest[i] = sum(sizes.values()), max(sizes.values(), default=0)
    return out


def step_stats(
    tl: Events,
    win: Windows,
    compute: iv.Intervals,
    gather: iv.Intervals,
    scatter: iv.Intervals,
    edges: tuple[iv.Intervals, iv.Intervals],
    queued: np.ndarray,
    ph: Phases,
) -> list[FsdpStep]:
    """One row per step of a trace with FSDP labels (none without). `edges`: per step, the first all-gather and the
    last reduce-scatter, which nothing in the step can hide unless computation runs beside them; `queued`: per step,
    how long all-gathers waited for reduce-scatters to end (ns)."""
    if not ph.present:
        return []
    (first_lo, first_hi), (last_lo, last_hi) = edges
    head = iv.length_in(iv.subtract(gather, compute), first_lo, first_hi)
    tail = iv.length_in(iv.subtract(scatter, compute), last_lo, last_hi)
    both = iv.length_in(iv.intersect(gather, scatter), win.lo, win.hi)
    mem = _unsharded(tl, win)
    src = tl.source
    return [
        FsdpStep(
            src.rank,
            src.worker,
            src.world_size,
            int(win.number[i]),
            int(mem.groups[i]),
            float(head[i]) / 1000.0,
            float(tail[i]) / 1000.0,
            float(both[i]) / 1000.0,
            float(queued[i]) / 1000.0,
            int(mem.total[i]),
            int(mem.at_peak[i]),
            int(mem.groups_at_peak[i]),
            int(mem.largest[i]),
            int(mem.peak[i]),
        )
        for i in range(win.lo.size)
    ]


def findings(
    totals: list[CollectiveTotals], rows: list[FsdpStep], steps: list[StepStats], nccl: bool
) -> list[Diagnostic]:
    """FSDP's findings (none for a trace without FSDP labels). `totals`: communication means per step and rank
    (`comm.totals`); `nccl`: whether the collectives ran on NCCL, whose one communicator serializes them."""
    if not rows or not steps:
        return []
    step = sum(s.wall_us for s in steps) / len(steps)
    by = {(t.collective, t.phase): t for t in totals}
    found = []
    gather = by.get(("all_gather", "forward"))
    if gather and _exposed(gather.exposed_us, gather.total_us, step):
        found.append(_gather_finding(gather, rows, step))
    scatter = [t for t in totals if t.collective == "reduce_scatter"]
    exposed, total = sum(t.exposed_us for t in scatter), sum(t.total_us for t in scatter)
    if _exposed(exposed, total, step):
        found.append(_scatter_finding(exposed, total, rows, step))
    back = by.get(("all_gather", "backward"))
    if nccl and back and total:
        found += _serialized_finding(back, total, rows, step)
    return found + _memory_finding(rows)


def _exposed(exposed: float, total: float, step: float) -> bool:
    return exposed >= EXPOSED_SHARE * step and exposed >= EXPOSED_PART * total


def _mean(rows: list[FsdpStep], field: str) -> float:
    return sum(getattr(r, field) for r in rows) / len(rows)


def _gather_finding(gather: CollectiveTotals, rows: list[FsdpStep], step: float) -> Diagnostic:
    groups = max(r.groups for r in rows)
    why = (
        "one FSDP group holds the whole model (fully_shard on the root alone), so its all-gather has no "
        "computation to hide behind: apply fully_shard to each block before the root"
        if groups == 1
        else "FSDP hides a block's all-gather behind the previous block's computation only when it is issued early "
        "enough: prefetch explicitly (block.set_modules_to_forward_prefetch([next blocks])), keep synchronizations "
        "(.item(), .cpu()) out of forward so the host runs ahead, or grow the per-rank batch"
    )
    return Diagnostic(
        "fsdp_all_gather",
        "warning",
        (
            f"All-gather is exposed in forward: {fmt.duration(gather.exposed_us)} per step per rank "
            f"({fmt.share(gather.exposed_us / step)} of the step, {fmt.share(gather.exposed_us / gather.total_us)} of "
            f"forward all-gather time; {fmt.duration(_mean(rows, 'first_gather_exposed_us'))} of it in the first "
            f"all-gather, at the start of forward; {groups} FSDP group{'s' * (groups != 1)}); {why}."
        ),
    )


def _scatter_finding(exposed: float, total: float, rows: list[FsdpStep], step: float) -> Diagnostic:
    return Diagnostic(
        "fsdp_reduce_scatter",
        "warning",
        (
            f"Reduce-scatter is exposed: {fmt.duration(exposed)} per step per rank ({fmt.share(exposed / step)} of the "
            f"step, {fmt.share(exposed / total)} of reduce-scatter time; "
            f"{fmt.duration(_mean(rows, 'last_scatter_exposed_us'))} of it in the last one, at the end of backward). "
            "A group's gradients reduce-scatter behind the backward of the groups before it, so the last group (the "
            "root's: embeddings, head) has nothing left to hide behind: shard each block so the root group stays "
            "small; where reduce-scatter outlasts backward computation, reduce in bf16 "
            "(MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)) or grow the per-rank batch."
        ),
    )


def _serialized_finding(
    back: CollectiveTotals, scatter_total: float, rows: list[FsdpStep], step: float
) -> list[Diagnostic]:
    both, queued = _mean(rows, "gather_scatter_concurrent_us"), _mean(rows, "gather_queued_us")
    if (
        both >= CONCURRENT_PART * min(back.total_us, scatter_total)
        or queued < EXPOSED_SHARE * step
        or back.exposed_us < EXPOSED_SHARE * step
    ):
        return []
    return [
        Diagnostic(
            "fsdp_one_communicator",
            "warning",
            (
                f"All-gather and reduce-scatter never run at the same time in backward ({fmt.duration(back.total_us)} "
                "of "
                f"all-gather and {fmt.duration(scatter_total)} of reduce-scatter per step, {fmt.duration(both)} "
                "together): "
                f"all-gathers wait {fmt.duration(queued)} per step for a reduce-scatter to end, and "
                f"{fmt.duration(back.exposed_us)} of backward all-gather is exposed "
                f"({fmt.share(back.exposed_us / step)} of "
                "the step). On one NCCL communicator the next block's all-gather queues behind the last "
                "reduce-scatter; give "
                "reduce-scatter its own process group (FSDPModule.set_separate_reduce_scatter_group()) so the two can "
                "run at "
                "once."
            ),
        )
    ]


def _memory_finding(rows: list[FsdpStep]) -> list[Diagnostic]:
    recorded = [r for r in rows if r.unsharded_total]
    if not recorded:
        return []
    part = median(r.unsharded_at_peak / r.unsharded_total for r in recorded)
    worst = max(recorded, key=lambda r: r.unsharded_at_peak / r.unsharded_total)
    one_group = worst.largest_group >= UNSHARDED_PART * worst.unsharded_total
    if part < UNSHARDED_PART or not (one_group or worst.groups_at_peak > RESIDENT_GROUPS):
        return []
    sharded = (
        f", against {fmt.size(worst.unsharded_total / worst.world_size)} sharded per rank over {worst.world_size} ranks"
        if worst.world_size
        else ""
    )
    why = (
        "one FSDP group holds most of the model (fully_shard on the root alone or on a few large modules): apply "
        "fully_shard to each block before the root"
        if one_group
        else "reshard_after_forward=False keeps each block unsharded from its forward to its backward: pass "
        "reshard_after_forward=True to fully_shard of the blocks, for one more all-gather per block in backward"
    )
    who = f" on rank {worst.rank}" if worst.rank is not None else ""
    groups = max(worst.groups, worst.groups_at_peak)  # some may have stayed unsharded from an earlier step
    return [
        Diagnostic(
            "fsdp_unsharded_memory",
            "warning",
            (
                f"At the memory peak of step {worst.step}{who} ({fmt.size(worst.peak_memory)} allocated), "
                f"{fmt.size(worst.unsharded_at_peak)} of unsharded parameters are alive: {worst.groups_at_peak} of "
                f"{groups} FSDP groups, {fmt.share(worst.unsharded_at_peak / worst.unsharded_total)} of the model's "
                f"{fmt.size(worst.unsharded_total)} (as all-gathered){sharded}; {why}."
            ),
        )
    ]
