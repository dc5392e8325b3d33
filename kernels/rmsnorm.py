"""``kernels.RMSNorm``: ``torch.nn.RMSNorm`` (y = x * rsqrt(mean(x^2) + eps) * weight over the trailing
``normalized_shape`` dims) with CUDA and C++ kernels.

The operator ``torch.ops.kprof.rms_norm`` saves per-row rstd (``rms_norm_fwd``); its backward
(``rms_norm_backward``) gives dx and dweight (per-block partials and a column sum, no atomics). eps=None means
what torch uses: the machine epsilon of the accumulation type (float32 for float16/bfloat16/float32 x, float64 for
float64 x). Dtypes and limits as in ``kernels.LayerNorm``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from . import _build, _triton
from ._layer import Kernels, use_reference
from ._library import OpLibrary
from ._norm import RowNorm, shape_arg, stats_like

LIBRARY = OpLibrary(
    "rmsnorm",
    lambda: _build.load("rmsnorm", ["rmsnorm.cpp", "rmsnorm.cu"]),
    ops=("rms_norm", "rms_norm_fwd", "rms_norm_backward"),
)
KERNELS = Kernels(LIBRARY, _triton.library("rmsnorm", "norm_triton", LIBRARY.ops))


@LIBRARY.fake("rms_norm_fwd")
def _rms_norm_fwd_fake(
    x: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor, eps: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape), stats_like(x, weight)


@LIBRARY.fake("rms_norm_backward")
def _rms_norm_backward_fake(
    grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape), weight.new_empty(weight.shape)


def rms_norm(
    x: torch.Tensor,
    normalized_shape: int | Sequence[int],
    weight: torch.Tensor,
    eps: float | None = None,
    *,
    impl: str | None = None,
) -> torch.Tensor:
    """``torch.nn.functional.rms_norm`` with the kprof kernels (a weight is required); strided inputs are read
    through contiguous copies. ``impl``: None (by device), "cuda", "cpp", "triton" or "torch"."""
    if use_reference(impl):
        return F.rms_norm(x, shape_arg(normalized_shape), weight, eps)
    return KERNELS.pick(impl, x, "kprof rms_norm").rms_norm(x, shape_arg(normalized_shape), weight, eps)


class RMSNorm(RowNorm):
    """Drop-in for ``torch.nn.RMSNorm`` (same arguments, parameters and state_dict keys) with
    ``elementwise_affine=True``; ``impl`` as in ``rms_norm``."""

    kernels = KERNELS

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
            raise ValueError(
                "RMSNorm: elementwise_affine=False is not supported (the kernels always apply a "
                "weight); use torch.nn.RMSNorm"
            )
        super().__init__(normalized_shape, eps, bias=False, impl=impl, device=device, dtype=dtype)

    @classmethod
    def from_module(cls, module: nn.RMSNorm, *, impl: str | None = None) -> RMSNorm:
        """An RMSNorm computing what ``module`` computes, sharing its weight (not a copy)."""
        cls._check_source(module, nn.RMSNorm, impl)
        new = cls(module.normalized_shape, module.eps, impl=impl, device="meta", dtype=module.weight.dtype)
        new._adopt(module)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.normalized_shape, self.weight, self.eps, impl=self.impl)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine=True, {self.impl_repr()}"
