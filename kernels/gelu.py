"""``kernels.GELU`` (erf or tanh form) and the fused bias + GELU epilogue (``BiasGELU``, ``LinearGELU``)."""

from __future__ import annotations

import functools
import types

import torch
import torch.nn.functional as F
from torch import nn

from . import _build
from ._layer import KernelLayer, check_choice, check_impl, check_like, check_tensor, label, resolve_impl

APPROXIMATIONS = ("none", "tanh")


@functools.cache
def _ext() -> types.ModuleType:
    return _build.load("gelu", ["gelu.cpp", "gelu.cu"])


def _check_approximate(approximate: str) -> bool:
    """True for the tanh form; ValueError for anything but nn.GELU's two choices."""
    return check_choice("approximate", approximate, APPROXIMATIONS) == "tanh"


class GELUFunction(torch.autograd.Function):
    """gelu(x) with kprof's forward and backward kernels; saves x for the backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, tanh_approx: bool) -> torch.Tensor:
        ctx.tanh_approx = tanh_approx
        ctx.save_for_backward(x)
        y = torch.empty_like(x)
        _ext().forward(x, y, tanh_approx)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (x,) = ctx.saved_tensors
        grad_x = torch.empty_like(x)
        _ext().backward(grad.contiguous(), x, grad_x, ctx.tanh_approx)
        return grad_x, None


class BiasGELUFunction(torch.autograd.Function):
    """gelu(x + bias) in one pass; the backward writes grad x and the bias gradient in one pass too."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, bias: torch.Tensor, tanh_approx: bool) -> torch.Tensor:
        ctx.tanh_approx = tanh_approx
        ctx.save_for_backward(x, bias)
        y = torch.empty_like(x)
        _ext().bias_forward(x, bias, y, tanh_approx)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, bias = ctx.saved_tensors
        grad_x = torch.empty_like(x)
        grad_bias = _ext().bias_backward(grad.contiguous(), x, bias, grad_x, ctx.tanh_approx)
        return grad_x, grad_bias, None


def gelu(x: torch.Tensor, approximate: str = "none", *, impl: str | None = None) -> torch.Tensor:
    """``F.gelu`` with kprof kernels. A strided ``x`` is copied to contiguous memory first.
    ``impl``: None (by device), "cuda", "cpp" or "torch"."""
    tanh_approx = _check_approximate(approximate)
    x = check_tensor(x, "x", "kprof gelu")
    impl = resolve_impl(check_impl(impl), x, "kprof gelu")
    with label("gelu"):
        return F.gelu(x, approximate=approximate) if impl == "torch" else GELUFunction.apply(x, tanh_approx)


def bias_gelu(
    x: torch.Tensor, bias: torch.Tensor, approximate: str = "none", *, impl: str | None = None
) -> torch.Tensor:
    """``F.gelu(x + bias)`` fused, ``bias`` broadcast over the last dimension of ``x``."""
    tanh_approx = _check_approximate(approximate)
    x = check_tensor(x, "x", "kprof bias_gelu")
    if x.dim() == 0:
        raise ValueError("kprof bias_gelu: x must have at least one dimension")
    bias = check_like(x, bias, "bias", "kprof bias_gelu", shape=(x.shape[-1],))
    impl = resolve_impl(check_impl(impl), x, "kprof bias_gelu")
    with label("bias_gelu"):
        if impl == "torch":
            return F.gelu(x + bias, approximate=approximate)
        return BiasGELUFunction.apply(x, bias, tanh_approx)


class GELU(KernelLayer):
    """Drop-in for ``nn.GELU`` running kprof kernels (``impl`` as in ``gelu``)."""

    _load = staticmethod(_ext)

    def __init__(self, approximate: str = "none", *, impl: str | None = None) -> None:
        super().__init__(impl)
        _check_approximate(approximate)
        self.approximate = approximate

    @classmethod
    def from_module(cls, module: nn.GELU, *, impl: str | None = None) -> GELU:
        if not isinstance(module, nn.GELU):
            raise TypeError(f"module must be nn.GELU, got {type(module).__name__}")
        return cls(module.approximate, impl=impl)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu(x, self.approximate, impl=self.impl)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}, {self.impl_repr()}"


class BiasGELU(KernelLayer):
    """gelu(x + bias) fused, the epilogue of a bias-free matmul; ``bias`` has ``features`` entries."""

    _load = staticmethod(_ext)

    def __init__(self, features: int, approximate: str = "none", *, impl: str | None = None,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__(impl)
        _check_approximate(approximate)
        self.approximate = approximate
        self.bias = nn.Parameter(torch.zeros(features, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # under autocast x may be bf16/fp16 while the parameter stays float32; the cast is differentiable
        return bias_gelu(x, self.bias.to(x.dtype), self.approximate, impl=self.impl)

    def extra_repr(self) -> str:
        return f"features={self.bias.numel()}, approximate={self.approximate!r}, {self.impl_repr()}"


class LinearGELU(nn.Linear, KernelLayer):
    """``nn.Linear`` followed by ``nn.GELU``: the matmul runs without its bias, then one fused
    bias + GELU kernel. Same parameters and state_dict keys (weight, bias) as the ``nn.Linear``."""

    _load = staticmethod(_ext)

    def __init__(self, in_features: int, out_features: int, approximate: str = "none", *, impl: str | None = None,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__(in_features, out_features, bias=True, device=device, dtype=dtype)
        _check_approximate(approximate)
        self.approximate = approximate
        self.impl = check_impl(impl)

    @classmethod
    def from_module(cls, linear: nn.Linear, gelu: nn.GELU, *, impl: str | None = None) -> LinearGELU:
        """Shares ``linear``'s parameters (no copy), so training either trains both."""
        if not isinstance(linear, nn.Linear) or linear.bias is None:
            raise TypeError("linear must be an nn.Linear with a bias")
        if not isinstance(gelu, nn.GELU):
            raise TypeError(f"gelu must be nn.GELU, got {type(gelu).__name__}")
        fused = cls(linear.in_features, linear.out_features, gelu.approximate, impl=impl, device="meta")
        fused.weight, fused.bias = linear.weight, linear.bias
        return fused.train(linear.training)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with label("linear_gelu"):
            h = F.linear(x, self.weight)
            # under autocast h is bf16/fp16 while the bias stays float32; the cast is differentiable
            return bias_gelu(h, self.bias.to(h.dtype), self.approximate, impl=self.impl)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, approximate={self.approximate!r}, {self.impl_repr()}"
