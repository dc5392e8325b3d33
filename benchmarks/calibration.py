"""How often is each kprof verdict wrong? False positives on seeded noise-only runs, detection of named effects.

Every detector runs as kprof runs it, on the inputs it reads, drawn from a seeded noise model instead of a trace:
the findings (``diagnostics.diagnose``) on per-step tables, the growth detector on memory samples taken on the
session's schedule, ``kprof.diff`` (and its regression gate) on two Summaries' per-step tables, ``compare``'s
verdict on timed rounds, the slow-step trigger on a stream of step times. Step-to-step noise is lognormal with sigma
5% (a GPU training step) or 15% (a shared CPU); noise-only runs also hold what real runs have and no detector may
blame: a window's first step 10% slower and its data loading at a quarter of the step, a loss read once, an
allocator plateau, warm-up.
Each injected effect is the smallest one docs/findings.md promises to find. A row meets its targets at <= 5%
false positives and >= 95% detection; each rate comes with its 95% (Wilson) interval.

``--real`` runs the detectors end to end instead, on the noise of this machine: each trial trains a small MLP
(on the GPU when there is one) under ``kprof.session``, summarizes its traces and reads the findings, or diffs two
such runs; the effects are injected into the loop itself (a ``data_loading`` region, ``.item()``, tiny kernels, memory
kept, a longer step). A longer step is a sleep on a CPU and a spin kernel (``torch.cuda._sleep``) on a GPU: there the
host runs steps ahead of the GPU, and a host sleep only uses up that lead without slowing training, so no detector
should report it. Rows that need a GPU are left out on a CPU.

    python benchmarks/calibration.py                                  # 1000 trials a row, ~15 min on 2 busy cores
    python benchmarks/calibration.py --quick                          # 40 trials a row (the test)
    python benchmarks/calibration.py --out benchmarks/results/calibration-cpu.json
    python benchmarks/calibration.py --real --trials 10 --out calibration-real.json   # ~5 min on an H100
    python benchmarks/calibration.py --real --only "slow step,syncs" --out part.json  # some rows (same seeds)

``--out`` is written again after each row, so a run cut short keeps the rows it finished.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import mmap
import os
import platform
import shlex
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

from kprof_callbacks import stats, triggers
from kprof_callbacks.analysis import Summary, diagnostics, diff, fsdp, growth, ranks
from kprof_callbacks.analysis.comm import CollectiveTotals, Transfers
from kprof_callbacks.analysis.perstep import PerStep
from kprof_callbacks.analysis.tables import FsdpStep, RankStats, StepStats
from kprof_callbacks.config import ProfileConfig
from kprof_callbacks.metrics import EARLY_MEMORY_STEPS

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibration_memory  # noqa: E402

import load_cases  # noqa: E402

NOISE = (0.05, 0.15)
FP_TARGET, DETECTION_TARGET = 0.05, 0.95
STEP_US = 100_000.0
SCHEDULE = {"wait": 2, "warmup": 1, "active": 5, "repeat": 2}  # the end-to-end runs' schedule, as the synthetic
WINDOW = SCHEDULE["active"]  # ones number their steps: profiled steps per window, the first of each a window's first


@dataclasses.dataclass(frozen=True)
class Detector:
    """One verdict: what fires it, the run it looks at, and the effect injected to test detection."""

    name: str
    run: str
    effect: str
    fired: Callable[[np.random.Generator, float, bool], bool]
    details: Callable[[], dict] | None = None  # more than the rates, written with the row (e.g. exit statuses)
    detection_target: bool = True  # False: an effect the noise may hide, whose detection rate is published, not held


def _step_number(i: int) -> int:
    """The number of the ``i``-th profiled step under SCHEDULE: the windows' steps are numbered with gaps between
    them (the waiting and warm-up steps), as in a real run."""
    skipped = SCHEDULE["wait"] + SCHEDULE["warmup"]
    return (i // WINDOW) * (WINDOW + skipped) + skipped + i % WINDOW


def _steps(wall_us: np.ndarray, **columns: np.ndarray) -> list[StepStats]:
    zero = np.zeros(wall_us.size)
    values = {k: columns.get(k, zero) for k in ("gpu_busy_us", "gpu_idle_us", "kernel_us", "dataloader_us")}
    return [
        StepStats(
            step=_step_number(i),
            rank=None,
            worker="w",
            wall_us=float(w),
            memcpy_us=0.0,
            memset_us=0.0,
            comm_us=0.0,
            cpu_only_us=float(w - values["gpu_busy_us"][i]),
            peak_memory=0,
            **{k: float(v[i]) for k, v in values.items()},
        )
        for i, w in enumerate(wall_us)
    ]


def _walls(rng: np.random.Generator, sigma: float, n: int) -> np.ndarray:
    """Noise-only step times; each window's first step 10% slower (the profiler starting)."""
    first = np.where(np.arange(n) % WINDOW == 0, 1.10, 1.0)
    return STEP_US * first * rng.lognormal(0.0, sigma, n)


