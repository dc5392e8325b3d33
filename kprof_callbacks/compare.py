"""``kprof.compare``: is my variant of a model faster, and does it still compute the same thing?

Every variant trains on the same batches. Before timing, ``check`` gives all variants the first one's weights,
runs one step on the same batch under the same RNG seed and compares forward outputs, loss and every gradient.
Timing then runs the variants in interleaved blocks, in a seeded random order per round, so clock, thermal and
background-load drift hits all of them alike; each step is timed with ``StepTimer`` (CUDA events on a GPU).
With ``logdir``, each variant is also profiled through ``kprof.session`` into ``logdir/<name>/``, so
TensorBoard's Profiler tab shows each run and its Diff view compares two, and ``logdir/compare.json`` holds the
numbers for the kprof tab.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import itertools
import json
import math
import os
import platform
import random
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from . import stats
from .timing import StepTimer, Timing

StepFn = Callable[[nn.Module, Any], torch.Tensor]
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]

BASELINE = "baseline"
ERROR = "error"
# Largest accepted max relative error (max |a - b| / max |ref|) per dtype; the looser of the two tensors' applies.
TOLERANCES = {torch.float64: 1e-7, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}
_OTHER_FLOAT_TOL = 1e-1  # float8 and friends
# Profiling schedule for the logdir traces, unless ``profile=`` says otherwise.
_PROFILE_DEFAULTS = dict(wait=1, warmup=1, active=3, repeat=1, record_shapes=True, scalars=False)


class ComparisonError(RuntimeError):
    """A variant's outputs, loss or gradients differ from the reference by more than the tolerance."""


@dataclasses.dataclass
class VariantResult:
    """One variant's numbers; ``timing`` is None when the variant failed (``status == "error"``)."""

    name: str
    status: str = "ok"
    error: str | None = None
    timing: Timing | None = None
    speedup: float | None = None  # median(baseline) / median(this): above 1 is faster
    ci: tuple[float, float] | None = None
    verdict: str | None = None
    peak_mem_mb: float | None = None
    check_against: str | None = None  # the reference variant of the numerical check
    check_max_rel_err: float | None = None
    check_tol: float | None = None
    check_worst: str | None = None  # the first tensor out of tolerance (None when all agree)
    trace_dir: str | None = None

    @property
    def check_ok(self) -> bool | None:
        """True/False once checked against a reference; None for the reference itself or without a check."""
        return None if self.check_against is None else self.check_worst is None

    def to_dict(self) -> dict:
        t = self.timing
        return {
            "name": self.name,
            "status": self.status,
            "error": self.error,
            "median_ms": t.median_ms if t else None,
            "p10_ms": t.p10_ms if t else None,
            "p90_ms": t.p90_ms if t else None,
            "speedup": self.speedup,
            "ci_low": self.ci[0] if self.ci else None,
            "ci_high": self.ci[1] if self.ci else None,
            "verdict": self.verdict,
            "peak_mem_mb": self.peak_mem_mb,
            "check_against": self.check_against,
            "check_ok": self.check_ok,
            "check_max_rel_err": _finite(self.check_max_rel_err),
            "check_tol": self.check_tol,
            "check_worst": self.check_worst,
            "trace_dir": self.trace_dir,
            "times_ms": list(t.times_ms) if t else [],
        }


def _finite(x: float | None) -> float | None:
    """JSON has no infinity: an infinite error (missing gradient, shape mismatch) becomes null."""
    return x if x is None or math.isfinite(x) else None


