"""Triton twin of SwiGLU: ``torch.ops.kprof.triton_swiglu`` and ``triton_swiglu_backward`` (the schemas of
swiglu.cpp), ``silu(gate) * up`` in one pass forward and one backward, math in float32."""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from . import _triton_op as T

OP = "kprof triton_swiglu"


@triton.jit
def _forward(g_ptr, u_ptr, y_ptr, n, BLOCK: tl.constexpr):
    # y = gate * sigmoid(gate) * up
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, (g * tl.sigmoid(g) * u).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _backward(dy_ptr, g_ptr, u_ptr, dg_ptr, du_ptr, n, BLOCK: tl.constexpr):
    # dgate = dy * up * silu'(gate), silu'(g) = s * (1 + g * (1 - s)) with s = sigmoid(g); dup = dy * silu(gate)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(g)
    tl.store(dg_ptr + offs, (dy * u * s * (1.0 + g * (1.0 - s))).to(dg_ptr.dtype.element_ty), mask=mask)
    tl.store(du_ptr + offs, (dy * g * s).to(du_ptr.dtype.element_ty), mask=mask)


@T.operator
def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    gate = T.checked(gate, OP, "gate")
    up = T.checked_like(gate, up, OP, "up")
    y = torch.empty_like(gate)
    T.elementwise(_forward, gate.numel(), gate, up, y, gate.numel())
    return y


@T.operator
def swiglu_backward(grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    gate = T.checked(gate, OP, "gate")
    up = T.checked_like(gate, up, OP, "up")
    grad = T.checked_like(gate, grad, OP, "grad")
    dgate, dup = torch.empty_like(gate), torch.empty_like(gate)
    T.elementwise(_backward, gate.numel(), grad, gate, up, dgate, dup, gate.numel())
    return dgate, dup


def _setup(ctx, inputs: tuple, output: torch.Tensor) -> None:
    ctx.save_for_backward(*inputs)


def _grads(ctx, grad: torch.Tensor) -> tuple:
    gate, up = ctx.saved_tensors
    if T.records(grad, gate, up):
        return T.twin(lambda g, u: F.silu(g) * u, [gate, up], grad)
    return tuple(torch.ops.kprof.triton_swiglu_backward(grad, gate, up))


swiglu.register_autograd(_grads, setup_context=_setup)
T.autocast_like(swiglu, "aten::silu")