def _kinds(found: list) -> set[str]:
    return {d.kind for d in found}


def _findings(steps: list[StepStats], ev: diagnostics.Evidence, rows: tuple[list, list, np.ndarray] | None = None):
    kind, name, calls = rows or ([], [], np.zeros((0, len(steps))))
    per_step = PerStep(kind, name, calls * 5.0, calls, steps)
    return _kinds(diagnostics.diagnose(steps, [], ev, per_step))


def slow_step(rng: np.random.Generator, sigma: float, inject: bool) -> bool:
    walls = _walls(rng, sigma, 2 * WINDOW)
    if inject:
        walls[rng.integers(walls.size)] = 2.0 * STEP_US
    return "slow_step" in _findings(_steps(walls), diagnostics.Evidence())


def data_loading(rng: np.random.Generator, sigma: float, inject: bool) -> bool:
    walls = _walls(rng, sigma, 2 * WINDOW)
    share = np.where(np.arange(walls.size) % WINDOW == 0, 0.25, 0.01)  # a window's first batch: a fresh iterator
    if inject:
        share = np.full(walls.size, 0.15)
    loader = walls * share * rng.lognormal(0.0, sigma, walls.size)
    return "dataloader" in _findings(_steps(walls, dataloader_us=loader), diagnostics.Evidence())


def launch_bound(rng: np.random.Generator, sigma: float, inject: bool) -> bool:
    walls = _walls(rng, sigma, 2 * WINDOW)
    idle_share = np.clip((0.5 if inject else 0.15) * rng.lognormal(0.0, sigma, walls.size), 0, 0.95)
    kernels = 40 * walls.size
    waited = rng.binomial(kernels, 0.7 if inject else 0.3)
    ev = diagnostics.Evidence(has_gpu=True, kernels=kernels, kernel_us=kernels * 20.0, waited_kernels=waited)
    busy = walls * (1 - idle_share)
    steps = _steps(walls, gpu_busy_us=busy, gpu_idle_us=walls - busy, kernel_us=busy)
    return "launch_bound" in _findings(steps, ev)


def gpu_idle(rng: np.random.Generator, sigma: float, inject: bool) -> bool:
    """The GPU idle 20% of a step (each window's first step 45%: the profiler starting, the first batch), or 45% of
    every step."""
    walls = _walls(rng, sigma, 2 * WINDOW)
    typical = np.where(np.arange(walls.size) % WINDOW == 0, 0.45, 0.45 if inject else 0.20)
    idle_share = np.clip(typical * rng.lognormal(0.0, sigma, walls.size), 0, 0.95)
    busy = walls * (1 - idle_share)
    steps = _steps(walls, gpu_busy_us=busy, gpu_idle_us=walls - busy, kernel_us=busy)
    return "gpu_idle" in _findings(steps, diagnostics.Evidence(has_gpu=True))


def syncs(rng: np.random.Generator, sigma: float, inject: bool) -> bool:
    walls = _walls(rng, sigma, 2 * WINDOW)
    per_step = np.zeros(walls.size)
    if inject:
        per_step += 1 + rng.binomial(1, 0.2, walls.size)  # a .item() each step, a second one now and then
    elif rng.random() < 0.5:
        per_step[rng.integers(walls.size)] = 1  # a loss read once, for a log line
    ev = diagnostics.Evidence(has_gpu=True, syncs=Counter({"cudaStreamSynchronize": int(per_step.sum())}))
    steps = _steps(walls, gpu_busy_us=walls * 0.9, gpu_idle_us=walls * 0.1, kernel_us=walls * 0.9)
    return "sync" in _findings(steps, ev, (["op"], ["cudaStreamSynchronize"], per_step[None]))


