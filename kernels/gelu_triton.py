"""Triton twins of GELU and the fused bias + GELU: ``torch.ops.kprof.triton_gelu``, ``triton_gelu_backward``,
``triton_bias_gelu`` and ``triton_bias_gelu_backward``, with the schemas of the C++ operators (gelu.cpp).

Math in float32 whatever the dtype. The tanh form is computed as x * sigmoid(2u), which equals
0.5 * x * (1 + tanh(u)) without the cancellation in 1 + tanh(u) for x << 0. The bias gradient is a column sum of dx
finished in two stages (per-program partial sums, then their sum): no atomics, so it is reproducible.
"""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from . import _triton_op as T

BIAS_COLS = 1024  # widest column block of the bias backward


@triton.jit
def _gelu(v, TANH: tl.constexpr):
    # constants as literals: Triton reads no plain module globals, and the interpreter mishandles constexpr ones
    if TANH:
        y = v * tl.sigmoid(1.5957691216057308 * (v + 0.044715 * v * v * v))  # 2 * sqrt(2 / pi)
    else:
        y = 0.5 * v * (1.0 + tl.math.erf(v * 0.7071067811865476))  # 1 / sqrt(2)
    return y


@triton.jit
def _gelu_grad(v, TANH: tl.constexpr):
    if TANH:
        s = tl.sigmoid(1.5957691216057308 * (v + 0.044715 * v * v * v))
        d = s + 1.5957691216057308 * v * s * (1.0 - s) * (1.0 + 0.134145 * v * v)  # 3 * 0.044715
    else:
        d = 0.5 * (1.0 + tl.math.erf(v * 0.7071067811865476)) + 0.3989422804014327 * v * tl.exp(-0.5 * v * v)
    return d


@triton.jit
def _forward(x_ptr, bias_ptr, y_ptr, n, cols, HAS_BIAS: tl.constexpr, TANH: tl.constexpr, BLOCK: tl.constexpr):
    # y = gelu(x (+ bias, over rows of `cols` elements)), BLOCK elements per program
    start = tl.program_id(0).to(tl.int64) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        col = ((start % cols).to(tl.int32) + tl.arange(0, BLOCK)) % cols
        v += tl.load(bias_ptr + col, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, _gelu(v, TANH).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _backward(dy_ptr, x_ptr, dx_ptr, n, TANH: tl.constexpr, BLOCK: tl.constexpr):
    # dx = dy * gelu'(x)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(dx_ptr + offs, (dy * _gelu_grad(v, TANH)).to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bias_backward(
    dy_ptr,
    x_ptr,
    bias_ptr,
    dx_ptr,
    partial_ptr,
    rows,
    cols,
    tiles,
    TANH: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    # dx = dy * gelu'(x + bias); program (p, j) takes column block j of row tiles p, p + P, ... and writes
    # partial[p, columns] = its float32 sum of dx over those rows
    pid = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = c < cols
    b = tl.load(bias_ptr + c, mask=cmask, other=0.0).to(tl.float32)
    acc = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    for t in range(pid, tiles, tl.num_programs(0)):
        r = (t * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)  # rows < 2**31: t * BLOCK_R fits
        mask = (r < rows)[:, None] & cmask[None, :]
        offs = r[:, None] * cols + c[None, :]
        dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        v = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32) + b[None, :]
        dx = dy * _gelu_grad(v, TANH)
        tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        acc += dx
    tl.store(partial_ptr + pid * cols + c, tl.sum(acc, axis=0), mask=cmask)


def _tanh_form(approximate: str, op: str) -> bool:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"{op}: approximate must be 'none' or 'tanh', got '{approximate}'")
    return approximate == "tanh"


def _checked_bias(x: torch.Tensor, bias: torch.Tensor, op: str) -> torch.Tensor:
    if x.dim() < 1:
        raise ValueError(f"{op}: x must have at least one dimension")
    return T.checked_like(x, bias, op, "bias", [x.shape[-1]])


@T.operator
def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    tanh = _tanh_form(approximate, "kprof triton_gelu")
    x = T.checked(x, "kprof triton_gelu", "x")
    y = torch.empty_like(x)
    T.elementwise(_forward, x.numel(), x, x, y, x.numel(), 1, HAS_BIAS=False, TANH=tanh)
    return y


@T.operator
def gelu_backward(grad: torch.Tensor, x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    tanh = _tanh_form(approximate, "kprof triton_gelu")
    x = T.checked(x, "kprof triton_gelu", "x")
    grad = T.checked_like(x, grad, "kprof triton_gelu", "grad")
    dx = torch.empty_like(x)
    T.elementwise(_backward, x.numel(), grad, x, dx, x.numel(), TANH=tanh)
    return dx


@T.operator
def bias_gelu(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    op = "kprof triton_bias_gelu"
    tanh = _tanh_form(approximate, op)
    x = T.checked(x, op, "x")
    bias = _checked_bias(x, bias, op)
    y = torch.empty_like(x)
    T.elementwise(_forward, x.numel(), x, bias, y, x.numel(), bias.numel(), HAS_BIAS=True, TANH=tanh)
    return y


@T.operator
def bias_gelu_backward(
    grad: torch.Tensor, x: torch.Tensor, bias: torch.Tensor, approximate: str = "none"
) -> tuple[torch.Tensor, torch.Tensor]:
    op = "kprof triton_bias_gelu"
    tanh = _tanh_form(approximate, op)
    x = T.checked(x, op, "x")
    bias = _checked_bias(x, bias, op)
    grad = T.checked_like(x, grad, op, "grad")
    cols = bias.numel()
    rows = x.numel() // cols if cols else 0
    block_r, block_c = T.tile(cols, BIAS_COLS)
    col_blocks = T.cdiv(cols, block_c)
    tiles = T.cdiv(rows, block_r)
    programs = T.programs(x, tiles, col_blocks)
    dx = torch.empty_like(x)
    partial = torch.empty(programs, cols, dtype=torch.float32, device=x.device)
    T.launch(
        _bias_backward,
        (programs, col_blocks),
        grad,
        x,
        bias,
        dx,
        partial,
        rows,
        cols,
        tiles,
        TANH=tanh,
        BLOCK_R=block_r,
        BLOCK_C=block_c,
        num_warps=T.warps(block_r * block_c),
    )
    return dx, partial.sum(0).to(bias.dtype)


def _setup(ctx, inputs: tuple, output: torch.Tensor) -> None:
    """Both forwards save their tensors (x, and bias) and the form."""
    ctx.save_for_backward(*inputs[:-1])
    ctx.approximate = inputs[-1]


def _gelu_grads(ctx, grad: torch.Tensor) -> tuple:
    (x,) = ctx.saved_tensors
    if T.records(grad, x):
        return *T.twin(lambda v: F.gelu(v, approximate=ctx.approximate), [x], grad), None
    return torch.ops.kprof.triton_gelu_backward(grad, x, ctx.approximate), None


def _bias_gelu_grads(ctx, grad: torch.Tensor) -> tuple:
    x, bias = ctx.saved_tensors
    if T.records(grad, x, bias):
        return *T.twin(lambda v, b: F.gelu(v + b, approximate=ctx.approximate), [x, bias], grad), None
    return *torch.ops.kprof.triton_bias_gelu_backward(grad, x, bias, ctx.approximate), None


gelu.register_autograd(_gelu_grads, setup_context=_setup)
bias_gelu.register_autograd(_bias_gelu_grads, setup_context=_setup)
T.autocast_like(gelu, "aten::gelu")
T.autocast_like(bias_gelu, "aten::gelu")
