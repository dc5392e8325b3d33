"""Custom layers with CUDA and C++ CPU kernels, and Triton twins, importable as ``kprof_callbacks.kernels``.

Each op is a registered PyTorch operator, ``torch.ops.kprof.<op>`` (``<op>.cu`` holds the CUDA kernels, ``<op>.cpp``
the CPU kernels, autograd, autocast and the registration), with a functional form and an ``nn.Module`` with
``from_module``. Nothing is compiled at import: each extension is built (or loaded from the cache) when a layer
is constructed or a functional form first runs. ``linear_cross_entropy`` fuses an output layer with its loss
(``LinearCrossEntropy``), never holding the [tokens, vocab] logits. GELU, bias + GELU, LayerNorm, RMSNorm and
SwiGLU also have Triton kernels (``<op>_triton.py``, operators ``torch.ops.kprof.triton_<op>``), chosen with
``impl="triton"`` and loaded (with triton, an optional extra) the same way.

The functions ``square``, ``add``, ``gelu`` and ``linear_cross_entropy`` share their names with the modules defining
them; the functions win here, and ``importlib.import_module("kprof_callbacks.kernels.gelu")`` reaches a module.
"""

from __future__ import annotations

from .._lazy import lazy_names
from ._build import KernelBuildError, load, load_inline
from ._layer import IMPLS, check_impl
from .add import Add, add
from .gelu import GELU, BiasGELU, LinearGELU, bias_gelu, gelu
from .linear_cross_entropy import LinearCrossEntropy, linear_cross_entropy
from .square import Square, square
from .swiglu import SwiGLU, SwiGLUMLP, swiglu

# Layers from modules that import on first use (name -> module in this package).
_LAZY = {
    "layer_norm": "layernorm",
    "LayerNorm": "layernorm",
    "rms_norm": "rmsnorm",
    "RMSNorm": "rmsnorm",
}

__all__ = [
    "IMPLS",
    "KernelBuildError",
    "check_impl",
    "load",
    "load_inline",
    "Add",
    "add",
    "GELU",
    "BiasGELU",
    "LinearGELU",
    "bias_gelu",
    "gelu",
    "LinearCrossEntropy",
    "linear_cross_entropy",
    "Square",
    "square",
    "SwiGLU",
    "SwiGLUMLP",
    "swiglu",
    *_LAZY,
]


__getattr__, __dir__ = lazy_names(__name__, {name: f".{module}" for name, module in _LAZY.items()})