def memory_growth(rng: np.random.Generator, sigma: float, inject: bool, steps: int = 100) -> bool:
    """Samples on the session's schedule (every step at first, then every 5), 1 MB of jitter (RSS pages), warm-up
    growth over the first 10 steps, and half the runs with one allocator plateau (a new 64 MB segment)."""
    at = np.array([s for s in range(steps) if s < EARLY_MEMORY_STEPS or (s + 1) % 5 == 0])
    mb = 2000.0 + 50.0 * np.minimum(at, 10) / 10 + rng.normal(0.0, 20.0 * sigma, at.size)
    if rng.random() < 0.5:
        mb += 64.0 * (at >= rng.integers(20, steps))
    if inject:
        mb += 1.0 * at
    return growth.growth(at, mb) is not None


def loss_head(rng: np.random.Generator, sigma: float, inject: bool) -> bool:
    """The loss head (GPU time on [tokens, vocabulary] logits) at 8% of each step's GPU busy time, as in a model whose
    vocabulary is small next to its width, or at 20%."""
    walls = _walls(rng, sigma, 2 * WINDOW)
    busy = walls * 0.9
    share = np.clip((0.20 if inject else 0.08) * rng.lognormal(0.0, sigma, walls.size), 0.0, 1.0)
    steps = _steps(walls, gpu_busy_us=busy, gpu_idle_us=walls - busy, kernel_us=busy)
    ev = diagnostics.Evidence(has_gpu=True)
    ev.loss_head.gpu_us.update({(s.rank, s.worker, s.step): float(x * s.gpu_busy_us) for s, x in zip(steps, share)})
    ev.loss_head.logits[(4096, 50304)] = Counter({4: 1, 2: 1})
    return "loss_head" in _findings(steps, ev)


OPS = np.geomspace(20, 2000, 30)
KERNELS = np.geomspace(5, 500, 12)


def _summary(rng: np.random.Generator, sigma: float, n: int, scale: np.ndarray) -> Summary:
    """A run of ``n`` steps of 30 operators and 12 kernels (``scale``: each row's factor), as a Summary's table."""
    base = np.concatenate([OPS, KERNELS]) * scale
    time_us = base[:, None] * rng.lognormal(0.0, sigma, (base.size, n))
    time_us[:, ::WINDOW] *= 1.10  # each window's first step: the profiler starting
    calls = np.ones_like(time_us)
    kinds = ["op"] * OPS.size + ["kernel"] * KERNELS.size
    names = [f"aten::op{k}" for k in range(OPS.size)] + [f"kernel_{k}" for k in range(KERNELS.size)]
    steps = _steps(time_us.sum(axis=0))
    empty = Summary.empty("run", "calibration")
    table = PerStep(kinds, names, time_us, calls, steps)
    return dataclasses.replace(empty, diagnostics=[], steps=steps, per_step=table)


def _diff(rng: np.random.Generator, sigma: float, scale_b: np.ndarray, n: int = 10):
    ones = np.ones(OPS.size + KERNELS.size)
    return diff(_summary(rng, sigma, n, ones), _summary(rng, sigma, n, scale_b))


def diff_step_time(rng: np.random.Generator, sigma: float, inject: bool) -> bool:
    d = _diff(rng, sigma, np.full(OPS.size + KERNELS.size, 1.2 if inject else 1.0))
    return d.step_time.verdict == stats.SLOWER if inject else d.step_time.verdict != stats.SAME


def diff_gate(rng: np.random.Generator, sigma: float, inject: bool) -> bool:
    """``kprof diff --fail-if-slower 5`` (``Diff.regressed(5)``): B exactly at the limit must pass, 15% slower fail."""
    return _diff(rng, sigma, np.full(OPS.size + KERNELS.size, 1.15 if inject else 1.05)).regressed(5)


ROW = 20  # the injected row: aten::op20, ~4% of the step


def diff_rows(rng: np.random.Generator, sigma: float, inject: bool) -> bool:
    scale = np.ones(OPS.size + KERNELS.size)
    scale[ROW] = 1.5 if inject else 1.0
    significant = {c.name for c in _diff(rng, sigma, scale).significant()}
    return f"aten::op{ROW}" in significant if inject else bool(significant)


def compare_verdict(rng: np.random.Generator, sigma: float, inject: bool, rounds: int = 50) -> bool:
    """compare's defaults: 50 timed steps a variant in rounds of 1, interleaved."""
    base = [[STEP_US * rng.lognormal(0.0, sigma)] for _ in range(rounds)]
    other = [[STEP_US * (1.2 if inject else 1.0) * rng.lognormal(0.0, sigma)] for _ in range(rounds)]
    verdict = load_cases.compare_rounds(base, other, rng)
    return verdict == stats.SLOWER if inject else verdict in (stats.FASTER, stats.SLOWER)


