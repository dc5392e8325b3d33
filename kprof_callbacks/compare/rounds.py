"""Running the variants: one training step, the interleaved timed rounds, and the profiled steps."""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import torch

from .. import layout, stats
from ..timing import StepTimer
from .variants import StepFn, Variant, VariantFailed, cycle

# Profiling schedule for the logdir traces, unless ``profile=`` says otherwise; ``active`` comes from the confidence.
PROFILE_DEFAULTS = dict(wait=1, warmup=1, repeat=1, record_shapes=True, scalars=False)


def profiled_active(confidence: float) -> int:
    """Steps a variant's window records by default: enough for the trace diff's own step-time verdict at
    ``confidence`` (``stats.rank_min_steps``) once the window's first step, the profiler's start, is left out."""
    return stats.rank_min_steps(confidence) + 1


def _no_region(name: str) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


def train_step(run: Variant, batch, step_fn: StepFn, *, update: bool = True, region=_no_region) -> torch.Tensor:
    """One training step of one variant; errors in the variant's own code come out as ``VariantFailed``.

    The variant's first step (never a timed one) is timed on its own: under torch.compile it is the compilation."""
    if run.result.first_step_s is not None:
        return _step(run, batch, step_fn, update, region)
    start = time.perf_counter()
    loss = _step(run, batch, step_fn, update, region)
    if loss.is_cuda:
        torch.cuda.synchronize(loss.device)
    run.result.first_step_s = time.perf_counter() - start
    return loss


def _step(run: Variant, batch, step_fn: StepFn, update: bool, region) -> torch.Tensor:
    run.model.zero_grad(set_to_none=True)
    try:
        with region("forward"):
            loss = step_fn(run.model, batch)
    except Exception as exc:
        raise VariantFailed() from exc
    _check_loss(loss)
    try:
        with region("backward"):
            loss.backward()
        if update and run.optimizer is not None:
            with region("optimizer"):
                run.optimizer.step()
    except Exception as exc:
        raise VariantFailed() from exc
    return loss


def _check_loss(loss) -> None:
    if not isinstance(loss, torch.Tensor):
        raise TypeError(f"step_fn must return the loss as a torch.Tensor, got {type(loss).__name__}")
    if loss.numel() != 1:
        raise ValueError(f"step_fn must return a scalar loss, got a tensor of shape {tuple(loss.shape)}")
    if not loss.requires_grad:
        raise ValueError("step_fn returned a loss that does not require grad: compare times training steps")


def run_steps(run: Variant, step_fn: StepFn, batches: Iterable, **kwargs) -> None:
    if not run.ok:
        return
    try:
        for batch in batches:
            train_step(run, batch, step_fn, **kwargs)
    except VariantFailed as failed:
        run.fail(failed.__cause__)


def timed_rounds(
    runs, step_fn, *, steps, warmup, block, seed, device, on_block: Callable[[int], None] = lambda steps: None
) -> None:
    """Each round, every variant runs one block of steps on its own batches; the order of variants is shuffled per
    round. ``on_block(steps)`` after each block (the progress bar)."""
    order = random.Random(seed)
    for start in range(0, steps, block):
        count = min(block, steps - start)
        for run in order.sample(runs, len(runs)):
            if run.ok:
                _timed_block(run, step_fn, list(cycle(run.data, warmup + start, count)), device)
                on_block(count)


def _timed_block(run: Variant, step_fn: StepFn, batches: list, device: torch.device) -> None:
    cuda = device.type == "cuda"
    run.model.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        resident = torch.cuda.memory_allocated(device)
    timer = StepTimer(cuda=cuda, keep=max(1, len(batches)))
    try:
        timer.start()
        for batch in batches:
            train_step(run, batch, step_fn)
            timer.mark()
        timer.drain()
    except VariantFailed as failed:
        run.fail(failed.__cause__)
        return
    except RuntimeError as exc:  # an asynchronous CUDA error surfaces at the synchronize in drain()
        run.fail(exc)
        return
    run.rounds.append(timer.times())
    run.model.zero_grad(set_to_none=True)
    if cuda:
        run.peak_bytes = max(run.peak_bytes, torch.cuda.max_memory_allocated(device) - resident)


def profiled_steps(sess) -> int:
    """The steps a variant's session schedule runs (0 without a session)."""
    if sess is None:
        return 0
    cfg = sess.config
    return cfg.skip_first + (cfg.wait + cfg.warmup + cfg.active) * cfg.repeat


def profile(run: Variant, sess, step_fn: StepFn) -> None:
    """Profile a few more steps of ``run`` through its kprof session (schedule from its config)."""
    if sess is None or not run.ok:
        return
    with sess:
        try:
            for batch in cycle(run.data, 0, profiled_steps(sess)):
                train_step(run, batch, step_fn, region=sess.region)
                sess.step()
        except VariantFailed as failed:
            run.fail(failed.__cause__)
    run.result.trace_dir = None if sess.run_dir is None else str(sess.run_dir)


def make_sessions(
    runs: list[Variant], logdir, profile: Mapping | None, confidence: float = 0.95
) -> tuple[Path | None, list]:
    """The comparison's folder, claimed as a run folder is (a later comparison given the same logdir goes to
    ``<logdir>-2``), and one ``kprof.Session`` per variant in it (folders created now, so an unwritable logdir fails
    before any step), None for each where profiling is off (``KPROF=0``). The schedule is compare's own
    (``PROFILE_DEFAULTS`` and ``profiled_active(confidence)``, then ``profile``): the ``KPROF_<NAME>`` variables meant
    for training scripts do not apply."""
    if logdir is None:
        if profile is not None:
            raise ValueError("profile options need a logdir to write the traces to")
        return None, [None] * len(runs)
    from ..config import ProfileConfig
    from ..session import Session

    options = {**PROFILE_DEFAULTS, "active": profiled_active(confidence), **(profile or {})}
    taken = {"logdir", "run"} & set(options)
    if taken:
        raise ValueError(f"profile must not set {sorted(taken)}: compare writes each variant to logdir/<name>")
    if options.get("trigger", "schedule") != "schedule" or options["repeat"] < 1:
        raise ValueError("profile must use a finite schedule (trigger='schedule', repeat >= 1)")
    configs = [ProfileConfig.own_schedule(logdir=logdir, run=run.name, **options) if run.ok else None for run in runs]
    logdir = Path(logdir).expanduser().absolute()
    folder = layout.make_run_dir(logdir.parent, logdir.name)
    return folder, [
        Session(dataclasses.replace(config, logdir=folder)) if config is not None and config.enabled else None
        for config in configs
    ]
