"""Custom layers with CUDA and C++ CPU kernels, importable as ``kprof_callbacks.kernels``.

Each op is a kernel pair (``<op>.cu`` for CUDA, ``<op>.cpp`` for the CPU and the torch binding),
an autograd.Function, a functional form and an ``nn.Module`` with ``from_module``. Nothing is
compiled at import: each extension is built (or loaded from the cache) at its first call.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._build import KernelBuildError, load, load_inline

_EXPORTS = {
    "square": "square", "Square": "square",
    "add": "add", "Add": "add",
    "gelu": "gelu", "GELU": "gelu", "bias_gelu": "gelu", "BiasGELU": "gelu", "LinearGELU": "gelu",
    "layer_norm": "layernorm", "LayerNorm": "layernorm",
    "rms_norm": "rmsnorm", "RMSNorm": "rmsnorm",
}

__all__ = ["KernelBuildError", "load", "load_inline", *_EXPORTS]


def __getattr__(name: str) -> Any:
    """Import an op's module on first use, so ``import kprof_callbacks.kernels`` stays cheap."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f".{_EXPORTS[name]}", __name__)
    # The import bound the submodule under its own name (add, square, gelu): the functions win.
    globals().update({n: getattr(module, n) for n, m in _EXPORTS.items() if m == _EXPORTS[name]})
    return globals()[name]


def __dir__() -> list[str]:
    return sorted(__all__)
