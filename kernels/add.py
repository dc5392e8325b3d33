"""``kernels.add``: out = a + b from the seed's add.cu as the operator ``torch.ops.kprof.add``, built from files with
ninja (``_build.load``)."""

from __future__ import annotations

import torch

from . import _build
from ._layer import KernelLayer, Kernels, use_reference
from ._library import OpLibrary

LIBRARY = OpLibrary("add", lambda: _build.load("add", ["add.cpp", "add.cu"]), ops=("add",))
KERNELS = Kernels(LIBRARY)  # no Triton twin


@LIBRARY.fake("add")
def _add_fake(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.new_empty(a.shape)


def add(a: torch.Tensor, b: torch.Tensor, *, impl: str | None = None) -> torch.Tensor:
    """a + b for tensors of one shape, dtype and device (no broadcasting); strided inputs are read through a
    contiguous copy. ``impl``: None (by device), "cuda", "cpp" or "torch"."""
    if use_reference(impl):
        return torch.add(a, b)
    return KERNELS.pick(impl, a, "kprof add").add(a, b)


class Add(KernelLayer):
    """``add`` as a module, so one model can run it with each implementation."""

    kernels = KERNELS

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return add(a, b, impl=self.impl)

    def extra_repr(self) -> str:
        return self.impl_repr()
