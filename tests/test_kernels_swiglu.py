"""SwiGLU's operators against float64 PyTorch references, on the CPU (C++ kernels) and, where a GPU is present, on
CUDA, with outputs NaN-poisoned and fresh random inputs; ``SwiGLUMLP`` built from a Llama-style MLP."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

from kprof_callbacks import kernels

from kernel_checks import DEVICES, TOL, LlamaMLP, cases, poisoned_outputs, reference_grads, rel_err

ops = torch.ops.kprof


@pytest.fixture(scope="module", autouse=True)
def library() -> None:
    importlib.import_module("kprof_callbacks.kernels.swiglu").LIBRARY.load()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(1,), (7, 1000), (3, 4097), (2, 3, 129), (1 << 17) + 3], ids=str)
def test_swiglu_kernels_match_float64(device: str, shape) -> None:
    for dtype, _ in cases(device):
        gate, up, dy = (torch.randn(shape, device=device).mul_(3).to(dtype) for _ in range(3))
        with poisoned_outputs():
            y = ops.swiglu(gate, up)
            dgate, dup = ops.swiglu_backward(dy, gate, up)

        ref, (gg, gu) = reference_grads(lambda g, u: F.silu(g) * u, [gate, up], dy)
        tol = TOL[dtype]
        assert rel_err(y, ref) < tol, dtype
        assert rel_err(dgate, gg) < tol, dtype
        assert rel_err(dup, gu) < tol, dtype


@pytest.mark.parametrize("device", DEVICES)
def test_swiglu_saturates_without_nan(device: str) -> None:
    """Gates past where exp(-gate) overflows a float (gate < -88.7): silu and its gradients go to 0, never NaN, and
    at large positive gates silu(g) * u = g * u. The 2-byte CUDA kernels take the hardware's fast exp and division,
    whose edge cases these are. Absolute error 1e-6 covers the reference's tiny values that the kernels give as 0
    once exp(-gate) overflows (silu(-88.8) * 1.5 is -3.6e-37)."""
    g = torch.tensor([-1e4, -200.0, -100.0, -88.8, -88.0, -20.0, -0.5, 0.0, 0.5, 20.0, 88.0, 100.0, 200.0, 1e4])
    for dtype, _ in cases(device):
        gate = g.to(device, dtype)
        up, dy = torch.full_like(gate, 1.5), torch.full_like(gate, 0.75)
        with poisoned_outputs():
            y = ops.swiglu(gate, up)
            dgate, dup = ops.swiglu_backward(dy, gate, up)
        ref, (gg, gu) = reference_grads(lambda a, b: F.silu(a) * b, [gate, up], dy)
        for out, want in ((y, ref), (dgate, gg), (dup, gu)):
            torch.testing.assert_close(out.double(), want, rtol=TOL[dtype], atol=1e-6, msg=lambda m: f"{dtype}: {m}")


@pytest.mark.parametrize("device", DEVICES)
def test_swiglu_packed_and_unaligned_views_agree(device: str) -> None:
    """An input starting one element into its storage takes the one-element path; same numbers."""
    base = torch.randn(2, 4097, device=device)
    gate, up = base[0, 1:], base[1, 1:]
    assert gate.data_ptr() % 16 != 0
    assert rel_err(kernels.swiglu(gate, up), kernels.swiglu(gate.clone(), up.clone()).double()) < 1e-6


def test_swiglu_mlp_from_module() -> None:
    src = LlamaMLP()
    mlp = kernels.SwiGLUMLP.from_module(src)
    assert list(mlp.state_dict()) == list(src.state_dict())
    assert mlp.w_gate is src.w_gate
    x = torch.randn(3, 5, 12, requires_grad=True)
    out, ref = mlp(x), src(x)
    assert rel_err(out, ref.double()) < 1e-5
    dy = torch.randn_like(out)
    for got, want in zip(
        torch.autograd.grad(out, [x, *mlp.parameters()], dy),
        torch.autograd.grad(ref, [x, *src.parameters()], dy),
        strict=True,
    ):
        assert rel_err(got, want.double()) < 1e-4