@dataclasses.dataclass
class Comparison:
    """The result of ``kprof.compare``: print it for the table, or take ``to_pandas()`` / ``to_dict()``."""

    variants: dict[str, VariantResult]
    baseline: str | None
    settings: dict
    device: str
    versions: dict

    def __getitem__(self, name: str) -> VariantResult:
        return self.variants[name]

    def to_dict(self) -> dict:
        return {
            "baseline": self.baseline,
            "device": self.device,
            "versions": self.versions,
            "settings": self.settings,
            "variants": [v.to_dict() for v in self.variants.values()],
        }

    def to_pandas(self):
        """One row per variant, indexed by name (the raw step times stay in ``to_dict()``)."""
        import pandas as pd

        rows = [{k: v for k, v in r.to_dict().items() if k != "times_ms"} for r in self.variants.values()]
        return pd.DataFrame(rows).set_index("name")

    def __str__(self) -> str:
        s = self.settings
        head = ["variant", "median ms", "p10", "p90", f"speedup [{100 * s['confidence']:g}% CI]", "verdict",
                "peak MB", "check max rel err"]
        rows = [head] + [_row(v) for v in self.variants.values()]
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]

        def line(cells: list[str]) -> str:
            return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

        out = [
            f"kprof compare on {self.device}: {s['steps']} timed steps per variant after {s['warmup']} warm-up, "
            f"in rounds of {s['block']} step(s) per variant, in a random order per round (seed {s['seed']})",
            line(head),
            line(["-" * w for w in widths]),
            *(line(r) for r in rows[1:]),
        ]
        if self.baseline is not None:
            out.append(
                f"speedup = median({self.baseline}) / median(variant); 'no significant difference' when the CI "
                f"includes 1.0 or the change is under {100 * s['noise_threshold']:g}%"
            )
        if any(v.peak_mem_mb is not None for v in self.variants.values()):
            out.append("peak MB: CUDA memory allocated during the variant's steps above what was resident before")
        for v in self.variants.values():
            if v.error:
                out.append(f"{v.name}: {v.error}")
            elif v.check_ok is False:
                out.append(f"{v.name}: CHECK FAILED at {v.check_worst} (tolerance {v.check_tol:.0e})")
        out.append("versions: " + ", ".join(f"{k} {val}" for k, val in self.versions.items() if val))
        return "\n".join(out)


def _row(v: VariantResult) -> list[str]:
    if v.check_max_rel_err is None:
        check = "-"
    elif v.check_against is None:
        check = "reference"
    else:
        check = f"{v.check_max_rel_err:.1e}" + ("" if v.check_ok else " FAIL")
    t = v.timing
    if t is None:
        return [v.name, "-", "-", "-", "-", v.verdict or ERROR, "-", check]
    speedup = "-" if v.speedup is None else f"{v.speedup:.3f}"
    if v.ci is not None:
        speedup += f" [{v.ci[0]:.3f}, {v.ci[1]:.3f}]"
    peak = "-" if v.peak_mem_mb is None else f"{v.peak_mem_mb:.1f}"
    return [v.name, f"{t.median_ms:.3f}", f"{t.p10_ms:.3f}", f"{t.p90_ms:.3f}", speedup, v.verdict, peak, check]


class _Variant:
    """Run-time state of one variant while ``compare`` runs."""

    def __init__(self, name: str, model: nn.Module | None) -> None:
        self.name = name
        self.model = model
        self.optimizer: torch.optim.Optimizer | None = None
        self.result = VariantResult(name)
        self.rounds: list[list[float]] = []  # seconds per timed step, one list per round
        self.peak_bytes = 0

    @property
    def ok(self) -> bool:
        return self.result.status == "ok"

    def fail(self, exc: BaseException) -> None:
        self.result.status = self.result.verdict = ERROR
        self.result.error = f"{type(exc).__name__}: {exc}"
        self.rounds.clear()