def slow_step_trigger(rng: np.random.Generator, sigma: float, inject: bool, steps: int = 300) -> bool:
    """The trigger's defaults (3x the running median, after 20 steps) on 300 steps; the effect: one 4x step."""
    times = STEP_US / 1e6 * rng.lognormal(0.0, sigma, steps)
    if inject:
        times[steps // 2] *= 4.0
    fired: list[str] = []
    feed = iter(times.tolist())
    trigger = triggers.SlowStep(ProfileConfig(), lambda reason: fired.append(reason) or True, lambda: (0, [next(feed)]))
    for step in range(steps):
        trigger.on_step(step)
    return bool(fired)


def _ranks_findings(rng: np.random.Generator, sigma: float, n_ranks: int, extra: float, late: float) -> dict:
    """Data-parallel steps on one host clock, as ``ranks.findings`` reads them: each step every rank loads its batch
    (5% of the step) and computes 12 pieces (80% in all), each ending in a collective that ends when the last rank
    arrives, plus its transfer (15% in all); every load and piece draws its own noise. Rank 1 computes ``extra`` more
    (a straggler), or starts each step ``late`` of a step later (slow data loading). 4 profiled steps, as
    ``kprof.session``'s default schedule records."""
    steps, pieces, step_ns = 4, 12, STEP_US * 1e3
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
                wall = STEP_US * rng.lognormal(0.0, sigma)
                fwd = _collectives(rng, sigma, wall, 0, late["fsdp_all_gather"])
                bwd = _collectives(rng, sigma, wall, 0, late["fsdp_one_communicator"])
                rs = _collectives(rng, sigma, wall, -1, late["fsdp_reduce_scatter"])
                for key, c in (("fwd", fwd), ("bwd", bwd), ("rs", rs)):
                    sums[key].append(c.sum(axis=1))
                queued = wall * (0.08 if late["fsdp_one_communicator"] else 0.01) * rng.lognormal(0.0, sigma)
                alive = 13 if late["fsdp_unsharded_memory"] else int(rng.integers(1, 4))
                steps.append(_steps(np.array([wall]))[0])
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
        return kind in _kinds(fsdp.findings(totals, rows, steps, nccl=True))

    return fired


DETECTORS = (
    Detector("slow step", "10 profiled steps", "one step 2x the typical", slow_step),
    Detector(
        "data loading",
        "10 profiled steps, a window's first batch 25% of its step, others 1%",
        "data loading 15% of every step",
        data_loading,
    ),
    Detector(
        "launch-bound",
        "GPU steps, 30% of kernels started on an idle GPU, GPU idle 15%",
        "70% of kernels started on an idle GPU, GPU idle 50%",
        launch_bound,
    ),
    Detector("syncs", "GPU steps, half the runs read a loss once", "a .item() every step", syncs),
    Detector(
        "memory growth",
        "100 steps, 1 MB jitter, warm-up, an allocator plateau in half the runs",
        "a 1 MB-a-step leak over 100 steps",
        memory_growth,
    ),
    Detector("diff: step time", "10 against 10 steps, 42 rows", "B 20% slower", diff_step_time),
    Detector("diff: rows", "10 against 10 steps, 42 rows", "one operator (4% of the step) 1.5x", diff_rows),
    Detector("diff: gate at 5%", "10 against 10 steps, B 5% slower (at the limit)", "B 15% slower", diff_gate),
    Detector("compare verdict", "50 timed steps a variant, rounds of 1", "a variant 20% slower", compare_verdict),
    *(
        Detector(
            f"compare under load: {effect:g}x, {rounds} steps",
            f"{rounds} timed steps a variant, a CPU hog slowing 20% of rounds and 10% of steps 1.5-3x",
            f"a variant {effect:g}x slower",
            load_cases.compare_under_load(effect, rounds),
            detection_target=effect >= 10,
        )
        for effect, rounds in ((1.5, 20), (1.5, 50), (10.0, 20))
    ),
    Detector("slow-step trigger", "300 steps, factor 3, after 20 steps", "one step 4x", slow_step_trigger),
    *(
        Detector(
            f"{kind}, {n} ranks",
            f"{n} ranks alike, 4 steps of 12 collectives, data loading 5% of the step",
            f"rank 1 {what}",
            rank_finding(kind, n, effect),
        )
        for kind, effect, what in (
            ("straggler", "extra", "computes 25% longer (20% of the step)"),
            ("late_rank", "late", "loads data 20% of the step longer"),
        )
        for n in (2, 8)
    ),
    Detector("GPU idle", "GPU steps idle 20% (a window's first step 45%)", "the GPU idle 45% of every step", gpu_idle),
    *(
        Detector(kind, "FSDP2, 2 ranks x 4 steps, 12 blocks, the H200's good configuration", effect, fsdp_finding(kind))
        for kind, effect in FSDP_EFFECTS.items()
    ),
    *(Detector(*row) for row in calibration_memory.ROWS),
    Detector("loss head", "GPU steps, the loss head 8% of GPU time", "the loss head 20% of GPU time", loss_head),
)


class RealLoop:
    """A small MLP's training steps under ``kprof.session`` on this machine; each effect is injected into the loop."""

    def __init__(self, logdir: Path) -> None:
        import torch

        self.torch = torch
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.device == "cpu":
            torch.set_num_threads(1)  # intra-op threads spin against other processes: a step's time is not its own
        width, self.batch = (4096, 512) if self.device == "cuda" else (1024, 256)  # ~10-20 ms a step on a CPU
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(width, 2 * width), torch.nn.ReLU(), torch.nn.Linear(2 * width, width)
        ).to(self.device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-4)
        self.x = torch.randn(2 * self.batch, width, device=self.device)
        self.logdir, self.runs = logdir, 0
        self.step_s = min(self._timed() for _ in range(5))
        self.cycles_per_s = self._gpu_clock() if self.device == "cuda" else 0.0

    def _step(self, item: bool = False) -> None:
        loss = self.model(self.x[: self.batch]).square().mean()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if item:
            loss.item()

    def _timed(self) -> float:
        if self.device == "cuda":
            self.torch.cuda.synchronize()
        start = time.perf_counter()
        self._step()
        if self.device == "cuda":
            self.torch.cuda.synchronize()
        return time.perf_counter() - start

    def _gpu_clock(self) -> float:
        """Cycles a second of ``torch.cuda._sleep``, the GPU's own spin, timed with CUDA events."""
        cuda = self.torch.cuda
        cuda._sleep(1000)
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        cycles = 20_000_000
        start.record()
        cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return cycles / (start.elapsed_time(end) / 1e3)

    def _pause(self, seconds: float) -> None:
        """Make this step ``seconds`` longer where its time is spent: on the CPU a sleep; on a GPU a spin kernel,
        since the host runs steps ahead of the GPU and a host sleep there is absorbed, never slowing training."""
        if self.device == "cuda":
            self.torch.cuda._sleep(int(seconds * self.cycles_per_s))
        else:
            time.sleep(seconds)

    def _megabyte(self):
        """1 MB kept: on the GPU a tensor (CUDA allocated); on the CPU new pages (malloc would reuse freed ones)."""
        if self.device == "cuda":
            return self.torch.ones(2**18, device=self.device)
        block = mmap.mmap(-1, 2**20)
        block.write(b"\1" * len(block))
        return block

    def _tiny(self) -> None:
        t = self.x[:8, :8].clone()
        for _ in range(300):
            t = t * 1.0001 + 0.0001

    def run(self, steps: int, effect: str = "", schedule: dict | None = None, **options):
        """A session of ``steps`` steps with ``effect`` injected; returns it, stopped."""
        import kprof_callbacks as kprof

        self.runs += 1
        kept = []
        schedule = schedule or SCHEDULE
        with kprof.session(self.logdir, run=f"r{self.runs}", **schedule, **options) as s:
            for i in range(steps):
                if effect == "data":
                    with s.region("data_loading"):
                        time.sleep(0.15 / 0.85 * self.step_s)
                if effect in ("slow", "slower") and i == steps // 2:
                    self._pause(self.step_s * (1 if effect == "slow" else 3))
                if effect == "tiny":
                    self._tiny()
                else:
                    self._step(item=effect == "item")
                if effect == "longer":
                    self._pause(0.2 * self.step_s)
                if effect == "leak":
                    kept.append(self._megabyte())
                s.step()
        return s


