"""``kernels.add``: out = a + b from the seed's add.cu, built from files with ninja (``_build.load``)."""

from __future__ import annotations

import functools
import types

import torch
from . import _build
from ._layer import KernelLayer, check_impl, check_like, check_tensor, label, resolve_impl


@functools.cache
def _ext() -> types.ModuleType:
    return _build.load("add", ["add.cpp", "add.cu"])


class AddFunction(torch.autograd.Function):
    """a + b with the kprof kernel; the gradient passes through unchanged to both inputs."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(a)
        _ext().forward(a, b, out)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return grad, grad


def add(a: torch.Tensor, b: torch.Tensor, *, impl: str | None = None) -> torch.Tensor:
    """a + b for tensors of one shape, dtype and device (no broadcasting). Strided inputs are copied
    to contiguous memory first. ``impl``: None (by device), "cuda", "cpp" or "torch"."""
    a = check_tensor(a, "a", "kprof add")
    b = check_like(a, b, "b", "kprof add")
    impl = resolve_impl(check_impl(impl), a, "kprof add")
    with label("add"):
        return torch.add(a, b) if impl == "torch" else AddFunction.apply(a, b)


class Add(KernelLayer):
    """``add`` as a module, so one model can run it with each implementation."""

    _load = staticmethod(_ext)

    def __init__(self, *, impl: str | None = None) -> None:
        super().__init__(impl)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return add(a, b, impl=self.impl)

    def extra_repr(self) -> str:
        return self.impl_repr()
