"""The ops ``kprof bench`` times: each kprof layer's kernel beside its PyTorch reference (and Liger-Kernel's, where it
has one), the inputs each takes, the sizes per family of ops, and the bytes each must move at least."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .. import kernels

Inputs = list[torch.Tensor]


@dataclasses.dataclass(frozen=True)
class Op:
    """One layer to time: its kernel call (taking ``impl=``), the PyTorch reference, and how to make inputs of a
    size."""

    name: str
    kernel: Callable[..., torch.Tensor]
    reference: Callable[..., torch.Tensor]
    make: Callable[[tuple[int, ...], torch.dtype, str], Inputs]
    memory_bound: bool = True  # False: a matmul dominates, so GB/s and % of copy mean nothing
    triton: bool = False  # has a Triton twin (impl="triton")
    liger: str | None = None  # the liger_kernel.transformers.functional function doing the same, if any

    def impls(self, triton: bool) -> tuple[str | None, ...]:
        """The kernel impls to run: the C++/CUDA one (None: by device), and "triton" when asked and there is one."""
        return (None, "triton") if triton and self.triton else (None,)


def _inputs(full: int, rows: int = 0) -> Callable[[tuple[int, ...], torch.dtype, str], Inputs]:
    """Inputs of ``full`` tensors of the size's shape, then ``rows`` of its last dimension (a bias, a norm's weight)."""

    def make(shape: tuple[int, ...], dtype: torch.dtype, device: str) -> Inputs:
        sizes = [shape] * full + [shape[-1:]] * rows
        return [torch.randn(size, dtype=dtype, device=device) for size in sizes]

    return make


_one, _two, _with_bias, _weight_bias = _inputs(1), _inputs(2), _inputs(1, 1), _inputs(1, 2)


def _linear(shape, dtype, device):
    rows, k, n = shape
    return [
        torch.randn(rows, k, dtype=dtype, device=device),
        torch.randn(n, k, dtype=dtype, device=device) / k**0.5,
        torch.randn(n, dtype=dtype, device=device),
    ]


OPS = [
    Op("square", kernels.square, torch.square, _one),
    Op("square-grid2d", lambda x, impl=None: kernels.square(x, variant="grid2d", impl=impl), torch.square, _one),
    Op("add", kernels.add, torch.add, _two),
    Op("gelu", kernels.gelu, F.gelu, _one, triton=True),
    Op(
        "gelu-tanh",
        lambda x, impl=None: kernels.gelu(x, "tanh", impl=impl),
        lambda x: F.gelu(x, approximate="tanh"),
        _one,
        triton=True,
    ),
    Op("bias_gelu", kernels.bias_gelu, lambda x, b: F.gelu(x + b), _with_bias, triton=True),
    Op(
        "bias_gelu-tanh",
        lambda x, b, impl=None: kernels.bias_gelu(x, b, "tanh", impl=impl),
        lambda x, b: F.gelu(x + b, approximate="tanh"),
        _with_bias,
        triton=True,
    ),
    Op(
        "linear_gelu",
        lambda x, w, b, impl=None: kernels.bias_gelu(F.linear(x, w), b, impl=impl),
        lambda x, w, b: F.gelu(F.linear(x, w, b)),
        _linear,
        memory_bound=False,
        triton=True,
    ),
    Op(
        "layer_norm",
        lambda x, w, b, impl=None: kernels.layer_norm(x, x.shape[-1], w, b, impl=impl),
        lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b),
        _weight_bias,
        triton=True,
        liger="liger_layer_norm",
    ),
    Op(
        "rms_norm",
        lambda x, w, impl=None: kernels.rms_norm(x, x.shape[-1], w, impl=impl),
        lambda x, w: F.rms_norm(x, x.shape[-1:], w),
        _with_bias,
        triton=True,
        liger="liger_rms_norm",
    ),
    Op("swiglu", kernels.swiglu, lambda g, u: F.silu(g) * u, _two, triton=True, liger="liger_swiglu"),
]
# The eps of kprof's and torch's norms, given to Liger's (which has no default); Liger's own defaults otherwise
# (RMSNorm: "llama" casting, gradient written in place of the incoming one, as in the models it patches).
LIGER_ARGS = {"liger_layer_norm": (1e-5,), "liger_rms_norm": (torch.finfo(torch.float32).eps,)}


def liger(op: Op, device: str) -> Callable[..., torch.Tensor] | None:
    """Liger-Kernel's function for ``op`` when it has one and can run here (installed, CUDA), else None."""
    if op.liger is None or device != "cuda" or liger_version() is None:
        return None
    from liger_kernel.transformers import functional

    fn, extra = getattr(functional, op.liger), LIGER_ARGS.get(op.liger, ())
    return lambda *inputs: fn(*inputs, *extra)