class _VariantFailed(Exception):
    """The variant's own code raised (kernel build error, shape bug, ...): report it, keep the others going."""


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

    ``check=True`` loads the first variant's weights into the others (in place; names and shapes must match),
    compares forward outputs, loss and every gradient on the first batch, and raises ``ComparisonError`` when a
    max relative error exceeds ``tol`` (default per dtype, ``TOLERANCES``); ``check="warn"`` warns instead,
    ``check=False`` skips it all. A variant whose code raises gets ``status="error"``; the others still run.
    ``logdir`` also profiles each variant into ``logdir/<name>/`` with a short ``kprof.session`` schedule
    (``profile`` overrides its options) and writes ``logdir/compare.json``.
    """
    _check_options(step_fn, steps, warmup, block, seed, check, tol, confidence, noise_threshold, optimizer)
    runs = _build_variants(variants)
    data = _take_batches(batches, warmup + steps)
    device = _device_of(runs, data[0])
    if check:
        _load_same_weights(runs)
    for run in runs:
        run.optimizer = _make_optimizer(optimizer, run)
    sessions = _make_sessions(runs, logdir, profile)

    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        if check:
            _check_agreement(runs, step_fn, data[0], seed, tol, check)
        for run in runs:
            _run_steps(run, step_fn, _cycle(data, 0, warmup))
        _timed_rounds(runs, step_fn, data, steps=steps, warmup=warmup, block=block, seed=seed, device=device)
        for run, sess in zip(runs, sessions):
            _profile(run, sess, step_fn, data)

    settings = dict(
        steps=steps, warmup=warmup, block=block, seed=seed, confidence=confidence, noise_threshold=noise_threshold,
        check=check, optimizer=optimizer is not None, logdir=None if logdir is None else str(logdir),
    )
    result = _summarize(runs, settings, device)
    if logdir is not None:
        _write_json(Path(logdir) / "compare.json", result.to_dict())
    return result


# -- validation ------------------------------------------------------------------------------------------------
def _check_options(step_fn, steps, warmup, block, seed, check, tol, confidence, noise_threshold, optimizer) -> None:
    if not callable(step_fn):
        raise TypeError(f"step_fn must be callable as step_fn(model, batch) -> loss, got {type(step_fn).__name__}")
    for name, value, low in (("steps", steps, 3), ("warmup", warmup, 0), ("block", block, 1), ("seed", seed, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    if not (check is True or check is False or check == "warn"):
        raise ValueError(f"check must be True, False or 'warn', got {check!r}")
    if tol is not None and (isinstance(tol, bool) or not isinstance(tol, (int, float)) or not tol > 0):
        raise ValueError(f"tol must be a number > 0 or None, got {tol!r}")
    if not isinstance(confidence, float) or not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be a float between 0 and 1, got {confidence!r}")
    if isinstance(noise_threshold, bool) or not isinstance(noise_threshold, (int, float)) or not noise_threshold >= 0:
        raise ValueError(f"noise_threshold must be a number >= 0, got {noise_threshold!r}")
    if optimizer is not None and not callable(optimizer):
        raise TypeError(f"optimizer must be a factory taking parameters (or None), got {type(optimizer).__name__}")


def _build_variants(variants) -> list[_Variant]:
    """Check names and values, then call the factories; a factory that raises marks its variant as failed."""
    if not isinstance(variants, Mapping):
        raise TypeError(f"variants must be a dict of name -> nn.Module, got {type(variants).__name__}")
    if not variants:
        raise ValueError("variants is empty: pass at least one, e.g. {'torch': model, 'kernels': kprof.swap(model)}")
    for name, value in variants.items():
        if not isinstance(name, str) or not name or Path(name).name != name:
            raise ValueError(f"variant names must be plain non-empty strings usable as folder names, got {name!r}")
        if not callable(value):
            raise TypeError(f"variants[{name!r}] must be an nn.Module or a factory of one, got {type(value).__name__}")
    runs = []
    for name, value in variants.items():
        run = _Variant(name, value if isinstance(value, nn.Module) else None)
        if run.model is None:
            try:
                run.model = value()
            except Exception as exc:
                run.fail(exc)
            else:
                if not isinstance(run.model, nn.Module):
                    raise TypeError(f"variants[{name!r}]() must return an nn.Module, got {type(run.model).__name__}")
        runs.append(run)
    return runs


def _take_batches(batches, needed: int) -> list:
    """The batches as a list (an iterator is read once, ``needed`` items at most); reused by every variant."""
    if isinstance(batches, torch.Tensor) or not isinstance(batches, Iterable):
        raise TypeError(
            f"batches must be an iterable of batches (a list, a DataLoader, a generator), got {type(batches).__name__}"
        )
    data = list(batches) if isinstance(batches, (list, tuple)) else list(itertools.islice(batches, needed))
    if not data:
        raise ValueError("batches is empty: compare needs at least one batch")
    return data


def _cycle(data: list, start: int, count: int) -> Iterator:
    return (data[(start + i) % len(data)] for i in range(count))


def _device_of(runs: list[_Variant], first_batch) -> torch.device:
    """The one device all variants live on (their first parameter or buffer), else the first batch's."""
    found = {}
    for run in runs:
        if run.ok:
            for t in itertools.chain(run.model.parameters(), run.model.buffers()):
                found[run.name] = t.device
                break
    devices = set(found.values())
    if len(devices) > 1:
        where = ", ".join(f"{name!r} on {dev}" for name, dev in found.items())
        raise ValueError(f"variants must live on one device to be compared, got {where}")
    if devices:
        return devices.pop()
    return next((t.device for _, t in _flat_tensors(first_batch, "batch")), torch.device("cpu"))