def real_detectors(loop: RealLoop) -> tuple[Detector, ...]:
    """The detectors end to end on ``loop``'s machine: (name, run, effect, fired(rng, sigma, inject))."""

    def finding(kind: str, effect: str, steps: int = 14, **options):
        def fired(rng, sigma, inject) -> bool:
            return kind in {d.kind for d in loop.run(steps, effect if inject else "", **options).summary().diagnostics}

        return fired

    def leak(rng, sigma, inject) -> bool:
        session = loop.run(100, "leak" if inject else "", {"wait": 97, "warmup": 1, "active": 2, "repeat": 1})
        return "memory_growth" in {d.kind for d in session.summary().diagnostics}

    def step_time(rng, sigma, inject) -> bool:
        a, b = loop.run(14), loop.run(14, "longer" if inject else "")
        verdict = diff(a.run_dir, b.run_dir).step_time.verdict
        return verdict == stats.SLOWER if inject else verdict != stats.SAME

    def gate(rng, sigma, inject) -> bool:
        a, b = loop.run(14), loop.run(14, "longer" if inject else "")
        return diff(a.run_dir, b.run_dir).regressed(5)

    def trigger(rng, sigma, inject) -> bool:
        session = loop.run(
            120, "slower" if inject else "", {"warmup": 1, "active": 1}, trigger="slow_step", max_captures=1
        )
        return bool(session.captures)

    rows = [
        Detector("slow step", "10 profiled steps", "one step 2x (a sleep or spin)", finding("slow_step", "slow")),
        Detector(
            "data loading", "10 profiled steps", "a data_loading region 15% of each step", finding("dataloader", "data")
        ),
        Detector("memory growth", "100 steps, memory_every=5", "1 MB kept every step", leak),
        Detector(
            "diff: step time", "10 against 10 profiled steps", "B's steps 20% longer (a sleep or spin)", step_time
        ),
        Detector(
            "diff: gate at 5%",
            "10 against 10 profiled steps, the same code",
            "B's steps 20% longer (a sleep or spin)",
            gate,
        ),
        Detector("slow-step trigger", "120 steps, factor 3", "one step 4x (a sleep or spin)", trigger),
    ]
    statuses = Counter()  # the gate's exit statuses, with and without hogs
    rows += [
        Detector(
            "diff: machine changed",
            "14 steps a side, the same code (false positive: the gate at 5% calls a code regression)",
            "a CPU hog on every core from before B (detected: B busier, no code regression)",
            load_cases.diff_under_hog(loop, statuses),
            lambda: {"gate_exit_statuses": {f"{hog}: {status}": n for (hog, status), n in sorted(statuses.items())}},
        ),
        *(
            Detector(
                f"compare under a CPU hog: {effect:g}x",
                "20 timed steps a variant, hogs on every core (false positive: identical called faster/slower)",
                f"a variant {effect:g}x slower (a sleep)",
                load_cases.compare_under_hog(loop, effect),
                detection_target=effect >= 10,
            )
            for effect in (1.5, 10.0)
        ),
    ]
    if loop.device == "cuda":
        rows += [
            Detector("syncs", "10 profiled steps", "loss.item() every step", finding("sync", "item")),
            Detector(
                "launch-bound",
                "10 profiled steps of a compute-bound MLP",
                "300 tiny kernels a step",
                finding("launch_bound", "tiny"),
            ),
        ]
    return tuple(rows)


