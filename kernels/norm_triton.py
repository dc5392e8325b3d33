"""Triton twins of LayerNorm and RMSNorm, with the schemas of layernorm.cpp and rmsnorm.cpp:
``torch.ops.kprof.triton_layer_norm_fwd`` (y, mean, rstd), ``triton_layer_norm_backward`` (dx, dweight, dbias),
``triton_rms_norm_fwd`` (y, rstd), ``triton_rms_norm_backward`` (dx, dweight), and the public ``triton_layer_norm`` /
``triton_rms_norm`` (y only), which call the forwards; the forwards carry the autograd.

One forward and one backward kernel serve both norms (RMSNorm is LayerNorm without centering and bias). A program
holds a tile of whole rows (rows of at most 65536 elements) and computes in float32: the forward one tile, the
backward a persistent loop over tiles that also sums dy * xhat (and dy) over its rows; the parameter gradients are
the sum of those per-program partials (two stages, no atomics: reproducible), as Liger-Kernel does.
"""

from collections.abc import Sequence

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from . import _triton_op as T

LAYER_NORM = "kprof triton_layer_norm"
RMS_NORM = "kprof triton_rms_norm"


@triton.jit
def _forward(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    mean_ptr,
    rstd_ptr,
    rows,
    n,
    inv_n,
    eps,
    CENTER: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # y = (x - mean) * rstd * w + b per row (mean = 0 and no b for RMSNorm); rstd = 1 / sqrt(mean((x - mean)^2) + eps).
    # Means multiply by inv_n = 1 / n: Triton's fp32 division is approximate, and a row of one element must centre
    # to exactly 0 (its rstd is 1 / sqrt(eps), which would blow the division's rounding up)
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.arange(0, BLOCK_N)
    rmask, cmask = r < rows, c < n
    mask = rmask[:, None] & cmask[None, :]
    offs = r[:, None] * n + c[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if CENTER:
        mean = tl.sum(x, axis=1) * inv_n
        x = tl.where(mask, x - mean[:, None], 0.0)
        tl.store(mean_ptr + r, mean, mask=rmask)
    rstd = tl.math.rsqrt(tl.sum(x * x, axis=1) * inv_n + eps)
    tl.store(rstd_ptr + r, rstd, mask=rmask)
    y = x * rstd[:, None] * tl.load(w_ptr + c, mask=cmask, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        y += tl.load(b_ptr + c, mask=cmask, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _backward(
    dy_ptr,
    x_ptr,
    w_ptr,
    mean_ptr,
    rstd_ptr,
    dx_ptr,
    partial_ptr,
    rows,
    n,
    inv_n,
    tiles,
    CENTER: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = w * dy (no mean(g) term for RMSNorm), over row tiles
    # p, p + P, ...; partial[0, p] = this program's sum of dy * xhat over its rows, partial[1, p] its sum of dy
    pid = tl.program_id(0)
    c = tl.arange(0, BLOCK_N)
    cmask = c < n
    w = tl.load(w_ptr + c, mask=cmask, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_R, BLOCK_N), dtype=tl.float32)
    db = tl.zeros((BLOCK_R, BLOCK_N), dtype=tl.float32)
    for t in range(pid, tiles, tl.num_programs(0)):
        r = (t * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)  # rows < 2**31: t * BLOCK_R fits
        rmask = r < rows
        mask = rmask[:, None] & cmask[None, :]
        offs = r[:, None] * n + c[None, :]
        dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + r, mask=rmask, other=0.0)[:, None]
        if CENTER:
            x = tl.where(mask, x - tl.load(mean_ptr + r, mask=rmask, other=0.0)[:, None], 0.0)
        xhat = x * rstd
        g = w[None, :] * dy
        dx = g - xhat * (tl.sum(g * xhat, axis=1) * inv_n)[:, None]
        if CENTER:
            dx -= (tl.sum(g, axis=1) * inv_n)[:, None]
        tl.store(dx_ptr + offs, (dx * rstd).to(dx_ptr.dtype.element_ty), mask=mask)
        dw += dy * xhat
        if HAS_BIAS:
            db += dy
    tl.store(partial_ptr + pid * n + c, tl.sum(dw, axis=0), mask=cmask)
    if HAS_BIAS:
        tl.store(partial_ptr + (tl.num_programs(0) + pid) * n + c, tl.sum(db, axis=0), mask=cmask)


def _norm_forward(
    op: str,
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    eps: float,
    center: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, mean, rstd) of either norm; mean is empty for RMSNorm (center=False)."""
    x, weight, bias, n = T.norm_args(op, x, normalized_shape, weight, bias, eps)
    rows = x.numel() // n
    block_r, block_n = T.tile(n, T.MAX_ROW)
    y = torch.empty_like(x)
    mean = torch.empty(rows if center else 0, dtype=torch.float32, device=x.device)
    rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
    T.launch(
        _forward,
        (T.cdiv(rows, block_r),),
        x,
        weight,
        weight if bias is None else bias,
        y,
        mean if center else rstd,
        rstd,
        rows,
        n,
        1.0 / n,
        eps,
        CENTER=center,
        HAS_BIAS=bias is not None,
        BLOCK_R=block_r,
        BLOCK_N=block_n,
        num_warps=T.warps(block_r * block_n),
    )
    return y, mean, rstd


def _norm_backward(
    op: str,
    grad: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    mean: torch.Tensor | None,
    rstd: torch.Tensor,
    eps: float,
    bias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dweight, dbias) of either norm (mean None: RMSNorm); dbias is empty without a bias."""
    x, weight, _, n = T.norm_args(op, x, weight.shape, weight, None, eps)
    rows = x.numel() // n
    grad = T.checked_like(x, grad, op, "grad")
    rstd = T.stat(op, "rstd", rstd, rows, x)
    if mean is not None:
        mean = T.stat(op, "mean", mean, rows, x)
    block_r, block_n = T.tile(n, T.MAX_ROW)
    tiles = T.cdiv(rows, block_r)
    programs = T.programs(x, tiles)
    dx = torch.empty_like(x)
    partial = torch.empty(1 + bias, programs, n, dtype=torch.float32, device=x.device)
    # the backward also holds the dweight and dbias accumulators: twice the forward's warps keep it at 40-130
    # registers per thread on sm_90, no spill up to rows of 8192 (benchmarks/triton_sm90.py)
    T.launch(
        _backward,
        (programs,),
        grad,
        x,
        weight,
        rstd if mean is None else mean,
        rstd,
        dx,
        partial,
        rows,
        n,
        1.0 / n,
        tiles,
        CENTER=mean is not None,
        HAS_BIAS=bias,
        BLOCK_R=block_r,
        BLOCK_N=block_n,
        num_warps=T.warps(2 * block_r * block_n),
    )
    sums = [p.sum(0).to(weight.dtype).view(weight.shape) for p in partial]  # one tensor each: outputs never alias
    return dx, sums[0], sums[1] if bias else weight.new_empty(0)


def _rms_eps(eps: float | None) -> float:
    """eps=None is torch's default: the machine epsilon of the float32 accumulation."""
    return torch.finfo(torch.float32).eps if eps is None else eps


@T.operator
def layer_norm_fwd(
    x: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor, bias: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _norm_forward(LAYER_NORM, x, normalized_shape, weight, bias, eps, center=True)


@T.operator
def layer_norm_backward(
    grad: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    eps: float,
    bias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _norm_backward(LAYER_NORM, grad, x, weight, mean, rstd, eps, bias)


@T.operator
def rms_norm_fwd(
    x: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor, eps: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    y, _, rstd = _norm_forward(RMS_NORM, x, normalized_shape, weight, None, _rms_eps(eps), center=False)
    return y, rstd


@T.operator
def rms_norm_backward(
    grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    dx, dw, _ = _norm_backward(RMS_NORM, grad, x, weight, None, rstd, eps, bias=False)
    return dx, dw


def _layer_norm_setup(ctx, inputs: tuple, output: tuple) -> None:
    x, ctx.normalized_shape, weight, bias, ctx.eps = inputs
    ctx.bias = bias is not None
    ctx.save_for_backward(x, weight, bias, *output[1:])
    ctx.mark_non_differentiable(*output[1:])


def _layer_norm_grads(ctx, grad: torch.Tensor, _mean: torch.Tensor, _rstd: torch.Tensor) -> tuple:
    x, weight, bias, mean, rstd = ctx.saved_tensors
    if T.records(grad, x, weight, bias):
        dx, dw, db = T.twin(
            lambda v, w, b: F.layer_norm(v, ctx.normalized_shape, w, b, ctx.eps), [x, weight, bias], grad
        )
    else:
        dx, dw, db = torch.ops.kprof.triton_layer_norm_backward(grad, x, weight, mean, rstd, ctx.eps, ctx.bias)
    return dx, None, dw, db if ctx.bias else None, None


def _rms_norm_setup(ctx, inputs: tuple, output: tuple) -> None:
    x, ctx.normalized_shape, weight, eps = inputs
    ctx.eps = _rms_eps(eps)
    ctx.save_for_backward(x, weight, output[1])
    ctx.mark_non_differentiable(output[1])


def _rms_norm_grads(ctx, grad: torch.Tensor, _rstd: torch.Tensor) -> tuple:
    x, weight, rstd = ctx.saved_tensors
    if T.records(grad, x, weight):
        dx, dw = T.twin(lambda v, w: F.rms_norm(v, ctx.normalized_shape, w, ctx.eps), [x, weight], grad)
    else:
        dx, dw = torch.ops.kprof.triton_rms_norm_backward(grad, x, weight, rstd, ctx.eps)
    return dx, None, dw, None


layer_norm_fwd.register_autograd(_layer_norm_grads, setup_context=_layer_norm_setup)
rms_norm_fwd.register_autograd(_rms_norm_grads, setup_context=_rms_norm_setup)
T.autocast_like(layer_norm_fwd, "aten::layer_norm")
T.autocast_like(rms_norm_fwd, "aten::rms_norm")

# The public operators return y alone: composites over the forwards, which carry the autograd.
torch.library.define(
    "kprof::triton_layer_norm",
    "(Tensor x, SymInt[] normalized_shape, Tensor weight, Tensor? bias=None, float eps=1e-05) -> Tensor",
)
torch.library.define(
    "kprof::triton_rms_norm", "(Tensor x, SymInt[] normalized_shape, Tensor weight, float? eps=None) -> Tensor"
)


@torch.library.impl("kprof::triton_layer_norm", "CompositeImplicitAutograd")
def layer_norm(
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    return torch.ops.kprof.triton_layer_norm_fwd(x, normalized_shape, weight, bias, eps)[0]


@torch.library.impl("kprof::triton_rms_norm", "CompositeImplicitAutograd")
def rms_norm(
    x: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor, eps: float | None = None
) -> torch.Tensor:
    return torch.ops.kprof.triton_rms_norm_fwd(x, normalized_shape, weight, eps)[0]