def _load_same_weights(runs: list[_Variant]) -> None:
    """Copy the first variant's state_dict into the others; a name or shape mismatch is a ValueError."""
    healthy = [r for r in runs if r.ok]
    if not healthy:
        return
    ref = healthy[0]
    state = ref.model.state_dict()
    for run in healthy[1:]:
        if run.model is ref.model:
            continue
        mismatch = _first_mismatch(state, run.model.state_dict(), ref.name, run.name)
        if mismatch:
            raise ValueError(f"variants {ref.name!r} and {run.name!r} cannot share weights: {mismatch}")
        run.model.load_state_dict(state)


def _first_mismatch(ref: Mapping, other: Mapping, ref_name: str, other_name: str) -> str | None:
    for key, value in ref.items():
        if key not in other:
            return f"{key!r} is in {ref_name!r} but missing from {other_name!r}"
        if value.shape != other[key].shape:
            shapes = f"{tuple(value.shape)} in {ref_name!r} but {tuple(other[key].shape)} in {other_name!r}"
            return f"{key!r} has shape {shapes}"
    extra = next((key for key in other if key not in ref), None)
    return None if extra is None else f"{extra!r} is in {other_name!r} but not in {ref_name!r}"


def _make_optimizer(factory: OptimizerFactory | None, run: _Variant) -> torch.optim.Optimizer | None:
    if factory is None or not run.ok:
        return None
    opt = factory(run.model.parameters())
    if not isinstance(opt, torch.optim.Optimizer):
        raise TypeError(f"optimizer factory must return a torch.optim.Optimizer, got {type(opt).__name__}")
    return opt


def _make_sessions(runs: list[_Variant], logdir, profile: Mapping | None) -> list:
    """One ``kprof.session`` per variant (run folder created now, so an unwritable logdir fails before any step)."""
    if logdir is None:
        if profile is not None:
            raise ValueError("profile options need a logdir to write the traces to")
        return [None] * len(runs)
    from .session import session

    options = {**_PROFILE_DEFAULTS, **(profile or {})}
    taken = {"logdir", "run"} & set(options)
    if taken:
        raise ValueError(f"profile must not set {sorted(taken)}: compare writes each variant to logdir/<name>")
    if options.get("trigger", "schedule") != "schedule" or options["repeat"] < 1:
        raise ValueError("profile must use a finite schedule (trigger='schedule', repeat >= 1)")
    return [session(logdir, run=run.name, **options) if run.ok else None for run in runs]


# -- running ---------------------------------------------------------------------------------------------------
def _no_region(name: str) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