def liger_version() -> str | None:
    try:
        return importlib.metadata.version("liger-kernel")
    except importlib.metadata.PackageNotFoundError:
        return None


# (dtype, shape) per op family; [rows, cols] for the elementwise ops (grid2d's 2-D view), all > L2.
FULL_SIZES = {
    "elementwise": [(torch.float32, (4096, 4096)), (torch.float32, (16384, 16384)), (torch.bfloat16, (16384, 16384))],
    "bias": [(torch.float32, (8192, 4096)), (torch.float32, (32768, 8192)), (torch.bfloat16, (32768, 8192))],
    "linear": [(torch.bfloat16, (16384, 4096, 4096))],
    "norm": [
        (torch.float32, (16384, 1024)),
        (torch.float32, (16384, 4096)),
        (torch.bfloat16, (16384, 1024)),
        (torch.bfloat16, (16384, 4096)),
    ],
}
# The layers' shapes inside GPT-2 small (hidden 768) and medium (1024) at 4096 and 16384 tokens a step: rows of
# hidden (norms), rows of 4 x hidden (GELU after c_fc), and c_fc itself for Linear + GELU; fp32 norms are the residual
# stream under bf16 autocast (torch's autocast runs layer_norm in float32).
GPT_SIZES = {
    "elementwise": [(torch.bfloat16, (rows, 4 * h)) for h in (768, 1024) for rows in (4096, 16384)],
    "bias": [(torch.bfloat16, (rows, 4 * h)) for h in (768, 1024) for rows in (4096, 16384)],
    "linear": [(torch.bfloat16, (rows, h, 4 * h)) for h in (768, 1024) for rows in (4096, 16384)],
    "norm": [
        (dtype, (rows, h)) for dtype in (torch.float32, torch.bfloat16) for h in (768, 1024) for rows in (4096, 16384)
    ],
}
SHAPES = {"full": FULL_SIZES, "gpt": GPT_SIZES}
QUICK_SIZES = {
    "elementwise": [(torch.float32, (256, 1000))],
    "bias": [(torch.float32, (256, 1000))],
    "linear": [(torch.float32, (256, 128, 256))],
    "norm": [(torch.float32, (256, 1000))],
}


def largest(sizes: dict) -> dict:
    """Per family, the largest shape of each dtype."""
    out = {}
    for fam, entries in sizes.items():
        best: dict[torch.dtype, tuple] = {}
        for dtype, shape in entries:
            if dtype not in best or math.prod(shape) > math.prod(best[dtype]):
                best[dtype] = shape
        out[fam] = list(best.items())
    return out


def family(op: Op) -> str:
    if op.name.endswith("_norm"):
        return "norm"
    return "linear" if op.name.startswith("linear") else "bias" if op.name.startswith("bias") else "elementwise"


def min_bytes(op: Op, inputs: Inputs, backward: bool) -> int:
    """Bytes the op must move: inputs read and outputs written once; the backward reads grad and the saved
    input(s) and writes one gradient per differentiable input (add's gradients are the incoming grad itself)."""
    size = [t.numel() * t.element_size() for t in inputs]
    out = size[0]
    forward = sum(size) + out
    if not backward:
        return forward
    if op.name == "add":
        return forward
    return forward + out + sum(size) + sum(size)  # grad in, saved inputs re-read, input gradients out
