"""The numerical check of ``compare``: is each variant as close to the truth as the reference is?

Under mixed precision no fixed tolerance works: bf16 matmuls put the reference itself ~1e-2 away from the exact
gradients, so a check that holds variants to 1e-4 rejects every bf16 model, and a loose one hides real mistakes.
So, as fused-attention kernels are tested, the check also runs the reference variant in float64 (a copy of it on
the same device, its floating inputs in float64; autocast leaves float64 alone, so the user's autocast block stays
as it is) and accepts a variant when, for every output, the loss and every gradient,

    error(variant vs float64) <= K x error(reference vs float64) + floor(dtype)

with errors as max |a - b| / max |float64|. An explicit ``tol=`` replaces this with "error against the reference
<= tol"; when the float64 run is impossible (an op without float64 support in the reference), each tensor's dtype
sets the tolerance (``TOLERANCES``) and the report says so.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import warnings

import torch
from torch import nn

from .. import torch_compat
from .result import FLOOR_ULPS, K, VariantResult
from .rounds import train_step
from .variants import StepFn, Variant, VariantFailed, flat_tensors, map_tensors

# Largest accepted max relative error against the reference per dtype, where no float64 run is possible.
TOLERANCES = {torch.float64: 1e-7, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}
_OTHER_FLOAT_TOL = 1e-1  # float8 and friends
Observed = dict[str, "torch.Tensor | None"]


class ComparisonError(RuntimeError):
    """A variant's outputs, loss or gradients are further from the truth than the reference's allow."""


@dataclasses.dataclass
class Truth:
    """The reference's float64 observation (None when it could not run, with the reason)."""

    seen: Observed | None
    why_not: str | None = None


def float64_copy(model: nn.Module) -> nn.Module:
    """An eager float64 copy of ``model`` (of the module under ``torch.compile``'s wrapper, if compiled)."""
    return copy.deepcopy(torch_compat.original_module(model)).double()


def check_agreement(runs: list[Variant], step_fn: StepFn, seed: int, tol: float | None, mode, truth_model) -> None:
    """One step without the optimizer per variant on its copy of the first batch, same seed; each variant's outputs,
    loss and gradients against the float64 truth (or, with ``tol``, against the first variant's)."""
    reference, ref_run, truth = None, None, Truth(None, "tol= given") if tol is not None else None
    for run in runs:
        if run.ok and truth is None:  # before the reference's own step, which may change its batch in place
            truth = _truth(truth_model, step_fn, run.data[0], seed)
        seen = _observe(run, step_fn, run.data[0], seed) if run.ok else None
        if seen is None:
            continue
        if reference is None:
            reference, ref_run = seen, run
            _own_error(run.result, seen, truth)
        else:
            run.result.check_against = ref_run.name
            _grade(run.result, reference, seen, truth, tol)
    bad = [r.result for r in runs if r.result.check_ok is False]
    if not bad:
        return
    message = f"variants disagree with {ref_run.name!r}:\n" + "\n".join(f"  {r.name}: {r.check_detail}" for r in bad)
    if mode == "warn":
        warnings.warn(message, RuntimeWarning, stacklevel=3)
    else:
        raise ComparisonError(message)


def _truth(model: nn.Module | None, step_fn: StepFn, batch, seed: int) -> Truth:
    """The reference's step in float64, or why it could not run."""
    if model is None:
        return Truth(None, "the reference failed")
    truth = Variant("float64", model)
    seen = _observe(truth, step_fn, map_tensors(batch, _to_float64), seed)
    if seen is None:
        return Truth(None, f"the float64 run failed ({truth.result.error})")
    return Truth(seen)


def _to_float64(t: torch.Tensor) -> torch.Tensor:
    """A float64 copy of a floating tensor (a copy of any other): the float64 run never touches the variants' data."""
    return t.to(torch.float64, copy=True) if t.is_floating_point() else t.clone()


def _observe(run: Variant, step_fn: StepFn, batch, seed: int) -> Observed | None:
    """Forward outputs, loss and gradients of one step, in a stable order (None if the variant failed)."""
    outputs = []
    hook = run.model.register_forward_hook(lambda module, args, out: outputs.append(out))
    devices = [torch.cuda.current_device()] if torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            loss = train_step(run, batch, step_fn, update=False)
    except VariantFailed as failed:
        run.fail(failed.__cause__)
        return None
    finally:
        hook.remove()
    seen: Observed = {}
    for i, out in enumerate(outputs):
        seen.update((label, t.detach().clone()) for label, t in flat_tensors(out, f"output#{i}"))
    seen["loss"] = loss.detach().clone()
    for name, param in torch_compat.original_module(run.model).named_parameters():
        seen[f"grad of {name}"] = None if param.grad is None else param.grad.detach().clone()
    run.model.zero_grad(set_to_none=True)
    return seen


def _grade(result: VariantResult, ref: Observed, got: Observed, truth: Truth, tol: float | None) -> None:
    """Fill ``result``'s check fields from every tensor's error and limit: the first tensor beyond its limit, else
    the one that came closest to it."""
    basis = "tol" if tol is not None else "float64" if truth.seen is not None else "dtype"
    graded = []  # (label, error, the reference's error, limit)
    for label in [*ref, *(k for k in got if k not in ref)]:
        a, b = ref.get(label), got.get(label)
        if a is None and b is None:
            continue
        if a is None or b is None or a.shape != b.shape:
            graded.append((label, math.inf, None, 0.0))
        elif basis == "float64":
            exact = truth.seen.get(label)
            if exact is not None and exact.shape == b.shape:  # else an output the float64 run does not have
                ref_err = _max_rel_err(exact, a)
                floor = FLOOR_ULPS * torch.finfo(b.dtype).eps if b.is_floating_point() else 0.0
                graded.append((label, _max_rel_err(exact, b), ref_err, K * ref_err + floor))
        else:
            limit = tol if tol is not None else max(_tolerance(a.dtype), _tolerance(b.dtype))
            graded.append((label, _max_rel_err(a, b), None, limit))
    failed = [g for g in graded if g[1] > g[3]]
    label, err, ref_err, limit = (
        failed[0] if failed else max(graded, key=lambda g: g[1] / g[3] if g[3] else 0.0, default=("", 0.0, None, 0.0))
    )
    result.check_basis, result.check_note = basis, truth.why_not if basis == "dtype" else None
    result.check_label, result.check_max_rel_err, result.check_ref_err, result.check_tol = label, err, ref_err, limit
    result.check_worst = label if failed else None


def _own_error(result: VariantResult, seen: Observed, truth: Truth) -> None:
    """The reference's own largest error against float64 (0 when no float64 run was made)."""
    errors = [
        (label, _max_rel_err(exact, seen[label]))
        for label, exact in (truth.seen or {}).items()
        if exact is not None and seen.get(label) is not None and seen[label].shape == exact.shape
    ]
    result.check_basis = "float64" if truth.seen is not None else None
    result.check_label, result.check_max_rel_err = max(errors, key=lambda e: e[1], default=("", 0.0))


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