def _train_step(run: _Variant, batch, step_fn: StepFn, *, update: bool = True, region=_no_region) -> torch.Tensor:
    """One training step of one variant; errors in the variant's own code come out as ``_VariantFailed``."""
    run.model.zero_grad(set_to_none=True)
    try:
        with region("forward"):
            loss = step_fn(run.model, batch)
    except Exception as exc:
        raise _VariantFailed() from exc
    _check_loss(loss)
    try:
        with region("backward"):
            loss.backward()
        if update and run.optimizer is not None:
            with region("optimizer"):
                run.optimizer.step()
    except Exception as exc:
        raise _VariantFailed() from exc
    return loss


def _check_loss(loss) -> None:
    if not isinstance(loss, torch.Tensor):
        raise TypeError(f"step_fn must return the loss as a torch.Tensor, got {type(loss).__name__}")
    if loss.numel() != 1:
        raise ValueError(f"step_fn must return a scalar loss, got a tensor of shape {tuple(loss.shape)}")
    if not loss.requires_grad:
        raise ValueError("step_fn returned a loss that does not require grad: compare times training steps")


def _run_steps(run: _Variant, step_fn: StepFn, batches: Iterable, **kwargs) -> None:
    if not run.ok:
        return
    try:
        for batch in batches:
            _train_step(run, batch, step_fn, **kwargs)
    except _VariantFailed as failed:
        run.fail(failed.__cause__)


def _timed_rounds(runs, step_fn, data, *, steps, warmup, block, seed, device) -> None:
    """Each round, every variant runs one block of steps; the order of variants is shuffled per round."""
    order = random.Random(seed)
    for start in range(0, steps, block):
        count = min(block, steps - start)
        for run in order.sample(runs, len(runs)):
            if run.ok:
                _timed_block(run, step_fn, list(_cycle(data, warmup + start, count)), device)


def _timed_block(run: _Variant, step_fn: StepFn, batches: list, device: torch.device) -> None:
    cuda = device.type == "cuda"
    run.model.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        resident = torch.cuda.memory_allocated(device)
    timer = StepTimer(cuda=cuda)
    try:
        timer.mark()
        for batch in batches:
            _train_step(run, batch, step_fn)
            timer.mark()
        timer.drain()
    except _VariantFailed as failed:
        run.fail(failed.__cause__)
        return
    except RuntimeError as exc:  # an asynchronous CUDA error surfaces at the synchronize in drain()
        run.fail(exc)
        return
    run.rounds.append(timer.times)
    run.model.zero_grad(set_to_none=True)
    if cuda:
        run.peak_bytes = max(run.peak_bytes, torch.cuda.max_memory_allocated(device) - resident)


def _profile(run: _Variant, sess, step_fn: StepFn, data: list) -> None:
    """Profile a few more steps of ``run`` through its kprof session (schedule from its config)."""
    if sess is None or not run.ok:
        return
    cfg = sess.config
    count = cfg.skip_first + (cfg.wait + cfg.warmup + cfg.active) * cfg.repeat
    with sess:
        try:
            for batch in _cycle(data, 0, count):
                _train_step(run, batch, step_fn, region=sess.region)
                sess.step()
        except _VariantFailed as failed:
            run.fail(failed.__cause__)
    run.result.trace_dir = None if sess.run_dir is None else str(sess.run_dir)


