"""What every kprof layer shares: the ``impl`` choice, the check that runs before a kernel call, and the module base.

Argument checks live in the operators (TORCH_CHECK in C++, before any launch); what stays in Python per call is the
``impl`` branch, for an explicit "cuda"/"cpp" a device check, and ``OpLibrary.ensure()`` (which Dynamo folds away).
"""

from __future__ import annotations

import torch

from ._library import OpLibrary

IMPLS = ("cuda", "cpp", "torch")  # "triton" joins with the Triton kernels
KERNEL_DEVICES = {"cuda": "cuda", "cpp": "cpu"}  # impl -> the device whose tensors it takes
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


def check_kernel_impl(impl: str, x: torch.Tensor, op: str) -> None:
    """An explicit kernel ``impl`` ("cuda" or "cpp") is known and matches x's device; ValueError otherwise (the
    functional forms handle "torch" before, and skip this for None: the device picks)."""
    device = KERNEL_DEVICES[check_impl(impl)]
    if not isinstance(x, torch.Tensor) or x.device.type != device:
        where = x.device if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{op}: impl={impl!r} needs {device.upper()} tensors, got one on {where}")


def check_supported(t: torch.Tensor, name: str, op: str) -> None:
    """A TypeError unless the kernels take t's dtype on t's device (for checks made once, at construction)."""
    supported = CUDA_DTYPES if t.is_cuda else CPU_DTYPES if t.device.type == "cpu" else ()
    if t.dtype not in supported:
        raise TypeError(f"{op}: {name} is {t.dtype} on {t.device}; supported: float32/float16/bfloat16 on CUDA, "
                        "float32/float64/float16/bfloat16 on the CPU")


class KernelLayer(torch.nn.Module):
    """Base of the layers: ``impl`` (None, "cuda", "cpp" or "torch"), the operator library, and ``build()``."""

    library: OpLibrary  # the subclass's operators

    def __init__(self, impl: str | None = None) -> None:
        super().__init__()
        self.impl = check_impl(impl)

    def build(self) -> KernelLayer:
        """Build (or load from the cache) the operators now rather than at the first forward, so a compiler problem
        shows up here; a no-op when the "torch" reference is chosen."""
        if self.impl != "torch":
            self.library.load()
        return self

    def impl_repr(self) -> str:
        return f"impl={self.impl or 'auto'}"
