"""``kprof.compare``: is my variant of a model faster, and does it still compute the same thing?

Every variant trains on the same batches. Before timing, ``check`` gives all variants the first one's weights,
runs one step on the same batch under the same RNG seed and compares forward outputs, loss and every gradient.
Timing then runs the variants in interleaved blocks, in a seeded random order per round, so clock, thermal and
background-load drift hits all of them alike; each step is timed with ``StepTimer`` (CUDA events on a GPU).
With ``logdir``, each variant is also profiled through ``kprof.session`` into ``logdir/<name>/``, so
TensorBoard's Profiler tab shows each run and its Diff view compares two, and ``logdir/compare.json`` holds the
numbers for the kprof tab. ``logdir`` is claimed as a session's run folder is (``layout.make_run_dir``): a later
comparison given the same one writes to ``<logdir>-2`` and says so, so no result is ever overwritten.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn

from .. import layout, stats, torch_compat
from ..checks import check_bool
from ..progress import Progress, ProgressArg
from ..timing import Timing
from .check import check_agreement, float64_copy
from .result import BASELINE, Comparison, device_name, trace_summary, versions
from .rounds import make_sessions, profiled_steps, run_steps, timed_rounds
from .rounds import profile as profile_variant
from .variants import (
    OptimizerFactory,
    StepFn,
    Variant,
    build_variants,
    check_options,
    cycle,
    device_of,
    load_same_weights,
    make_optimizer,
    take_batches,
)


def compare(
    variants: Mapping[str, nn.Module | Callable[[], nn.Module]],
    step_fn: StepFn,
    batches: Iterable,
    *,
    steps: int = 50,
    warmup: int = 5,
    block: int = 1,
    optimizer: OptimizerFactory | None = None,
    check: bool | str = True,
    tol: float | None = None,
    logdir: str | os.PathLike | None = None,
    profile: Mapping[str, Any] | None = None,
    seed: int = 0,
    confidence: float = 0.95,
    noise_threshold: float = 0.02,
    compile: bool = False,
    progress: ProgressArg = False,
) -> Comparison:
    """Time model variants on the same batches and check that they agree; the first variant that runs is the
    baseline of the speedups and the reference of the check (docs/kernels.md says more).

    ``variants`` maps names to models, or to zero-argument factories (``lambda: kprof.swap(model)``): a variant that
    fails to build, or whose code raises, gets ``status="error"`` and the others still run. ``step_fn(model, batch)``
    returns the scalar loss; a timed step also covers ``zero_grad(set_to_none=True)``, ``backward()`` and, with an
    ``optimizer`` factory (``lambda params: torch.optim.AdamW(params)``), ``step()`` of one optimizer per variant.
    ``steps`` timed steps per variant follow ``warmup`` untimed ones, in rounds of ``block`` steps a variant in a random
    order seeded by ``seed``; the speedup's interval resamples whole rounds (``stats.speedup_interval``). Step ``i``
    uses ``batches[i % len(batches)]`` (an iterator is read once, up to ``warmup + steps`` batches).

    ``check=True`` loads the first variant's weights into the others (in place), runs one step of each, and one of the
    first in float64: a variant passes when every output, the loss and every gradient is at most ``check.K`` times as
    far from float64 as the first variant's own, plus a few ulps; ``tol=`` holds every tensor to that max relative error
    against the first variant instead. A failure raises ``ComparisonError``; ``check="warn"`` warns, ``check=False``
    skips. ``compile=True`` runs every variant under ``torch.compile``; each variant's first step, which compiles, is
    reported and never timed. Noisy step times (p90/median > 1.5) or a wide interval widen the interval
    (``stats.judge``): a difference that still shows stands, with a note; else the verdict is "noisy measurement".

    ``logdir`` also profiles each variant into ``logdir/<name>/`` with a short ``kprof.session`` schedule (``profile``
    overrides its options; ``KPROF_<NAME>`` schedule variables do not apply, ``KPROF=0`` turns it off) and writes
    ``logdir/compare.json``; a logdir an earlier comparison holds is left alone, for ``<logdir>-2``
    (``settings["logdir"]``). ``progress=True``: a bar of the steps (stderr, or a notebook's widget), or a callable of
    ``(steps done, steps in all)``.
    """
    settings = _checked_settings(
        step_fn, steps, warmup, block, seed, check, tol, confidence, noise_threshold, optimizer, compile
    )
    runs = build_variants(variants)
    data = take_batches(batches, warmup + steps)
    device = device_of(runs, data[0])
    truth = _prepare(runs, data, check, tol, compile, optimizer)
    logdir, sessions = make_sessions(runs, logdir, profile, confidence)
    settings["logdir"] = None if logdir is None else str(logdir)
    _train(runs, sessions, step_fn, device, truth, settings, tol, progress)
    result = _results(runs, settings, device)
    if logdir is not None:
        _diff_traces(result)
        data = json.dumps(result.to_dict(), indent=2, allow_nan=False).encode()
        layout.atomic_write(logdir / layout.COMPARE_FILE, data)
    return result


def _checked_settings(
    step_fn, steps, warmup, block, seed, check, tol, confidence, noise_threshold, optimizer, compile
) -> dict[str, Any]:
    """``compare``'s options, checked before any work, as ``Comparison.settings`` records them (``logdir`` is set
    once the folder is claimed)."""
    check_options(step_fn, steps, warmup, block, seed, check, tol, confidence, noise_threshold, optimizer)
    if check_bool("compile", compile) and warmup < 1:
        raise ValueError("compile=True needs warmup >= 1: each variant's first step compiles and must not be timed")
    return dict(
        steps=steps,
        warmup=warmup,
        block=block,
        seed=seed,
        confidence=confidence,
        noise_threshold=noise_threshold,
        check=check,
        optimizer=optimizer is not None,
        logdir=None,
        compile=compile,
    )


def _prepare(
    runs: list[Variant], data: list, check: bool | str, tol: float | None, compile: bool, optimizer
) -> list[nn.Module | None]:
    """Give the variants the first one's weights (with ``check``), then each its compiled module (with ``compile``),
    optimizer and copy of the batches. Returns the float64 copy of the check's reference (None without one) in a
    list, from which the check takes it, so that it is freed before the timing."""
    truth_model = None
    if check:
        load_same_weights(runs)
        reference = next((r for r in runs if r.ok), None)
        truth_model = float64_copy(reference.model) if reference is not None and tol is None else None
    for run in runs:
        if compile and run.ok and not torch_compat.is_compiled(run.model):
            run.model = torch.compile(run.model)
        run.optimizer = make_optimizer(optimizer, run)
        run.data = copy.deepcopy(data)
    return [truth_model]


def _train(
    runs: list[Variant],
    sessions: list,
    step_fn: StepFn,
    device: torch.device,
    truth: list[nn.Module | None],
    settings: dict[str, Any],
    tol: float | None,
    progress: ProgressArg,
) -> None:
    """The check, the warm-up, the timed rounds and the profiled steps of every variant, on ``device``, with one
    progress bar over all their steps."""
    warmup, check = settings["warmup"], settings["check"]
    total = sum(warmup + settings["steps"] + profiled_steps(sess) for run, sess in zip(runs, sessions) if run.ok)
    with (
        torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext(),
        Progress(progress, total, "kprof compare", unit="step") as meter,
    ):
        if check:
            check_agreement(runs, step_fn, settings["seed"], tol, check, truth.pop())
        for run in runs:
            run_steps(run, step_fn, cycle(run.data, 0, warmup))
            meter.add(warmup)
        timed_rounds(
            runs,
            step_fn,
            steps=settings["steps"],
            warmup=warmup,
            block=settings["block"],
            seed=settings["seed"],
            device=device,
            on_block=meter.add,
        )
        for run, sess in zip(runs, sessions):
            profile_variant(run, sess, step_fn)
            meter.add(profiled_steps(sess))


def _results(runs: list[Variant], settings: dict, device: torch.device) -> Comparison:
    base = next((r for r in runs if r.ok), None)
    for run in runs:
        res = run.result
        if not run.ok:
            continue
        res.timing = Timing(tuple(t * 1e3 for r in run.rounds for t in r), str(device))
        if device.type == "cuda":
            res.peak_mem_mb = run.peak_bytes / 2**20
        if run is base:
            res.speedup, res.verdict = 1.0, BASELINE
            continue
        speedup, low, high = stats.speedup_interval(
            base.rounds, run.rounds, confidence=settings["confidence"], seed=settings["seed"]
        )
        res.speedup, res.ci = speedup, (low, high)
        res.verdict, res.noise_ci, res.note = stats.judge(
            speedup,
            low,
            high,
            _flat(base.rounds),
            _flat(run.rounds),
            rounds=len(base.rounds),
            threshold=settings["noise_threshold"],
            base_name=base.name,
        )
    return Comparison(
        variants={r.name: r.result for r in runs},
        baseline=base.name if base else None,
        settings=settings,
        device=device_name(device),
        versions=versions(),
    )


def _flat(rounds: list[list[float]]) -> list[float]:
    return [t for r in rounds for t in r]


def _diff_traces(result: Comparison) -> None:
    """Each variant's profiled steps against the baseline's (``kprof.diff``): which GPU activities (else operators)
    account for the change, in one paragraph per variant."""
    from ..analysis import diff

    base = result.variants.get(result.baseline) if result.baseline else None
    for res in result.variants.values():
        if res is base or base is None or base.trace_dir is None or res.trace_dir is None:
            continue
        try:
            res.trace_diff = trace_summary(res, diff(base.trace_dir, res.trace_dir), result.settings["steps"])
        except ValueError as exc:  # a variant whose traces could not be read: the timing still stands
            res.trace_diff = f"no trace diff: {exc}"
