"""``kernels.LayerNorm``: LayerNorm over the trailing ``normalized_shape`` dims with CUDA and C++ kernels.

Forward saves per-row mean and rstd; backward gives dx, dweight and dbias, the parameter gradients as
per-block partial sums finished by a column sum (no atomics, so results are reproducible). Supported:
x float32/float16/bfloat16 on CUDA (rows of at most 8192 elements) and also float64 on the CPU; weight
and bias in x's dtype or float32 for float16/bfloat16 x; output in x's dtype. ``elementwise_affine=False``
is not supported (keep torch.nn.LayerNorm there).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from . import _build
from ._layer import label
from ._norm import RowNorm, as_shape, check_args, stats_dtype


@functools.cache
def _ext() -> types.ModuleType:
    return _build.load("layernorm", ["layernorm.cpp", "layernorm.cu"])


class LayerNormFunction(torch.autograd.Function):
    """LayerNorm of x over weight's shape (the trailing dims of x), with the kprof kernels."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
        rows = x.reshape(-1, weight.numel())
        w = weight.reshape(-1)
        b = bias.reshape(-1) if bias is not None else None
        y = torch.empty_like(rows)
        mean = rows.new_empty(rows.shape[0], dtype=stats_dtype(x))
        rstd = torch.empty_like(mean)
        _ext().forward(rows, w, b, float(eps), y, mean, rstd)
        ctx.save_for_backward(rows, w, mean, rstd)
        ctx.has_bias = bias is not None
        ctx.shapes = (x.shape, weight.shape)
        return y.view(x.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, None]:
        rows, w, mean, rstd = ctx.saved_tensors
        x_shape, w_shape = ctx.shapes
        dx = torch.empty_like(rows)
        dw = torch.empty_like(w)
        db = torch.empty_like(w) if ctx.has_bias else None
        _ext().backward(dy.reshape(rows.shape).contiguous(), rows, w, mean, rstd, dx, dw, db)
        return dx.view(x_shape), dw.view(w_shape), db.view(w_shape) if db is not None else None, None


def layer_norm(
    x: torch.Tensor,
    normalized_shape: int | Sequence[int],
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    impl: str | None = None,
) -> torch.Tensor:
    """``torch.nn.functional.layer_norm`` with the kprof kernels (a weight is required). Strided inputs are
    copied to contiguous memory first. ``impl``: None (by device), "cuda", "cpp" or "torch"."""
    shape = as_shape(normalized_shape, "kprof layer_norm")
    x, impl = check_args("kprof layer_norm", x, shape, {"weight": weight, "bias": bias}, eps, impl)
    with label("layer_norm"):
        if impl == "torch":
            return F.layer_norm(x, shape, weight, bias, eps)
        return LayerNormFunction.apply(x, weight.contiguous(), bias.contiguous() if bias is not None else None, eps)


class LayerNorm(RowNorm):
    """Drop-in for ``torch.nn.LayerNorm`` (same arguments, parameters and state_dict keys) with
    ``elementwise_affine=True``; ``impl`` as in ``layer_norm``."""

    _load = staticmethod(_ext)

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        *,
        impl: str | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        if not elementwise_affine:
            raise ValueError("LayerNorm: elementwise_affine=False is not supported (the kernels always apply a "
                             "weight); use torch.nn.LayerNorm")
        super().__init__(normalized_shape, eps, bias=bias, impl=impl, device=device, dtype=dtype)

    @classmethod
    def from_module(cls, module: nn.LayerNorm, *, impl: str | None = None) -> LayerNorm:
        """A LayerNorm computing what ``module`` computes, sharing its weight and bias (not copies)."""
        cls._check_source(module, nn.LayerNorm)
        new = cls(module.normalized_shape, module.eps, bias=module.bias is not None, impl=impl, device="meta",
                  dtype=module.weight.dtype)
        new._adopt(module)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps, impl=self.impl)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, elementwise_affine=True, bias={self.bias is not None}, "
                f"{self.impl_repr()}")
