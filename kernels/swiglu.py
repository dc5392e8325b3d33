"""``kernels.SwiGLU``: the gated activation ``silu(gate) * up`` of LLaMA-style MLPs as one fused pass forward and
one backward (eager PyTorch makes two and three), on the operators ``torch.ops.kprof.swiglu`` and
``swiglu_backward``; plus ``SwiGLUMLP``, the whole MLP ``w_down(silu(w_gate(x)) * w_up(x))`` using it. Dtypes:
float32/float16/bfloat16 on CUDA, and also float64 on the CPU; gate and up share shape, dtype and device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import _build, _triton
from ._layer import KernelLayer, Kernels, check_impl, check_supported, use_reference
from ._library import OpLibrary

LIBRARY = OpLibrary(
    "swiglu", lambda: _build.load("swiglu", ["swiglu.cpp", "swiglu.cu"]), ops=("swiglu", "swiglu_backward")
)
KERNELS = Kernels(LIBRARY, _triton.library("swiglu", "swiglu_triton", LIBRARY.ops))


@LIBRARY.fake("swiglu")
def _swiglu_fake(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return gate.new_empty(gate.shape)


@LIBRARY.fake("swiglu_backward")
def _swiglu_backward_fake(
    grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return gate.new_empty(gate.shape), gate.new_empty(gate.shape)


def swiglu(gate: torch.Tensor, up: torch.Tensor, *, impl: str | None = None) -> torch.Tensor:
    """``silu(gate) * up`` for tensors of one shape, dtype and device (no broadcasting); strided inputs are read
    through contiguous copies. ``impl``: None (by device), "cuda", "cpp", "triton" or "torch"."""
    if use_reference(impl):
        return F.silu(gate) * up
    return KERNELS.pick(impl, gate, "kprof swiglu").swiglu(gate, up)


class SwiGLU(KernelLayer):
    """``swiglu`` as a module taking (gate, up), so one model can run it with each implementation."""

    kernels = KERNELS

    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return swiglu(gate, up, impl=self.impl)

    def extra_repr(self) -> str:
        return self.impl_repr()


class SwiGLUMLP(nn.Module):
    """``w_down(silu(w_gate(x)) * w_up(x))`` with the activation fused; three ``nn.Linear`` attributes
    ``w_gate``, ``w_up`` (hidden -> intermediate) and ``w_down`` (intermediate -> hidden), so its
    state_dict keys are ``w_gate.weight``, ``w_up.weight``, ``w_down.weight`` (and ``.bias`` if any)."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        bias: bool = False,
        *,
        impl: str | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.w_gate = nn.Linear(hidden_size, intermediate_size, bias, device=device, dtype=dtype)
        self.w_up = nn.Linear(hidden_size, intermediate_size, bias, device=device, dtype=dtype)
        self.w_down = nn.Linear(intermediate_size, hidden_size, bias, device=device, dtype=dtype)
        self.act = SwiGLU(impl)

    @property
    def impl(self) -> str | None:
        return self.act.impl

    @impl.setter
    def impl(self, value: str | None) -> None:
        self.act.impl = check_impl(value)

    @classmethod
    def from_module(cls, module: nn.Module, *, impl: str | None = None) -> SwiGLUMLP:
        """A SwiGLUMLP sharing ``module``'s three Linear layers (not copies).

        Contract: ``module`` has ``nn.Linear`` attributes ``w_gate`` and ``w_up`` (hidden -> intermediate)
        and ``w_down`` (intermediate -> hidden), and its forward computes
        ``w_down(silu(w_gate(x)) * w_up(x))``. The attributes and shapes are checked; the forward is trusted.
        """
        name = f"{cls.__name__}.from_module"
        layers = {key: getattr(module, key, None) for key in ("w_gate", "w_up", "w_down")}
        missing = [key for key, layer in layers.items() if not isinstance(layer, nn.Linear)]
        if missing:
            raise TypeError(
                f"{name}: {type(module).__name__} has no nn.Linear attribute(s) {missing} (needs w_gate, w_up, w_down)"
            )
        gate, up, down = layers.values()
        if not (
            gate.in_features == up.in_features == down.out_features
            and gate.out_features == up.out_features == down.in_features
        ):
            raise ValueError(f"{name}: layer shapes do not chain: w_gate {gate}, w_up {up}, w_down {down}")
        if impl != "torch":
            check_supported(gate.weight, "w_gate.weight", name, impl)
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.w_gate, new.w_up, new.w_down = gate, up, down
        new.act = SwiGLU(impl)
        new.train(module.training)
        return new

    def build(self) -> SwiGLUMLP:
        """Build (or load) the activation's operators now (see ``KernelLayer.build``)."""
        self.act.build()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(self.act(self.w_gate(x), self.w_up(x)))
