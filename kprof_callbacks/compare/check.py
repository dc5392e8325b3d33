"""The numerical check of ``compare``: every variant's outputs, loss and gradients against the reference's."""

from __future__ import annotations

import math
import warnings

import torch

from .result import VariantResult
from .steps import train_step
from .variants import StepFn, Variant, VariantFailed, flat_tensors

# Largest accepted max relative error (max |a - b| / max |ref|) per dtype; the looser of the two tensors' applies.
TOLERANCES = {torch.float64: 1e-7, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}
_OTHER_FLOAT_TOL = 1e-1  # float8 and friends


class ComparisonError(RuntimeError):
    """A variant's outputs, loss or gradients differ from the reference by more than the tolerance."""


def check_agreement(runs: list[Variant], step_fn: StepFn, seed: int, tol: float | None, mode) -> None:
    """One step without the optimizer per variant on its copy of the first batch, same seed; compare outputs, loss
    and gradients to the first variant's."""
    reference, ref_name = None, None
    for run in runs:
        seen = _observe(run, step_fn, run.data[0], seed) if run.ok else None
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


def _observe(run: Variant, step_fn: StepFn, batch, seed: int) -> dict[str, torch.Tensor | None] | None:
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
    seen: dict[str, torch.Tensor | None] = {}
    for i, out in enumerate(outputs):
        seen.update((label, t.detach().clone()) for label, t in flat_tensors(out, f"output#{i}"))
    seen["loss"] = loss.detach().clone()
    for name, param in run.model.named_parameters():
        seen[f"grad of {name}"] = None if param.grad is None else param.grad.detach().clone()
    run.model.zero_grad(set_to_none=True)
    return seen


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