def wilson(hits: int, n: int) -> tuple[float, float]:
    """The 95% Wilson interval of a rate of ``hits`` in ``n``."""
    if n == 0:
        return 0.0, 1.0
    z, p = 1.959964, hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def calibrate(
    trials: int,
    seed: int = 0,
    detectors: tuple[Detector, ...] = DETECTORS,
    noise: tuple[float | None, ...] = NOISE,
    on_row: Callable[[list[dict]], None] = lambda rows: None,
    only: frozenset[str] | None = None,
) -> list[dict]:
    """Every detector at every noise level (None: the machine's own): false-positive and detection rates over
    ``trials`` seeded runs each. ``on_row(rows)`` after each row (the rows so far), so a long run cut short keeps
    what it measured. ``only``: the names of the detectors to run (each keeps the seeds it has in a full run)."""
    rows = []
    for k, det in enumerate(detectors):
        if only is not None and det.name not in only:
            continue
        for sigma in noise:
            started = time.perf_counter()
            rates = {}
            for inject in (False, True):
                rng = np.random.default_rng([seed, k, int((sigma or 0) * 1000), inject])
                hits = sum(det.fired(rng, sigma, inject) for _ in range(trials))
                rates[inject] = (hits / trials, *wilson(hits, trials))
            rows.append(
                {
                    "detector": det.name,
                    "noise_sigma": sigma,
                    "run": det.run,
                    "effect": det.effect,
                    "trials": trials,
                    "false_positive_rate": rates[False][0],
                    "false_positive_ci": list(rates[False][1:]),
                    "detection_rate": rates[True][0],
                    "detection_ci": list(rates[True][1:]),
                    "meets_targets": rates[False][0] <= FP_TARGET
                    and (rates[True][0] >= DETECTION_TARGET if det.detection_target else None),
                    "seconds": round(time.perf_counter() - started, 2),
                    **({"details": det.details()} if det.details else {}),
                }
            )
            print(_line(rows[-1]), flush=True)
            on_row(rows)
    return rows


