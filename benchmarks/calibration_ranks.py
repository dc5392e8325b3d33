"""Calibration cases of the multi-rank findings (rows of ``calibration.py``): data-parallel ranks on one host clock
(a straggler, a late rank) as ``ranks.findings`` reads them, and FSDP2's collectives and memory as ``fsdp.findings``
reads them."""

from __future__ import annotations

from collections.abc import Callable

import calibration_base as common
import numpy as np

from kprof_callbacks.analysis import fsdp, ranks
from kprof_callbacks.analysis.comm import CollectiveTotals, Transfers
from kprof_callbacks.analysis.tables import FsdpStep, RankStats


def _ranks_findings(rng: np.random.Generator, sigma: float, n_ranks: int, extra: float, late: float) -> dict:
    """Data-parallel steps on one host clock, as ``ranks.findings`` reads them: each step every rank loads its batch
    (5% of the step) and computes 12 pieces (80% in all), each ending in a collective that ends when the last rank
    arrives, plus its transfer (15% in all); every load and piece draws its own noise. Rank 1 computes ``extra`` more
    (a straggler), or starts each step ``late`` of a step later (slow data loading). 4 profiled steps, as
    ``kprof.session``'s default schedule records."""
    steps, pieces, step_ns = 4, 12, common.STEP_US * 1e3
    start, end = np.zeros((2, n_ranks, steps, pieces))
    compute = np.zeros((n_ranks, steps))
    now = 0.0
    for s in range(steps):
        at = now + 0.05 * step_ns * rng.lognormal(0.0, sigma, n_ranks)
        at[1] += late * step_ns
        for k in range(pieces):
            work = (
                0.8
                * step_ns
                / pieces
                * rng.lognormal(0.0, sigma, n_ranks)
                * np.where(np.arange(n_ranks) == 1, 1 + extra, 1)
            )
            compute[:, s] += work
            start[:, s, k] = at + work
            end[:, s, k] = at = start[:, s, k].max() + 0.15 * step_ns / pieces
        now = at
    code = np.repeat(np.arange(steps), pieces), np.tile(np.arange(pieces), steps)
    workers = [
        ranks.Worker(
            r,
            f"rank{r}_host_1",
            [],
            [
                Transfers(
                    code[0],
                    np.zeros(code[0].size, np.int8),
                    code[1],
                    start[r].ravel(),
                    end[r].ravel(),
                    np.zeros(code[0].size, np.int32),
                    [""],
                )
            ],
        )
        for r in range(n_ranks)
    ]
    arrived = ranks.arrivals(workers)
    wall, compute_us = now / steps / 1e3, compute / 1e3
    stats_ = []
    for w in workers:
        mine = float(compute_us[w.rank].mean())  # communication: the rest of the step, none of it overlapped
        stats_.append(RankStats(w.rank, w.worker, steps, wall, mine, wall - mine, 0.0, wall - mine, **arrived[w.rank]))
    skew = ranks.skew_of({s: {r: float(compute_us[r, s]) for r in range(n_ranks)} for s in range(steps)})
    return {d.kind: int(d.message.split()[1]) for d in ranks.findings(stats_, skew)}


def rank_finding(kind: str, n_ranks: int, effect: str) -> Callable[[np.random.Generator, float, bool], bool]:
    """Fires on noise (any ``kind`` finding), or names rank 1 when ``effect`` ("extra" or "late") is injected."""
    size = {"extra": 0.25, "late": 0.20}[effect]

    def fired(rng: np.random.Generator, sigma: float, inject: bool) -> bool:
        found = _ranks_findings(rng, sigma, n_ranks, **{"extra": 0.0, "late": 0.0, effect: size * inject})
        return found.get(kind) == 1 if inject else kind in found

    return fired


FSDP_EFFECTS = {
    "fsdp_all_gather": "forward all-gathers issued late: 40% of each exposed",
    "fsdp_reduce_scatter": "reduce-scatters outlast backward: 40% of each exposed",
    "fsdp_one_communicator": "backward all-gathers queue 8% of the step behind reduce-scatters, 40% of each exposed",
    "fsdp_unsharded_memory": "every group unsharded at the peak (reshard_after_forward=False)",
}


def _collectives(rng: np.random.Generator, sigma: float, wall: float, whole: int, late: bool) -> np.ndarray:
    """One FSDP collective per block, 2% of the step each: rows [time, exposed]. The one at ``whole`` is exposed
    whole; the others 0-10% of themselves, 40% more when ``late``."""
    each = 0.02 * wall * rng.lognormal(0.0, sigma, 12)
    part = rng.uniform(0.0, 0.1, 12) + (0.4 if late else 0.0)
    part[whole] = 1.0
    return np.stack([each, each * part])


def fsdp_finding(kind: str) -> Callable[[np.random.Generator, float, bool], bool]:
    """FSDP2 on 2 ranks, 4 profiled steps, 12 blocks, NCCL (one communicator), as ``fsdp.findings`` reads them. The
    good configuration is the one measured on two H200s (each block sharded, prefetching, resharding after
    forward): per step each block all-gathers for 2% of the step in forward and again in backward, and
    reduce-scatters for 2%; only the first all-gather and the last reduce-scatter are exposed whole, every other
    collective 0-10% of itself; all-gathers queue 1% of the step behind reduce-scatters; 1-3 of the 13 groups are
    unsharded at the memory peak. Injected: the effect ``FSDP_EFFECTS[kind]`` names."""

    def fired(rng: np.random.Generator, sigma: float, inject: bool) -> bool:
        late = {k: inject and kind == k for k in FSDP_EFFECTS}
        steps, rows, sums = [], [], {"fwd": [], "bwd": [], "rs": []}  # per rank-step: [time, exposed]
        for rank in range(2):
            for step in range(4):
                wall = common.STEP_US * rng.lognormal(0.0, sigma)
                fwd = _collectives(rng, sigma, wall, 0, late["fsdp_all_gather"])
                bwd = _collectives(rng, sigma, wall, 0, late["fsdp_one_communicator"])
                rs = _collectives(rng, sigma, wall, -1, late["fsdp_reduce_scatter"])
                for key, c in (("fwd", fwd), ("bwd", bwd), ("rs", rs)):
                    sums[key].append(c.sum(axis=1))
                queued = wall * (0.08 if late["fsdp_one_communicator"] else 0.01) * rng.lognormal(0.0, sigma)
                alive = 13 if late["fsdp_unsharded_memory"] else int(rng.integers(1, 4))
                steps.append(common.step_stats(np.array([wall]))[0])
                group = 2**26
                rows.append(
                    FsdpStep(
                        rank,
                        f"rank{rank}",
                        2,
                        step,
                        13,
                        fwd[1, 0],
                        rs[1, -1],
                        0.0,
                        queued,
                        13 * group,
                        alive * group,
                        alive,
                        group,
                        2**34,
                    )
                )
        totals = []
        for key, name, phase in (
            ("fwd", "all_gather", "forward"),
            ("bwd", "all_gather", "backward"),
            ("rs", "reduce_scatter", "backward"),
        ):
            time_us, exposed = np.mean(sums[key], axis=0)
            totals.append(CollectiveTotals(name, phase, 2, 12, time_us, time_us - exposed, exposed, 0, exposed))
        return kind in common.kinds(fsdp.findings(totals, rows, steps, nccl=True))

    return fired
