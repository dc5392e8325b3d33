"""Calibration cases for a loaded machine (``calibration.py`` runs them): compare's noise rule on step times a CPU
hog spoils, and, end to end (``--real``), the same code diffed while a CPU hog starts between A and B, and compare
under hogs. A hog is a process spinning on a core (one per core: the training thread must share)."""

from __future__ import annotations

import contextlib
import copy
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator

import numpy as np

from kprof_callbacks import exits, stats

STEP_US = 100_000.0
LOAD_ROUNDS, LOAD_STEPS = 0.2, 0.1  # a CPU hog's share of rounds it slows (both blocks) and of steps (one block's)


def compare_rounds(base: list[list[float]], other: list[list[float]], rng: np.random.Generator) -> str:
    """compare's verdict on timed rounds, as ``compare/run.py`` calls it (the noise rule included)."""
    speedup, low, high = stats.speedup_interval(base, other, seed=int(rng.integers(2**31)))
    return stats.judge(speedup, low, high, sum(base, []), sum(other, []), rounds=len(base))[0]


def _loaded(rng: np.random.Generator, sigma: float, hit: np.ndarray, factor: float) -> list[list[float]]:
    """One variant's timed steps (rounds of 1) on a machine a CPU hog loads: the rounds it hits (``hit``: their
    slowdown, shared by both variants) and, now and then, a step of this variant's alone, 1.5-3x slower."""
    own = np.where(rng.random(hit.size) < LOAD_STEPS, rng.uniform(1.5, 3.0, hit.size), 1.0)
    return [[STEP_US * factor * h * o * rng.lognormal(0.0, sigma)] for h, o in zip(hit, own)]


def compare_under_load(effect: float, rounds: int) -> Callable[[np.random.Generator, float, bool], bool]:
    """compare with ``rounds`` timed steps a variant on a machine a CPU hog loads (p90/median about 2): identical
    variants must not be called faster or slower; a variant ``effect`` times slower must be called slower."""

    def fired(rng: np.random.Generator, sigma: float, inject: bool) -> bool:
        hit = np.where(rng.random(rounds) < LOAD_ROUNDS, rng.uniform(1.5, 3.0, rounds), 1.0)
        base, other = _loaded(rng, sigma, hit, 1.0), _loaded(rng, sigma, hit, effect if inject else 1.0)
        verdict = compare_rounds(base, other, rng)
        return verdict == stats.SLOWER if inject else verdict in (stats.FASTER, stats.SLOWER)

    return fired


@contextlib.contextmanager
def hogs(count: int | None = None) -> Iterator[None]:
    """``count`` processes (default: one per core) spinning on the CPU for the block."""
    spinning = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count or os.cpu_count() or 1)
    ]
    time.sleep(0.5)  # on the run queue before the measured steps begin
    try:
        yield
    finally:
        for proc in spinning:
            proc.kill()
            proc.wait()


def diff_under_hog(loop, statuses: Counter) -> Callable[[np.random.Generator, float, bool], bool]:
    """The same code twice, 14 steps each (``loop``: calibration's RealLoop); injected: hogs on every core from
    before B starts. Fires, without hogs, when the gate at 5% calls a code regression (exit 3); with them, when the
    diff says B ran on a busier machine and the gate calls no code regression (exit 0 or 4). ``statuses`` counts the
    gate's exit statuses, with and without hogs."""

    def fired(rng: np.random.Generator, sigma: float, inject: bool) -> bool:
        from kprof_callbacks.analysis import diff

        a = loop.run(14)
        with hogs() if inject else contextlib.nullcontext():
            b = loop.run(14)
        d = diff(a.run_dir, b.run_dir)
        status = d.gate_status(5)
        statuses["hogs" if inject else "no hog", status] += 1
        if not inject:
            return status == exits.REGRESSION
        return d.machine is not None and d.machine.busier == "B" and status != exits.REGRESSION

    return fired


class _Slower:
    """The loop's model with a sleep of ``extra`` seconds in its forward: a variant that many times slower."""

    def __init__(self, model, extra: float) -> None:
        import torch

        class Sleepy(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.inner = copy.deepcopy(model)

            def forward(self, x):
                time.sleep(extra)
                return self.inner(x)

        self.module = Sleepy()


def compare_under_hog(loop, effect: float) -> Callable[[np.random.Generator, float, bool], bool]:
    """kprof.compare of ``loop``'s model against a copy (injected: ``effect`` times slower by a sleep), 20 timed
    steps a variant, with hogs on every core throughout."""

    def fired(rng: np.random.Generator, sigma: float, inject: bool) -> bool:
        import kprof_callbacks as kprof

        model = loop.model
        other = _Slower(model, (effect - 1.0) * loop.step_s).module if inject else copy.deepcopy(model)
        with hogs():
            result = kprof.compare(
                {"base": model, "other": other},
                lambda m, x: m(x).square().mean(),
                [loop.x[: loop.batch]],
                steps=20,
                warmup=2,
                check=False,
                seed=int(rng.integers(2**31)),
            )
        verdict = result["other"].verdict
        return verdict == stats.SLOWER if inject else verdict in (stats.FASTER, stats.SLOWER)

    return fired
