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
import json
import math
import os
import platform
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

from kprof_callbacks import stats, triggers
from kprof_callbacks.analysis import Summary, diagnostics, diff, growth
from kprof_callbacks.analysis.perstep import PerStep
from kprof_callbacks.config import ProfileConfig
from kprof_callbacks.metrics import EARLY_MEMORY_STEPS

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibration_base as common  # noqa: E402
import calibration_memory  # noqa: E402
import calibration_ranks  # noqa: E402
import calibration_real  # noqa: E402
from calibration_base import Detector  # noqa: E402

import _record  # noqa: E402
import load_cases  # noqa: E402

NOISE = (0.05, 0.15)
FP_TARGET, DETECTION_TARGET = 0.05, 0.95


def slow_step(rng: np.random.Generator, sigma: float, inject: bool) -> bool:
    walls = common.walls(rng, sigma, 2 * common.WINDOW)
    if inject:
        walls[rng.integers(walls.size)] = 2.0 * common.STEP_US
    return "slow_step" in common.findings(common.step_stats(walls), diagnostics.Evidence())


def data_loading(rng: np.random.Generator, sigma: float, inject: bool) -> bool:
    walls = common.walls(rng, sigma, 2 * common.WINDOW)
    share = np.where(np.arange(walls.size) % common.WINDOW == 0, 0.25, 0.01)  # a window's first batch: a fresh iterator
    if inject:
        share = np.full(walls.size, 0.15)
    loader = walls * share * rng.lognormal(0.0, sigma, walls.size)
    return "dataloader" in common.findings(common.step_stats(walls, dataloader_us=loader), diagnostics.Evidence())


def launch_bound(rng: np.random.Generator, sigma: float, inject: bool) -> bool:
    walls = common.walls(rng, sigma, 2 * common.WINDOW)
    idle_share = np.clip((0.5 if inject else 0.15) * rng.lognormal(0.0, sigma, walls.size), 0, 0.95)
    kernels = 40 * walls.size
    waited = rng.binomial(kernels, 0.7 if inject else 0.3)
    ev = diagnostics.Evidence(has_gpu=True, kernels=kernels, kernel_us=kernels * 20.0, waited_kernels=waited)
    busy = walls * (1 - idle_share)
    steps = common.step_stats(walls, gpu_busy_us=busy, gpu_idle_us=walls - busy, kernel_us=busy)
    return "launch_bound" in common.findings(steps, ev)


def gpu_idle(rng: np.random.Generator, sigma: float, inject: bool) -> bool:
    """The GPU idle 20% of a step (each window's first step 45%: the profiler starting, the first batch), or 45% of
    every step."""
    walls = common.walls(rng, sigma, 2 * common.WINDOW)
    typical = np.where(np.arange(walls.size) % common.WINDOW == 0, 0.45, 0.45 if inject else 0.20)
    idle_share = np.clip(typical * rng.lognormal(0.0, sigma, walls.size), 0, 0.95)
    busy = walls * (1 - idle_share)
    steps = common.step_stats(walls, gpu_busy_us=busy, gpu_idle_us=walls - busy, kernel_us=busy)
    return "gpu_idle" in common.findings(steps, diagnostics.Evidence(has_gpu=True))


def syncs(rng: np.random.Generator, sigma: float, inject: bool) -> bool:
    walls = common.walls(rng, sigma, 2 * common.WINDOW)
    per_step = np.zeros(walls.size)
    if inject:
        per_step += 1 + rng.binomial(1, 0.2, walls.size)  # a .item() each step, a second one now and then
    elif rng.random() < 0.5:
        per_step[rng.integers(walls.size)] = 1  # a loss read once, for a log line
    ev = diagnostics.Evidence(has_gpu=True, syncs=Counter({"cudaStreamSynchronize": int(per_step.sum())}))
    steps = common.step_stats(walls, gpu_busy_us=walls * 0.9, gpu_idle_us=walls * 0.1, kernel_us=walls * 0.9)
    return "sync" in common.findings(steps, ev, (["op"], ["cudaStreamSynchronize"], per_step[None]))


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
    walls = common.walls(rng, sigma, 2 * common.WINDOW)
    busy = walls * 0.9
    share = np.clip((0.20 if inject else 0.08) * rng.lognormal(0.0, sigma, walls.size), 0.0, 1.0)
    steps = common.step_stats(walls, gpu_busy_us=busy, gpu_idle_us=walls - busy, kernel_us=busy)
    ev = diagnostics.Evidence(has_gpu=True)
    ev.loss_head.gpu_us.update({(s.rank, s.worker, s.step): float(x * s.gpu_busy_us) for s, x in zip(steps, share)})
    ev.loss_head.logits[(4096, 50304)] = Counter({4: 1, 2: 1})
    return "loss_head" in common.findings(steps, ev)