# -- numerical check ---------------------------------------------------------------------------------------------
def _check_agreement(runs: list[_Variant], step_fn: StepFn, batch, seed: int, tol: float | None, mode) -> None:
    """One step without the optimizer per variant, same seed; compare outputs, loss and gradients to the first."""
    reference, ref_name = None, None
    for run in runs:
        seen = _observe(run, step_fn, batch, seed) if run.ok else None
        if seen is None:
            continue
        if reference is None:
            reference, ref_name = seen, run.name
            run.result.check_max_rel_err = 0.0
        else:
            run.result.check_against = ref_name
            _compare_tensors(run.result, reference, seen, tol)
    bad = [r.result for r in runs if r.result.check_ok is False]
    if not bad:
        return
    message = f"variants disagree with {ref_name!r}:\n" + "\n".join(
        f"  {r.name}: max relative error {r.check_max_rel_err:.2e}, first out of tolerance ({r.check_tol:.0e}): "
        f"{r.check_worst}"
        for r in bad
    )
    if mode == "warn":
        warnings.warn(message, RuntimeWarning, stacklevel=3)
    else:
        raise ComparisonError(message)


def _observe(run: _Variant, step_fn: StepFn, batch, seed: int) -> dict[str, torch.Tensor | None] | None:
    """Forward outputs, loss and gradients of one step, in a stable order (None if the variant failed)."""
    outputs = []
    hook = run.model.register_forward_hook(lambda module, args, out: outputs.append(out))
    devices = [torch.cuda.current_device()] if torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            loss = _train_step(run, batch, step_fn, update=False)
    except _VariantFailed as failed:
        run.fail(failed.__cause__)
        return None
    finally:
        hook.remove()
    seen: dict[str, torch.Tensor | None] = {}
    for i, out in enumerate(outputs):
        seen.update((label, t.detach().clone()) for label, t in _flat_tensors(out, f"output#{i}"))
    seen["loss"] = loss.detach().clone()
    for name, param in run.model.named_parameters():
        seen[f"grad of {name}"] = None if param.grad is None else param.grad.detach().clone()
    run.model.zero_grad(set_to_none=True)
    return seen


def _flat_tensors(obj, label: str) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors inside nested tuples, lists and dicts, each with a readable path."""
    if isinstance(obj, torch.Tensor):
        yield label, obj
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            yield from _flat_tensors(value, f"{label}[{key!r}]")
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from _flat_tensors(value, f"{label}[{i}]")


def _compare_tensors(result: VariantResult, ref: dict, got: dict, tol: float | None) -> None:
    """Fill ``result``'s check fields: the largest relative error and the first tensor out of tolerance."""
    result.check_max_rel_err, result.check_tol, result.check_worst = 0.0, tol, None
    for label in [*ref, *(k for k in got if k not in ref)]:
        a, b = ref.get(label), got.get(label)
        if a is None and b is None:
            continue
        if a is None or b is None or a.shape != b.shape:
            err, limit = math.inf, 0.0
        else:
            err = _max_rel_err(a, b)
            limit = tol if tol is not None else max(_tolerance(a.dtype), _tolerance(b.dtype))
        result.check_max_rel_err = max(result.check_max_rel_err, err)
        if err > limit and result.check_worst is None:
            result.check_worst, result.check_tol = label, limit
        elif result.check_tol is None:
            result.check_tol = limit


def _tolerance(dtype: torch.dtype) -> float:
    if not dtype.is_floating_point and not dtype.is_complex:
        return 0.0
    return TOLERANCES.get(dtype, _OTHER_FLOAT_TOL)


def _max_rel_err(ref: torch.Tensor, got: torch.Tensor) -> float:
    """max |got - ref| / max |ref| (equal infinities and NaN-vs-NaN count as equal; other NaNs as infinite)."""
    if ref.numel() == 0:
        return 0.0
    ref, got = ref.double(), got.to(ref.device).double()
    same = (ref == got) | (ref.isnan() & got.isnan())
    diff = torch.where(same, torch.zeros_like(ref), (got - ref).abs()).max()
    if diff.isnan():
        return math.inf
    if diff == 0:
        return 0.0
    scale = torch.where(ref.isfinite(), ref.abs(), torch.zeros_like(ref)).max()
    return float(diff / scale) if scale > 0 else math.inf


