"""``kernels.LayerNorm``: LayerNorm over the trailing ``normalized_shape`` dims with CUDA and C++ kernels.

The operator ``torch.ops.kprof.layer_norm`` saves per-row mean and rstd (``layer_norm_fwd``); its backward
(``layer_norm_backward``) gives dx, dweight and dbias, the parameter gradients as per-block partial sums finished
by a column sum (no atomics, so results are reproducible). Supported:
x float32/float16/bfloat16 on CUDA (rows of at most 8192 elements) and also float64 on the CPU; weight
and bias in x's dtype or float32 for float16/bfloat16 x; output in x's dtype. ``elementwise_affine=False``
is not supported (keep torch.nn.LayerNorm there).
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
    "layernorm",
    lambda: _build.load("layernorm", ["layernorm.cpp", "layernorm.cu"]),
    ops=("layer_norm", "layer_norm_fwd", "layer_norm_backward"),
)
KERNELS = Kernels(LIBRARY, _triton.library("layernorm", "norm_triton", LIBRARY.ops))


@LIBRARY.fake("layer_norm_fwd")
def _layer_norm_fwd_fake(
    x: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor, bias: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape), stats_like(x, weight), stats_like(x, weight)


@LIBRARY.fake("layer_norm_backward")
def _layer_norm_backward_fake(
    grad: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    eps: float,
    bias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape), weight.new_empty(weight.shape), weight.new_empty(weight.shape if bias else (0,))


def layer_norm(
    x: torch.Tensor,
    normalized_shape: int | Sequence[int],
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    impl: str | None = None,
) -> torch.Tensor:
    """``torch.nn.functional.layer_norm`` with the kprof kernels (a weight is required); strided inputs are read
    through contiguous copies. ``impl``: None (by device), "cuda", "cpp", "triton" or "torch"."""
    if use_reference(impl):
        return F.layer_norm(x, shape_arg(normalized_shape), weight, bias, eps)
    return KERNELS.pick(impl, x, "kprof layer_norm").layer_norm(x, shape_arg(normalized_shape), weight, bias, eps)


class LayerNorm(RowNorm):
    """Drop-in for ``torch.nn.LayerNorm`` (same arguments, parameters and state_dict keys) with
    ``elementwise_affine=True``; ``impl`` as in ``layer_norm``."""

    kernels = KERNELS

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
            raise ValueError(
                "LayerNorm: elementwise_affine=False is not supported (the kernels always apply a "
                "weight); use torch.nn.LayerNorm"
            )
        super().__init__(normalized_shape, eps, bias=bias, impl=impl, device=device, dtype=dtype)

    @classmethod
    def from_module(cls, module: nn.LayerNorm, *, impl: str | None = None) -> LayerNorm:
        """A LayerNorm computing what ``module`` computes, sharing its weight and bias (not copies)."""
        cls._check_source(module, nn.LayerNorm, impl)
        new = cls(
            module.normalized_shape,
            module.eps,
            bias=module.bias is not None,
            impl=impl,
            device="meta",
            dtype=module.weight.dtype,
        )
        new._adopt(module)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps, impl=self.impl)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine=True, bias={self.bias is not None}, "
            f"{self.impl_repr()}"
        )
