"""What the elementwise layers share: choosing an implementation, checking inputs, the profiler label."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable
from typing import TypeVar

import torch

IMPLS = ("cuda", "cpp", "torch")
Layer = TypeVar("Layer", bound="KernelLayer")
CUDA_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CPU_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    """``value`` if it is one of ``choices``, else a ValueError naming the argument."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def check_impl(impl: str | None) -> str | None:
    """``impl`` is None (pick by device) or one of IMPLS."""
    if impl is not None and impl not in IMPLS:
        raise ValueError(f"impl must be None or one of {IMPLS}, got {impl!r}")
    return impl


def resolve_impl(impl: str | None, x: torch.Tensor, op: str) -> str:
    """The implementation that runs for ``x``: CUDA kernels for CUDA tensors, C++ kernels for CPU ones."""
    if impl is None:
        return "cuda" if x.is_cuda else "cpp"
    if impl == "cuda" and not x.is_cuda:
        raise ValueError(f"{op}: impl='cuda' needs CUDA tensors, got one on {x.device}")
    if impl == "cpp" and x.device.type != "cpu":
        raise ValueError(f"{op}: impl='cpp' needs CPU tensors, got one on {x.device}")
    return impl


def check_tensor(x: object, name: str, op: str) -> torch.Tensor:
    """A floating tensor the kernels support, made contiguous (a copy when it is a strided view)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(x).__name__}")
    supported = CUDA_DTYPES if x.is_cuda else CPU_DTYPES if x.device.type == "cpu" else ()
    if x.dtype not in supported:
        raise TypeError(
            f"{op}: {name} is {x.dtype} on {x.device}; supported: float32/float16/bfloat16 on CUDA, "
            "float32/float64/float16/bfloat16 on the CPU"
        )
    return x.contiguous()


def check_like(ref: torch.Tensor, x: object, name: str, op: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """``x`` checked as ``ref``'s partner: same dtype and device, and ``shape`` (default: ref's shape)."""
    x = check_tensor(x, name, op)
    if x.dtype != ref.dtype or x.device != ref.device:
        raise TypeError(f"{op}: {name} is {x.dtype} on {x.device}, expected {ref.dtype} on {ref.device}")
    expected = tuple(ref.shape) if shape is None else shape
    if tuple(x.shape) != expected:
        raise ValueError(f"{op}: {name} has shape {tuple(x.shape)}, expected {expected}")
    return x


def label(name: str) -> contextlib.AbstractContextManager:
    """``record_function("kprof::<name>")`` while a profiler runs; a no-op context otherwise."""
    if torch._C._autograd._profiler_enabled():  # record_function costs microseconds even when idle
        return torch.profiler.record_function(f"kprof::{name}")
    return contextlib.nullcontext()


class KernelLayer(torch.nn.Module):
    """Base of the elementwise layers: ``impl`` (None, "cuda", "cpp" or "torch") and ``build()``."""

    _load: Callable[[], types.ModuleType]  # the subclass's extension loader

    def __init__(self, impl: str | None = None) -> None:
        super().__init__()
        self.impl = check_impl(impl)

    def build(self: Layer) -> Layer:
        """Build (or load from the cache) the extension now rather than at the first forward, so a compiler
        problem shows up here; a no-op when the "torch" reference is chosen."""
        if self.impl != "torch":
            type(self)._load()
        return self

    def impl_repr(self) -> str:
        return f"impl={self.impl or 'auto'}"