# -- results -----------------------------------------------------------------------------------------------------
def _summarize(runs: list[_Variant], settings: dict, device: torch.device) -> Comparison:
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
        res.verdict = stats.verdict(speedup, low, high, threshold=settings["noise_threshold"])
    return Comparison(
        variants={r.name: r.result for r in runs},
        baseline=base.name if base else None,
        settings=settings,
        device=_device_name(device),
        versions=_versions(),
    )


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} ({device})"
    return f"{device.type} ({platform.machine()}, {torch.get_num_threads()} threads)"


def _versions() -> dict:
    from . import __version__

    return {
        "kprof_callbacks": __version__,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "numpy": np.__version__,
    }


def _write_json(path: Path, data: dict) -> None:
    """Write via a temp file and rename, so a reader never sees half a file."""
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(data, indent=2, allow_nan=False))
    os.replace(tmp, path)


# -- CLI -----------------------------------------------------------------------------------------------------------
def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="time a model with and without kprof.swap (custom kernels) and check they agree",
        description="Train a model and its kprof.swap copy on the same batches, check that outputs and gradients "
        "agree, and print step times with a bootstrap confidence interval on the speedup.",
    )
    p.add_argument(
        "--model",
        default="builtin",
        help="'builtin' (the demo ToyModel) or MODULE:ATTR naming a function f(device) that returns "
        "(model, step_fn, batches) (default: builtin)",
    )
    p.add_argument("--steps", type=int, default=50, help="timed steps per variant (default: 50)")
    p.add_argument("--warmup", type=int, default=5, help="untimed warm-up steps per variant (default: 5)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--logdir", default=None, help="also profile each variant into LOGDIR/<variant>/")
    p.add_argument(
        "--check", choices=("raise", "warn", "off"), default="raise", help="numerical check (default: raise)"
    )
    builtin = p.add_argument_group("builtin model size")
    builtin.add_argument("--width", type=int, default=128, help="hidden width (default: 128)")
    builtin.add_argument("--depth", type=int, default=4, help="number of blocks (default: 4)")
    builtin.add_argument("--batch-size", type=int, default=64, help="batch size (default: 64)")
    p.set_defaults(func=_run_cli)


def _run_cli(args: argparse.Namespace) -> int:
    from .swap import swap

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.model == "builtin":
        model, step_fn, batches = _builtin_setup(device, args.width, args.depth, args.batch_size)
    else:
        model, step_fn, batches = _user_setup(args.model, device)
    try:
        result = compare(
            {"torch": model, "kprof.swap": lambda: swap(model)},
            step_fn,
            batches,
            steps=args.steps,
            warmup=args.warmup,
            check={"raise": True, "warn": "warn", "off": False}[args.check],
            logdir=args.logdir,
            optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
        )
    except ComparisonError as exc:
        print(f"kprof compare: check failed, nothing timed: {exc}")
        return 1
    print(result)
    if args.logdir:
        print(f"traces: tensorboard --logdir {args.logdir}  (Profiler tab; its Diff view compares two runs)")
    return 0 if all(v.status == "ok" for v in result.variants.values()) else 1


def _builtin_setup(device: str, width: int, depth: int, batch_size: int):
    """The demo's ToyModel on its synthetic task: 8 distinct batches, cycled."""
    from .demo import ToyModel, synthetic_batches

    torch.manual_seed(0)
    model = ToyModel(width=width, depth=depth).to(device)
    return model, _cross_entropy_step, list(synthetic_batches(8, batch=batch_size, device=device))


def _cross_entropy_step(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def _user_setup(spec: str, device: str):
    """Import MODULE:ATTR and call it with the device; it must return (model, step_fn, batches)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SystemExit(f"kprof compare: --model must be 'builtin' or MODULE:ATTR, got {spec!r}")
    obj = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    setup = obj(device)
    if not (isinstance(setup, tuple) and len(setup) == 3 and isinstance(setup[0], nn.Module)):
        raise SystemExit(f"kprof compare: {spec}(device) must return (model, step_fn, batches)")
    return setup
