"""Findings a user can trust: a window's first step or one outlier step does not decide a finding, and each finding
shows the per-step evidence it used."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np

from kprof_callbacks.analysis import diagnostics
from kprof_callbacks.analysis.perstep import PerStep
from kprof_callbacks.analysis.tables import StepStats


def _steps(wall_ms: list[float], loader_ms: list[float], numbers: list[int] | None = None) -> list[StepStats]:
    numbers = numbers or list(range(len(wall_ms)))
    return [
        StepStats(
            step=n,
            rank=None,
            worker="w",
            wall_us=w * 1e3,
            gpu_busy_us=0.0,
            gpu_idle_us=0.0,
            kernel_us=0.0,
            memcpy_us=0.0,
            memset_us=0.0,
            comm_us=0.0,
            cpu_only_us=w * 1e3,
            dataloader_us=d * 1e3,
            peak_memory=0,
        )
        for n, w, d in zip(numbers, wall_ms, loader_ms)
    ]


def _diagnose(steps: list[StepStats]) -> dict[str, str]:
    per_step = PerStep([], [], np.zeros((0, len(steps))), np.zeros((0, len(steps))), steps)
    found = diagnostics.diagnose(steps, [], [], diagnostics.Evidence(has_gpu=False), per_step)
    return {d.kind: d.message for d in found}


def test_data_loading_of_each_windows_first_step_is_not_a_finding():
    """A Lightning run on an in-memory TensorDataset: 8.77 and 12.6 ms in the first step of each window,
    under 0.7 ms elsewhere; the mean share was 13% ("raise num_workers"), the median share is 2%."""
    loader = [8.77, 0.49, 0.44, 12.6, 0.68, 0.48]
    found = _diagnose(_steps([40.0 + d for d in loader], loader, [3, 4, 5, 9, 10, 11]))
    assert "dataloader" not in found


def test_data_loading_of_most_steps_is_a_finding_with_each_steps_time():
    loader = [9.0, 8.5, 9.2, 0.5, 8.8, 9.1]
    found = _diagnose(_steps([40.0 + d for d in loader], loader, [3, 4, 5, 9, 10, 11]))
    message = found["dataloader"]
    assert message.startswith(
        "Data loading takes 18% of a step (median over 6 steps; 8.90 ms per step; by step "
        "3: 9.00 ms, 4: 8.50 ms, 5: 9.20 ms, 9: 500 us, 10: 8.80 ms, 11: 9.10 ms)"
    )


def _with_syncs(per_step_syncs: list[int]) -> dict[str, str]:
    steps = _steps([20.0] * len(per_step_syncs), [0.0] * len(per_step_syncs))
    steps = [dataclasses.replace(s, gpu_busy_us=s.wall_us, cpu_only_us=0.0) for s in steps]
    calls = np.array([per_step_syncs], dtype=np.float64)
    per_step = PerStep(["op"], ["cudaStreamSynchronize"], calls * 50.0, calls, steps)
    ev = diagnostics.Evidence(has_gpu=True, syncs=Counter({"cudaStreamSynchronize": sum(per_step_syncs)}))
    return {d.kind: d.message for d in diagnostics.diagnose(steps, [], [], ev, per_step)}


def test_a_sync_in_one_step_is_not_a_finding_and_one_in_every_step_is():
    assert "sync" not in _with_syncs([0, 0, 0, 3, 0, 0, 0, 0, 0])  # a loss logged once, say
    message = _with_syncs([1, 1, 2, 1, 1, 1])["sync"]
    assert message.startswith("1.2 host-GPU synchronizations per step (cudaStreamSynchronize x7; ")
    assert "by step 0: 1, 1: 1, 2: 2, 3: 1, 4: 1, 5: 1)" in message


def test_reads_of_cpu_tensors_in_every_step_are_not_syncs():
    """AdamW reads its CPU step counts with .item() twice per parameter each step; they wait for no GPU."""
    steps = [dataclasses.replace(s, gpu_busy_us=s.wall_us, cpu_only_us=0.0) for s in _steps([20.0] * 6, [0.0] * 6)]
    calls = np.full((1, 6), 296.0)
    per_step = PerStep(["op"], [diagnostics.SCALAR_READ], calls * 2.0, calls, steps)
    found = diagnostics.diagnose(steps, [], [], diagnostics.Evidence(has_gpu=True), per_step)
    assert "sync" not in {d.kind for d in found}


def test_a_slow_step_is_judged_against_how_much_the_steps_vary():
    """1.6x the median is slow among steady steps; among steps that vary by ~20% (a shared CPU) it is ordinary,
    and 2.4x is not. The longest and shortest steps are left out of the spread."""
    steady = [100.0, 101.0, 99.0, 100.0, 102.0, 98.0, 100.0, 101.0, 99.0]
    assert "slow_step" in _diagnose(_steps(steady + [160.0], [0.0] * 10))
    noisy = [100.0, 125.0, 80.0, 106.0, 132.0, 76.0, 95.0, 118.0, 88.0]
    assert "slow_step" not in _diagnose(_steps(noisy + [160.0], [0.0] * 10))
    message = _diagnose(_steps(noisy + [250.0], [0.0] * 10))["slow_step"]
    assert message.startswith("Step 9 took 250.0 ms, 2.4x the median 103.0 ms.")
    assert diagnostics.slow_threshold(np.array(steady + [400.0])) == diagnostics.SLOW_STEP_RATIO
    assert 1.6 < diagnostics.slow_threshold(np.array(noisy + [400.0])) < 1.75
