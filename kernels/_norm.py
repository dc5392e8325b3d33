"""What the row-norm layers (LayerNorm, RMSNorm) share: ``normalized_shape`` as the operators take it, and the
module base that owns weight (and bias) and builds its operators when constructed. The per-call checks (shapes,
the parameter dtype rule, eps, the CUDA row limit) are the operators' own."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch
from torch import nn

from ._layer import KernelLayer, check_supported

# Longest row the CUDA kernels take: kMaxCols in _reduce.cuh (each thread holds 16 elements, 512 threads).
CUDA_MAX_COLS = 8192
# Longest row the Triton kernels take: a row is one tile (Liger-Kernel's MAX_FUSED_SIZE).
TRITON_MAX_COLS = 65536


def as_shape(normalized_shape: int | Sequence[int], op: str) -> tuple[int, ...]:
    """``normalized_shape`` as a tuple of positive ints (an int means one trailing dimension), checked once."""
    shape = (normalized_shape,) if isinstance(normalized_shape, numbers.Integral) else tuple(normalized_shape)
    if not shape or not all(isinstance(d, numbers.Integral) and d >= 1 for d in shape):
        raise ValueError(
            f"{op}: normalized_shape must be a positive int or a non-empty sequence of them, got {normalized_shape!r}"
        )
    return tuple(int(d) for d in shape)


def stats_dtype(x: torch.Tensor) -> torch.dtype:
    """Per-row statistics (and CPU accumulation) are float64 for float64 inputs, float32 otherwise."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def stats_like(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """An empty per-row statistic (mean or rstd) of a norm of x over weight's shape: the fake kernels' output."""
    return x.new_empty(x.numel() // weight.numel(), dtype=stats_dtype(x))


def shape_arg(normalized_shape: int | Sequence[int]) -> Sequence[int]:
    """``normalized_shape`` as the operators' ``SymInt[]`` argument (they check it)."""
    return (normalized_shape,) if isinstance(normalized_shape, int) else normalized_shape


class RowNorm(KernelLayer):
    """Base of the norm modules: ``weight`` (and ``bias``) over ``normalized_shape``, initialised as torch's
    (ones and zeros), and ``impl``: None picks "cuda" or "cpp" by the input's device; "torch" runs the
    PyTorch reference, so one module can be compared against itself. The constructor builds (or loads)
    the operators, so a compiler problem shows up there rather than at the first forward."""

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float | None,
        *,
        bias: bool,
        impl: str | None,
        device: torch.device | str | None,
        dtype: torch.dtype | None,
    ) -> None:
        super().__init__(impl)
        name = type(self).__name__
        self.normalized_shape = as_shape(normalized_shape, name)
        if eps is not None and (not isinstance(eps, numbers.Real) or not eps >= 0):
            raise ValueError(f"{name}: eps must be a number >= 0 or None, got {eps!r}")
        self.eps = eps
        self.elementwise_affine = True
        self.weight = nn.Parameter(torch.ones(self.normalized_shape, device=device, dtype=dtype))
        if bias:
            self.bias = nn.Parameter(torch.zeros(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.build()

    @classmethod
    def _check_source(cls, module: nn.Module, source: type[nn.Module], impl: str | None) -> None:
        """from_module's checks: the right type, with a weight, on a device and dtype (and of a length) the kernels of
        ``impl`` take."""
        name = f"{cls.__name__}.from_module"
        if not isinstance(module, source):
            raise TypeError(f"{name}: expected torch.nn.{source.__name__}, got {type(module).__name__}")
        if not module.elementwise_affine:
            raise ValueError(f"{name}: elementwise_affine=False is not supported (the kernels always apply a weight)")
        check_supported(module.weight, "weight", name, impl)
        limit, kernels = (TRITON_MAX_COLS, "Triton") if impl == "triton" else (CUDA_MAX_COLS, "CUDA")
        if (module.weight.is_cuda or impl == "triton") and math.prod(module.normalized_shape) > limit:
            raise ValueError(
                f"{name}: normalized_shape {tuple(module.normalized_shape)} is longer than the "
                f"{limit} elements the {kernels} kernels take"
            )

    def _adopt(self, module: nn.Module) -> None:
        """Take `module`'s parameters (shared, not copied) and training mode."""
        self.weight = module.weight
        self.bias = getattr(module, "bias", None)
        self.train(module.training)

    def impl_repr(self) -> str:
        """``impl=<choice>``; when automatic, the one the parameters' device picks."""
        if self.impl is not None:
            return f"impl={self.impl}"
        return f"impl={'cuda' if self.weight.is_cuda else 'cpp'} (auto)"
