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
    """Time model variants on the same batches and check that they agree.

    The first variant that runs is the baseline of the speedups and the reference of the check.

    ``variants`` maps names to models, or to zero-argument factories (``lambda: kprof.swap(model)``) so that a
    variant that fails to build is reported instead of stopping the others. ``step_fn(model, batch)`` runs the
    forward pass and returns the scalar loss tensor; the harness does the rest of a training step:
    ``zero_grad(set_to_none=True)``, ``loss.backward()`` and, when ``optimizer`` is a factory such as
    ``lambda params: torch.optim.AdamW(params)``, ``step()`` of one optimizer per variant. A timed step covers
    all of that.

    ``steps`` timed steps per variant follow ``warmup`` untimed ones. Timing runs in rounds: each round, every
    variant runs ``block`` steps, in a random order (seeded by ``seed``); the confidence interval on the speedup
    resamples whole rounds (``stats.speedup_interval``), so more, shorter rounds give a better interval, and a
    longer ``block`` measures steady-state throughput with fewer device syncs. Step ``i`` of every variant uses
    ``batches[i % len(batches)]`` (an iterator is read once, up to ``warmup + steps`` batches).

    ``check=True`` loads the first variant's weights into the others (in place; names and shapes must match), runs
    one step of each on its copy of the first batch, and also one of the first variant in float64; a variant passes
    when every output, the loss and every gradient is at most ``check.K`` times as far from the float64 result as
    the first variant's own (plus a few ulps), so bf16 autocast needs no tolerance (see ``compare/check.py``).
    ``tol=`` instead holds every tensor to that max relative error against the first variant. A variant that
    fails raises ``ComparisonError``; ``check="warn"`` warns instead, ``check=False`` skips it all. A variant whose
    code raises gets ``status="error"``; the others still run.
    ``compile=True`` runs every variant under ``torch.compile`` (variants that are compiled modules already work
    as they are); each variant's first step, which compiles, is never timed and is reported. When step times vary a
    lot (p90/median > 1.5) or the interval is wide, the interval is widened by that spread (``stats.judge``): a
    difference it still shows stands, with a note that the machine was noisy; else the verdict is "noisy
    measurement", with each variant's own spread and what to do.
    ``logdir`` also profiles each variant into ``logdir/<name>/`` with a short ``kprof.session`` schedule
    (``profile`` overrides its options; the ``KPROF_<NAME>`` schedule variables do not apply, ``KPROF=0`` turns the
    profiling off) and writes ``logdir/compare.json``. A logdir an earlier comparison (or session) holds is left
    alone: this one goes to ``<logdir>-2`` (``settings["logdir"]`` names the folder used). ``progress=True`` shows
    a bar of the variants' training steps (warm-up, timed and profiled; on stderr, or a notebook's widget), a
    callable gets ``(steps done, steps in all)``.
    """
    check_options(step_fn, steps, warmup, block, seed, check, tol, confidence, noise_threshold, optimizer)
    if check_bool("compile", compile) and warmup < 1:
        raise ValueError("compile=True needs warmup >= 1: each variant's first step compiles and must not be timed")
    runs = build_variants(variants)
    data = take_batches(batches, warmup + steps)
    device = device_of(runs, data[0])
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
    logdir, sessions = make_sessions(runs, logdir, profile, confidence)

    total = sum(warmup + steps + profiled_steps(sess) for run, sess in zip(runs, sessions) if run.ok)
    with (
        torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext(),
        Progress(progress, total, "kprof compare", unit="step") as meter,
    ):
        if check:
            check_agreement(runs, step_fn, seed, tol, check, truth_model)
            del truth_model
        for run in runs:
            run_steps(run, step_fn, cycle(run.data, 0, warmup))
            meter.add(warmup)
        timed_rounds(
            runs, step_fn, steps=steps, warmup=warmup, block=block, seed=seed, device=device, on_block=meter.add
        )
        for run, sess in zip(runs, sessions):
            profile_variant(run, sess, step_fn)
            meter.add(profiled_steps(sess))

    settings = dict(
        steps=steps,
        warmup=warmup,
        block=block,
        seed=seed,
        confidence=confidence,
        noise_threshold=noise_threshold,
        check=check,
        optimizer=optimizer is not None,
        logdir=None if logdir is None else str(logdir),
        compile=compile,
    )
    result = _results(runs, settings, device)
    if logdir is not None:
        _diff_traces(result)
        data = json.dumps(result.to_dict(), indent=2, allow_nan=False).encode()
        layout.atomic_write(logdir / layout.COMPARE_FILE, data)
    return result


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
