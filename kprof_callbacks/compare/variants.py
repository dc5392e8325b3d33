"""The variants while ``compare`` runs: argument checks, building them, their batches, weights and optimizers."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from .. import layout, stats, torch_compat
from ..checks import check_int
from .result import ERROR, VariantResult

StepFn = Callable[[nn.Module, Any], torch.Tensor]
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


class Variant:
    """Run-time state of one variant while ``compare`` runs."""

    def __init__(self, name: str, model: nn.Module | None) -> None:
        self.name = name
        self.model = model
        self.optimizer: torch.optim.Optimizer | None = None
        self.result = VariantResult(name)
        self.rounds: list[list[float]] = []  # seconds per timed step, one list per round
        self.peak_bytes = 0
        self.data: list = []  # this variant's own copy of the batches: a step_fn may change a batch in place

    @property
    def ok(self) -> bool:
        return self.result.status == "ok"

    def fail(self, exc: BaseException) -> None:
        self.result.status = self.result.verdict = ERROR
        self.result.error = f"{type(exc).__name__}: {exc}"
        self.rounds.clear()


class VariantFailed(Exception):
    """The variant's own code raised (kernel build error, shape bug, ...): report it, keep the others going."""


def check_options(step_fn, steps, warmup, block, seed, check, tol, confidence, noise_threshold, optimizer) -> None:
    if not callable(step_fn):
        raise TypeError(f"step_fn must be callable as step_fn(model, batch) -> loss, got {type(step_fn).__name__}")
    for name, value, low in (("steps", steps, 3), ("warmup", warmup, 0), ("block", block, 1), ("seed", seed, 0)):
        check_int(name, value, low)
    if not (check is True or check is False or check == "warn"):
        raise ValueError(f"check must be True, False or 'warn', got {check!r}")
    if tol is not None and (isinstance(tol, bool) or not isinstance(tol, (int, float)) or not tol > 0):
        raise ValueError(f"tol must be a number > 0 or None, got {tol!r}")
    stats.check_confidence(confidence)
    stats.check_noise_threshold(noise_threshold)
    if optimizer is not None and not callable(optimizer):
        raise TypeError(f"optimizer must be a factory taking parameters (or None), got {type(optimizer).__name__}")


def build_variants(variants) -> list[Variant]:
    """Check names and values, then call the factories; a factory that raises marks its variant as failed."""
    if not isinstance(variants, Mapping):
        raise TypeError(f"variants must be a dict of name -> nn.Module, got {type(variants).__name__}")
    if not variants:
        raise ValueError("variants is empty: pass at least one, e.g. {'torch': model, 'kernels': kprof.swap(model)}")
    for name, value in variants.items():
        if not isinstance(name, str):
            raise ValueError(f"variant names must be strings usable as folder names, got {name!r}")
        layout.check_name("variant name", name)
        if not callable(value):
            raise TypeError(f"variants[{name!r}] must be an nn.Module or a factory of one, got {type(value).__name__}")
    runs = []
    for name, value in variants.items():
        run = Variant(name, value if isinstance(value, nn.Module) else None)
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


def take_batches(batches, needed: int) -> list:
    """The batches as a list (an iterator is read once, ``needed`` items at most); reused by every variant."""
    if isinstance(batches, torch.Tensor) or not isinstance(batches, Iterable):
        raise TypeError(
            f"batches must be an iterable of batches (a list, a DataLoader, a generator), got {type(batches).__name__}"
        )
    data = list(batches) if isinstance(batches, (list, tuple)) else list(itertools.islice(batches, needed))
    if not data:
        raise ValueError("batches is empty: compare needs at least one batch")
    return data


def cycle(data: list, start: int, count: int) -> Iterator:
    return (data[(start + i) % len(data)] for i in range(count))


def device_of(runs: list[Variant], first_batch) -> torch.device:
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
    return next((t.device for _, t in flat_tensors(first_batch, "batch")), torch.device("cpu"))


def load_same_weights(runs: list[Variant]) -> None:
    """Copy the first variant's state_dict into the others; a name or shape mismatch is a ValueError."""
    healthy = [r for r in runs if r.ok]
    if not healthy:
        return
    ref = healthy[0]
    source = torch_compat.original_module(ref.model)
    state = source.state_dict()
    for run in healthy[1:]:
        target = torch_compat.original_module(run.model)
        if target is source:
            continue
        mismatch = _first_mismatch(state, target.state_dict(), ref.name, run.name)
        if mismatch:
            raise ValueError(f"variants {ref.name!r} and {run.name!r} cannot share weights: {mismatch}")
        target.load_state_dict(state)


def _first_mismatch(ref: Mapping, other: Mapping, ref_name: str, other_name: str) -> str | None:
    for key, value in ref.items():
        if key not in other:
            return f"{key!r} is in {ref_name!r} but missing from {other_name!r}"
        if value.shape != other[key].shape:
            shapes = f"{tuple(value.shape)} in {ref_name!r} but {tuple(other[key].shape)} in {other_name!r}"
            return f"{key!r} has shape {shapes}"
    extra = next((key for key in other if key not in ref), None)
    return None if extra is None else f"{extra!r} is in {other_name!r} but not in {ref_name!r}"


def make_optimizer(factory: OptimizerFactory | None, run: Variant) -> torch.optim.Optimizer | None:
    if factory is None or not run.ok:
        return None
    opt = factory(run.model.parameters())
    if not isinstance(opt, torch.optim.Optimizer):
        raise TypeError(f"optimizer factory must return a torch.optim.Optimizer, got {type(opt).__name__}")
    return opt


def flat_tensors(obj, label: str) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors inside nested tuples, lists and dicts, each with a readable path."""
    if isinstance(obj, torch.Tensor):
        yield label, obj
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            yield from flat_tensors(value, f"{label}[{key!r}]")
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from flat_tensors(value, f"{label}[{i}]")


def map_tensors(obj, fn):
    """``obj`` with every tensor inside nested tuples, lists and dicts replaced by ``fn(tensor)``."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, Mapping):
        return type(obj)((key, map_tensors(value, fn)) for key, value in obj.items())
    if isinstance(obj, (list, tuple)):
        items = [map_tensors(value, fn) for value in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    return obj
