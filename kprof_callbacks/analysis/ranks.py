"""Multi-rank view: per rank compute vs communication and their overlap, and the straggler.

In data-parallel training every rank waits for the slowest one inside the collective, so
step wall times look alike across ranks; the straggler shows in *compute* time (and in
the others' longer communication). Ranks are matched step by step on ProfilerStep#N.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import numpy as np

from .steps import WHOLE_TRACE, StepTimes
from .tables import RankStats, StepSkew


@dataclasses.dataclass
class Worker:
    """The traces of one rank (or one non-distributed process), possibly several profiling cycles."""

    rank: int | None
    worker: str
    times: list[StepTimes]


def rank_stats(workers: list[Worker]) -> list[RankStats]:
    """Means per step for each worker."""
    out = []
    for w in workers:
        wall = np.concatenate([[r.wall_us for r in t.rows] for t in w.times])
        compute, comm, overlap = (np.concatenate([getattr(t, f) for t in w.times]) for f in ("compute_us", "comm_us", "overlap_us"))
        out.append(RankStats(
            rank=w.rank, worker=w.worker, steps=int(wall.size), step_us=float(wall.mean()),
            compute_us=float(compute.mean()), comm_us=float(comm.mean()), overlap_us=float(overlap.mean()),
            exposed_comm_us=float((comm - overlap).mean()),
        ))
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
    out = []
    for step in sorted(per_step):
        by_rank = per_step[step]
        if len(by_rank) < 2:
            continue
        slowest = max(by_rank, key=by_rank.__getitem__)
        others = float(np.median([c for r, c in by_rank.items() if r != slowest]))
        out.append(StepSkew(step, slowest, by_rank[slowest], others, by_rank[slowest] - others))
    return out