def _line(row: dict) -> str:
    fp, det = row["false_positive_rate"], row["detection_rate"]
    sigma = "this machine" if row["noise_sigma"] is None else f"{row['noise_sigma']:.0%}"
    return (
        f"| {row['detector']} | {sigma} | {fp:.1%} [{row['false_positive_ci'][0]:.1%}, "
        f"{row['false_positive_ci'][1]:.1%}] | {det:.1%} [{row['detection_ci'][0]:.1%}, "
        f"{row['detection_ci'][1]:.1%}] | {row['effect']} | {_met(row['meets_targets'])} |"
    )


def _met(meets: bool | None) -> str:
    return "MISSED" if meets is False else "met" if meets else "false positives met, detection published"


def environment(real: bool) -> dict:
    """Where and when: the synthetic numbers do not depend on the device (no kernel runs), the versions might."""
    import torch

    from kprof_callbacks import __version__

    gpu = real and torch.cuda.is_available()
    return {
        "device": torch.cuda.get_device_name() if gpu else f"cpu ({platform.machine()}, {os.cpu_count()} cores)",
        "mode": "real" if real else "synthetic",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": {
            "kprof_callbacks": __version__,
            "python": platform.python_version(),
            "numpy": np.__version__,
            "torch": torch.__version__,
        },
    }


def _check_only(only: frozenset[str] | None, detectors: tuple[Detector, ...]) -> None:
    unknown = sorted((only or frozenset()) - {d.name for d in detectors})
    if unknown:
        raise SystemExit(f"--only: no detector named {unknown}; these run here: {[d.name for d in detectors]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=1000, help="seeded runs per rate (default 1000)")
    parser.add_argument("--quick", action="store_true", help="40 trials a rate: a smoke test")
    parser.add_argument("--real", action="store_true", help="end to end on this machine's training noise")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write the results as JSON here (again after each row)")
    parser.add_argument(
        "--only", help="comma-separated detector names to run (e.g. 'slow step,syncs'); default: all of them"
    )
    args = parser.parse_args(argv)
    trials = 40 if args.quick else args.trials
    only = None if args.only is None else frozenset(n.strip() for n in args.only.split(",") if n.strip())
    print(
        f"{trials} seeded trials per rate; targets: <= {FP_TARGET:.0%} false positives, "
        f">= {DETECTION_TARGET:.0%} detection\n"
    )
    print("| detector | noise | false positives [95% CI] | detection [95% CI] | injected effect | targets |")
    print("|---|---:|---:|---:|---|---|")
    started = time.perf_counter()
    command = shlex.join(["python", "benchmarks/calibration.py", *(sys.argv[1:] if argv is None else argv)])

    def write(rows: list[dict]) -> None:
        if args.out is None:
            return
        result = {
            **environment(args.real),
            "trials": trials,
            "seed": args.seed,
            "seconds": round(time.perf_counter() - started, 1),
            "targets": {"false_positive_rate": FP_TARGET, "detection_rate": DETECTION_TARGET},
            "rows": rows,
            "command": command,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")

    if args.real:
        with tempfile.TemporaryDirectory() as logdir:
            detectors = real_detectors(RealLoop(Path(logdir)))
            _check_only(only, detectors)
            rows = calibrate(trials, args.seed, detectors, (None,), write, only)
    else:
        _check_only(only, DETECTORS)
        rows = calibrate(trials, args.seed, on_row=write, only=only)
    write(rows)
    if args.out:
        print(f"\nwritten to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
