"""``kernels.GELU`` (erf or tanh form) and the fused bias + GELU epilogue (``BiasGELU``, ``LinearGELU``), on the
operators ``torch.ops.kprof.gelu`` and ``torch.ops.kprof.bias_gelu`` (and their backwards)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import _build, _triton
from ._layer import KernelLayer, Kernels, check_choice, check_impl, use_reference
from ._library import OpLibrary

APPROXIMATIONS = ("none", "tanh")

LIBRARY = OpLibrary(
    "gelu",
    lambda: _build.load("gelu", ["gelu.cpp", "gelu.cu"]),
    ops=("gelu", "gelu_backward", "bias_gelu", "bias_gelu_backward"),
)
KERNELS = Kernels(LIBRARY, _triton.library("gelu", "gelu_triton", LIBRARY.ops))


@LIBRARY.fake("gelu")
def _gelu_fake(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return x.new_empty(x.shape)


@LIBRARY.fake("gelu_backward")
def _gelu_backward_fake(grad: torch.Tensor, x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return x.new_empty(x.shape)


@LIBRARY.fake("bias_gelu")
def _bias_gelu_fake(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return x.new_empty(x.shape)


@LIBRARY.fake("bias_gelu_backward")
def _bias_gelu_backward_fake(
    grad: torch.Tensor, x: torch.Tensor, bias: torch.Tensor, approximate: str = "none"
) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape), bias.new_empty(bias.shape)


def gelu(x: torch.Tensor, approximate: str = "none", *, impl: str | None = None) -> torch.Tensor:
    """``F.gelu`` with kprof kernels; a strided ``x`` is read through a contiguous copy. ``impl``: None (by device),
    "cuda", "cpp", "triton" or "torch"."""
    if use_reference(impl):
        return F.gelu(x, approximate=approximate)
    return KERNELS.pick(impl, x, "kprof gelu").gelu(x, approximate)


def bias_gelu(
    x: torch.Tensor, bias: torch.Tensor, approximate: str = "none", *, impl: str | None = None
) -> torch.Tensor:
    """``F.gelu(x + bias)`` fused, ``bias`` (x's dtype) broadcast over the last dimension of ``x``."""
    if use_reference(impl):
        return F.gelu(x + bias, approximate=approximate)
    return KERNELS.pick(impl, x, "kprof bias_gelu").bias_gelu(x, bias, approximate)


def _check_approximate(approximate: str) -> str:
    return check_choice("approximate", approximate, APPROXIMATIONS)


class GELU(KernelLayer):
    """Drop-in for ``nn.GELU`` running kprof kernels (``impl`` as in ``gelu``)."""

    kernels = KERNELS

    def __init__(self, approximate: str = "none", *, impl: str | None = None) -> None:
        super().__init__(impl)
        self.approximate = _check_approximate(approximate)

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

    kernels = KERNELS

    def __init__(
        self,
        features: int,
        approximate: str = "none",
        *,
        impl: str | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(impl)
        self.approximate = _check_approximate(approximate)
        self.bias = nn.Parameter(torch.zeros(features, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # under autocast x may be bf16/fp16 while the parameter stays float32; the cast is differentiable
        return bias_gelu(x, self.bias.to(x.dtype), self.approximate, impl=self.impl)

    def extra_repr(self) -> str:
        return f"features={self.bias.numel()}, approximate={self.approximate!r}, {self.impl_repr()}"


class LinearGELU(nn.Linear, KernelLayer):
    """``nn.Linear`` followed by ``nn.GELU``: the matmul runs without its bias, then one fused
    bias + GELU kernel. Same parameters and state_dict keys (weight, bias) as the ``nn.Linear``."""

    kernels = KERNELS

    def __init__(
        self,
        in_features: int,
        out_features: int,
        approximate: str = "none",
        *,
        impl: str | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(in_features, out_features, bias=True, device=device, dtype=dtype)
        self.approximate = _check_approximate(approximate)
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
        h = F.linear(x, self.weight)
        # under autocast h is bf16/fp16 while the bias stays float32, as nn.Linear's bias is cast
        return bias_gelu(h, self.bias.to(h.dtype), self.approximate, impl=self.impl)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, approximate={self.approximate!r}, {self.impl_repr()}"