OPS = np.geomspace(20, 2000, 30)
KERNELS = np.geomspace(5, 500, 12)


def _summary(rng: np.random.Generator, sigma: float, n: int, scale: np.ndarray) -> Summary:
    """A run of ``n`` steps of 30 operators and 12 kernels (``scale``: each row's factor), as a Summary's table."""
    base = np.concatenate([OPS, KERNELS]) * scale
    time_us = base[:, None] * rng.lognormal(0.0, sigma, (base.size, n))
    time_us[:, :: common.WINDOW] *= 1.10  # each window's first step: the profiler starting
    calls = np.ones_like(time_us)
    kinds = ["op"] * OPS.size + ["kernel"] * KERNELS.size
    names = [f"aten::op{k}" for k in range(OPS.size)] + [f"kernel_{k}" for k in range(KERNELS.size)]
    steps = common.step_stats(time_us.sum(axis=0))
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
    base = [[common.STEP_US * rng.lognormal(0.0, sigma)] for _ in range(rounds)]
    other = [[common.STEP_US * (1.2 if inject else 1.0) * rng.lognormal(0.0, sigma)] for _ in range(rounds)]
    verdict = load_cases.compare_rounds(base, other, rng)
    return verdict == stats.SLOWER if inject else verdict in (stats.FASTER, stats.SLOWER)


def slow_step_trigger(rng: np.random.Generator, sigma: float, inject: bool, steps: int = 300) -> bool:
    """The trigger's defaults (3x the running median, after 20 steps) on 300 steps; the effect: one 4x step."""
    times = common.STEP_US / 1e6 * rng.lognormal(0.0, sigma, steps)
    if inject:
        times[steps // 2] *= 4.0
    fired: list[str] = []
    feed = iter(times.tolist())
    trigger = triggers.SlowStep(ProfileConfig(), lambda reason: fired.append(reason) or True, lambda: (0, [next(feed)]))
    for step in range(steps):
        trigger.on_step(step)
    return bool(fired)


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
            calibration_ranks.rank_finding(kind, n, effect),
        )
        for kind, effect, what in (
            ("straggler", "extra", "computes 25% longer (20% of the step)"),
            ("late_rank", "late", "loads data 20% of the step longer"),
        )
        for n in (2, 8)
    ),
    Detector("GPU idle", "GPU steps idle 20% (a window's first step 45%)", "the GPU idle 45% of every step", gpu_idle),
    *(
        Detector(
            kind,
            "FSDP2, 2 ranks x 4 steps, 12 blocks, the H200's good configuration",
            effect,
            calibration_ranks.fsdp_finding(kind),
        )
        for kind, effect in calibration_ranks.FSDP_EFFECTS.items()
    ),
    *(Detector(*row) for row in calibration_memory.ROWS),
    Detector("loss head", "GPU steps, the loss head 8% of GPU time", "the loss head 20% of GPU time", loss_head),
)


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


def environment(real: bool, run: str) -> dict:
    """Where and when (``_record.header``): the synthetic numbers do not depend on the device (no kernel runs), the
    versions might."""
    import torch

    from kprof_callbacks import __version__

    gpu = real and torch.cuda.is_available()
    device = torch.cuda.get_device_name() if gpu else f"cpu ({platform.machine()}, {os.cpu_count()} cores)"
    return {
        **_record.header(device, run, kprof_callbacks=__version__, numpy=np.__version__),
        "mode": "real" if real else "synthetic",
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
    command = _record.command("calibration.py", argv)

    def write(rows: list[dict]) -> None:
        if args.out is None:
            return
        result = {
            **environment(args.real, command),
            "trials": trials,
            "seed": args.seed,
            "seconds": round(time.perf_counter() - started, 1),
            "targets": {"false_positive_rate": FP_TARGET, "detection_rate": DETECTION_TARGET},
            "rows": rows,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")

    if args.real:
        with tempfile.TemporaryDirectory() as logdir:
            detectors = calibration_real.real_detectors(calibration_real.RealLoop(Path(logdir)))
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
