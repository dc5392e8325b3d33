"""``kernels.RMSNorm``: ``torch.nn.RMSNorm`` (y = x * rsqrt(mean(x^2) + eps) * weight over the trailing
``normalized_shape`` dims) with CUDA and C++ kernels.

Forward saves per-row rstd; backward gives dx and dweight (per-block partials and a column sum, no
atomics). eps=None means what torch uses: the machine epsilon of the accumulation type (float32 for
float16/bfloat16/float32 x, float64 for float64 x). Dtypes and limits as in ``kernels.LayerNorm``.
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
    return _build.load("rmsnorm", ["rmsnorm.cpp", "rmsnorm.cu"])


class RMSNormFunction(torch.autograd.Function):
    """RMSNorm of x over weight's shape (the trailing dims of x), with the kprof kernels."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        rows = x.reshape(-1, weight.numel())
        w = weight.reshape(-1)
        y = torch.empty_like(rows)
        rstd = rows.new_empty(rows.shape[0], dtype=stats_dtype(x))
        _ext().forward(rows, w, float(eps), y, rstd)
        ctx.save_for_backward(rows, w, rstd)
        ctx.shapes = (x.shape, weight.shape)
        return y.view(x.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        rows, w, rstd = ctx.saved_tensors
        x_shape, w_shape = ctx.shapes
        dx = torch.empty_like(rows)
        dw = torch.empty_like(w)
        _ext().backward(dy.reshape(rows.shape).contiguous(), rows, w, rstd, dx, dw)
        return dx.view(x_shape), dw.view(w_shape), None


def rms_norm(
    x: torch.Tensor,
    normalized_shape: int | Sequence[int],
    weight: torch.Tensor,
    eps: float | None = None,
    *,
    impl: str | None = None,
) -> torch.Tensor:
    """``torch.nn.functional.rms_norm`` with the kprof kernels (a weight is required). Strided inputs are
    copied to contiguous memory first. ``impl``: None (by device), "cuda", "cpp" or "torch"."""
    shape = as_shape(normalized_shape, "kprof rms_norm")
    x, impl = check_args("kprof rms_norm", x, shape, {"weight": weight}, 0.0 if eps is None else eps, impl)
    with label("rms_norm"):
        if impl == "torch":
            return F.rms_norm(x, shape, weight, eps)
        if eps is None:
            eps = torch.finfo(stats_dtype(x)).eps
        return RMSNormFunction.apply(x, weight.contiguous(), eps)


class RMSNorm(RowNorm):
    """Drop-in for ``torch.nn.RMSNorm`` (same arguments, parameters and state_dict keys) with
    ``elementwise_affine=True``; ``impl`` as in ``rms_norm``."""

    _load = staticmethod(_ext)

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float | None = None,
        elementwise_affine: bool = True,
        *,
        impl: str | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        if not elementwise_affine:
            raise ValueError("RMSNorm: elementwise_affine=False is not supported (the kernels always apply a "
                             "weight); use torch.nn.RMSNorm")
        super().__init__(normalized_shape, eps, bias=False, impl=impl, device=device, dtype=dtype)

    @classmethod
    def from_module(cls, module: nn.RMSNorm, *, impl: str | None = None) -> RMSNorm:
        """An RMSNorm computing what ``module`` computes, sharing its weight (not a copy)."""
        cls._check_source(module, nn.RMSNorm)
        new = cls(module.normalized_shape, module.eps, impl=impl, device="meta", dtype=module.weight.dtype)
        new._adopt(module)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.normalized_shape, self.weight, self.eps, impl=self.impl)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine=True, {self.impl_repr()}"
