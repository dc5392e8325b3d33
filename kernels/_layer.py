"""What every kprof layer shares: the ``impl`` choice (``Kernels.pick``, the one place a layer's operators are chosen),
the check that runs before a kernel call, and the module base.

Argument checks live in the operators (TORCH_CHECK in C++, Python checks in the Triton twins, before any launch); what
stays in Python per call is the ``impl`` branch, for an explicit "cuda"/"cpp" a device check, and
``OpLibrary.ensure()`` (which Dynamo folds away).
"""

from __future__ import annotations

import dataclasses

import torch

from ._library import OpLibrary

IMPLS = ("cuda", "cpp", "triton", "torch")
KERNEL_DEVICES = {"cuda": "cuda", "cpp": "cpu"}  # impl -> the device whose tensors it takes (Triton checks its own)
CUDA_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CPU_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    """``value`` if it is one of ``choices``, else a ValueError naming the argument."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def check_impl(impl: str | None) -> str | None:
    """``impl`` is None (pick by device) or one of IMPLS."""
    if impl is not None and impl not in IMPLS:
        raise ValueError(f"impl must be None or one of {IMPLS}, got {impl!r}")
    return impl


def use_reference(impl: str | None) -> bool:
    """True where a functional form runs its PyTorch reference instead of a kernel: ``impl="torch"``, or no impl chosen
    while torch.compile traces it. Inductor fuses the reference's math with its neighbours, which an opaque operator
    call stops, so a compiled model with automatic layers is never slower than torch's own; an explicit "cuda", "cpp"
    or "triton" keeps the kernel in the compiled graph. Dynamo folds the check to a constant."""
    return impl == "torch" or (impl is None and torch.compiler.is_compiling())


def check_supported(t: torch.Tensor, name: str, op: str, impl: str | None = None) -> None:
    """A TypeError unless ``impl``'s kernels take t's dtype on t's device (for checks made once, at construction)."""
    supported = CUDA_DTYPES if t.is_cuda or impl == "triton" else CPU_DTYPES if t.device.type == "cpu" else ()
    if t.dtype not in supported:
        raise TypeError(
            f"{op}: {name} is {t.dtype} on {t.device}; supported: float32/float16/bfloat16 on CUDA and "
            "by the Triton kernels, float32/float64/float16/bfloat16 on the CPU"
        )


@dataclasses.dataclass(frozen=True)
class Kernels:
    """A layer's operator libraries: the C++/CUDA extension (impl None, "cuda" or "cpp") and its Triton twin
    (impl "triton"; None where there is none). ``pick`` is where every functional form chooses by ``impl``."""

    native: OpLibrary
    triton: OpLibrary | None = None

    def library(self, impl: str | None) -> OpLibrary:
        """The library that runs ``impl`` (a kernel impl or None); ValueError for "triton" without a twin."""
        if impl != "triton":
            return self.native
        if self.triton is None:
            raise ValueError(
                f"impl='triton': kprof {self.native.name} has no Triton kernels (GELU, bias + GELU, "
                "LayerNorm, RMSNorm and SwiGLU have)"
            )
        return self.triton

    def pick(self, impl: str | None, x: torch.Tensor, op: str) -> OpLibrary:
        """The loaded library for ``impl`` (not "torch": the functional forms call their PyTorch reference first),
        after checking it: an unknown impl, or "cuda"/"cpp" with x on the other device, is a ValueError."""
        if impl is None:  # the common case first: every call of a layer goes through here
            self.native.ensure()
            return self.native
        if impl in KERNEL_DEVICES:
            device = KERNEL_DEVICES[impl]
            if not isinstance(x, torch.Tensor) or x.device.type != device:
                where = x.device if isinstance(x, torch.Tensor) else type(x).__name__
                raise ValueError(f"{op}: impl={impl!r} needs {device.upper()} tensors, got one on {where}")
        else:
            check_impl(impl)
        library = self.library(impl)
        library.ensure()
        return library


class KernelLayer(torch.nn.Module):
    """Base of the layers: ``impl`` (None, "cuda", "cpp", "triton" or "torch"), the operators, and ``build()``."""

    kernels: Kernels  # the subclass's operators

    def __init__(self, impl: str | None = None) -> None:
        super().__init__()
        self.impl = check_impl(impl)

    def build(self) -> KernelLayer:
        """Build (or load from the cache) the operators now rather than at the first forward, so a compiler problem (or
        Triton missing) shows up here; a no-op when the "torch" reference is chosen."""
        if self.impl != "torch":
            self.kernels.library(self.impl).load()
        return self

    def impl_repr(self) -> str:
        return f"impl={self.impl or 'auto'}"
