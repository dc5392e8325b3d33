"""The memory findings' calibration cases (rows of ``calibration.py``): each builds the peaks of 10 profiled steps (two
windows of 5) from a seeded noise model, with or without the effect, and asks `memory_findings` as kprof does.

Every kind alive at a step's peak varies from step to step by the noise (lognormal, sigma 5% or 15%); noise-only
runs also hold what real runs have and no rule may blame: each window's first step with the effect (the optimizer's
state being made, a one-off buffer, the allocator growing its cache), and a typical share well under the threshold.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kprof_callbacks.analysis import memory_findings as mf
from kprof_callbacks.analysis.memory import KINDS, MemoryBlock, MemoryStep, MemorySummary

STEPS, WINDOW = 10, 5
GB = 2**30


def _run(rng: np.random.Generator, sigma: float, shares: dict[str, np.ndarray], largest: np.ndarray, idle: np.ndarray):
    """A run whose steps hold ``shares`` of an 8 GB peak by kind (each with noise), one block of ``largest`` of it
    and ``idle`` of the reserved memory unused, as `memory_findings` reads it."""
    steps = []
    for i in range(STEPS):
        kinds = {k: int(GB * 8 * shares.get(k, np.zeros(STEPS))[i] * rng.lognormal(0.0, sigma)) for k in KINDS}
        peak = sum(kinds.values())
        reserved = int(peak / (1.0 - min(idle[i] * rng.lognormal(0.0, sigma), 0.95)))
        big = int(peak * largest[i] * rng.lognormal(0.0, sigma))
        steps.append(MemoryStep(i, None, "w", peak, reserved, 0.0, "backward", "", kinds, {}, big))
    block = MemoryBlock(steps[0].largest, "temporaries", "lm_head", "aten::cross_entropy_loss", "", "", "", 0, 1)
    return MemorySummary("cuda", steps, steps[0], [], [], [block], [], [])


def _first_of_window(typical: float, first: float) -> np.ndarray:
    return np.where(np.arange(STEPS) % WINDOW == 0, first, typical)


def _rest(**shares: np.ndarray) -> dict[str, np.ndarray]:
    """The shares given, the parameters and gradients taking the rest of each step's peak."""
    used = sum(shares.values())
    return {**shares, "parameters": (1 - used) / 2, "gradients": (1 - used) / 2}


def activations(rng: np.random.Generator, sigma: float, inject: bool) -> bool:
    """Activations 35% of the peak (a window's first step 60%), or 60% of every step."""
    acts = _first_of_window(0.60 if inject else 0.35, 0.60)
    run = _run(rng, sigma, _rest(activations=acts), np.full(STEPS, 0.02), np.full(STEPS, 0.05))
    return mf.activations(run.steps, run) is not None


def large_tensor(rng: np.random.Generator, sigma: float, inject: bool) -> bool:
    """One tensor 4% of the peak (a window's first step 12%: a one-off buffer), or 12% of every step."""
    largest = _first_of_window(0.12 if inject else 0.04, 0.12)
    run = _run(rng, sigma, _rest(activations=np.full(STEPS, 0.3)), largest, np.full(STEPS, 0.05))
    return mf.large_blocks(run.steps, run) is not None


def optimizer_state(rng: np.random.Generator, sigma: float, inject: bool) -> bool:
    """Optimizer state 15% of the peak (a window's first step 30%: the state being made), or 32% of every step."""
    state = _first_of_window(0.32 if inject else 0.15, 0.30)
    run = _run(rng, sigma, _rest(optimizer_state=state), np.full(STEPS, 0.02), np.full(STEPS, 0.05))
    return mf.optimizer_state(run.steps) is not None


def fragmentation(rng: np.random.Generator, sigma: float, inject: bool) -> bool:
    """10% of the reserved memory unused at the peak (a window's first step 40%: the cache growing), or 35%."""
    idle = _first_of_window(0.35 if inject else 0.10, 0.40)
    run = _run(rng, sigma, _rest(activations=np.full(STEPS, 0.3)), np.full(STEPS, 0.02), idle)
    return mf.fragmentation(run.steps, {}) is not None


ROWS: tuple[tuple[str, str, str, Callable[[np.random.Generator, float, bool], bool]], ...] = (
    (
        "memory: activations",
        "10 steps' peaks of 8 GB, activations 35% (a window's first step 60%)",
        "activations 60% of every peak",
        activations,
    ),
    (
        "memory: large tensor",
        "10 steps' peaks, the largest tensor 4% (a window's first step 12%)",
        "one tensor 12% of every peak",
        large_tensor,
    ),
    (
        "memory: optimizer state",
        "10 steps' peaks, optimizer state 15% (a window's first step 30%)",
        "optimizer state 32% of every peak",
        optimizer_state,
    ),
    (
        "memory: fragmentation",
        "10 steps' peaks, 10% of the reserved unused (a window's first step 40%)",
        "35% of the reserved unused at every peak",
        fragmentation,
    ),
)
"""(name, run, effect, detector): the `Detector` rows calibration.py adds."""
