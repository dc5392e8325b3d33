"""LayerNorm and RMSNorm operators against float64 PyTorch references, on the CPU (C++ kernels) and, where a GPU
is present, on CUDA, and what the norms share with SwiGLU (modules, errors, the profiler). Operators allocate
their outputs; under ``poisoned_outputs()`` every allocation starts as NaN, so an element the kernels fail to write
shows up; inputs are fresh random draws every time."""

from __future__ import annotations

import importlib
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kprof_callbacks import kernels
from kprof_callbacks.kernels._norm import stats_dtype

from kernel_checks import (
    DEVICES,
    HAS_CUDA,
    TOL,
    LlamaMLP,
    assert_errors,
    cases,
    errors_in_child,
    poisoned_outputs,
    reference_grads,
    rel_err,
)

ops = torch.ops.kprof
# (rows..., hidden): hidden 1, odd sizes off every pack and block width, 3-D, many rows, the CUDA maximum.
SHAPES = [(3, 1), (7, 1000), (5, 1030), (4, 4097), (2, 3, 64), (4099, 8), (2, 8192)]


@pytest.fixture(scope="module", autouse=True)
def libraries() -> None:
    """The operators are registered (built or loaded from the cache) before the tests call torch.ops.kprof."""
    for module in ("layernorm", "rmsnorm", "swiglu"):
        importlib.import_module(f"kprof_callbacks.kernels.{module}").LIBRARY.load()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_layernorm_kernels_match_float64(device: str, shape: tuple[int, ...], bias: bool) -> None:
    n = shape[-1]
    for dtype, wdtype in cases(device):
        x = torch.randn(shape, device=device).mul_(3).add_(1).to(dtype)
        w = torch.randn(n, device=device).to(wdtype)
        b = torch.randn(n, device=device).to(wdtype) if bias else None
        dy = torch.randn(shape, device=device).to(dtype)
        with poisoned_outputs():
            y, mean, rstd = ops.layer_norm_fwd(x, [n], w, b, 1e-5)
            dx, dw, db = ops.layer_norm_backward(dy, x, w, mean, rstd, 1e-5, bias)
        assert mean.dtype == rstd.dtype == stats_dtype(x) and mean.shape == (x.numel() // n,)
        assert db.shape == ((n,) if bias else (0,))

        inputs = [x, w] + ([b] if bias else [])
        ref, grads = reference_grads(lambda x, w, b=None: F.layer_norm(x, (n,), w, b, 1e-5), inputs, dy)
        tol = TOL[dtype]
        assert rel_err(y, ref) < tol, (dtype, wdtype)
        assert rel_err(mean, x.double().reshape(-1, n).mean(-1)) < 1e-5
        dx_terms = rstd[:, None] * w * dy.reshape(-1, n)
        assert rel_err(dx.reshape(-1, n), grads[0].reshape(-1, n), dx_terms) < tol, (dtype, wdtype)
        assert rel_err(dw, grads[1], dy) < max(tol, TOL[wdtype]), (dtype, wdtype)
        if bias:
            assert rel_err(db, grads[2], dy) < max(tol, TOL[wdtype]), (dtype, wdtype)  # a sum of dy, as dw


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_rmsnorm_kernels_match_float64(device: str, shape: tuple[int, ...]) -> None:
    n = shape[-1]
    eps = 1e-6
    for dtype, wdtype in cases(device):
        x = torch.randn(shape, device=device).mul_(3).add_(1).to(dtype)
        w = torch.randn(n, device=device).to(wdtype)
        dy = torch.randn(shape, device=device).to(dtype)
        with poisoned_outputs():
            y, rstd = ops.rms_norm_fwd(x, [n], w, eps)
            dx, dw = ops.rms_norm_backward(dy, x, w, rstd, eps)
        assert rstd.dtype == stats_dtype(x)

        ref, (gx, gw) = reference_grads(
            lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w, [x, w], dy
        )
        tol = TOL[dtype]
        assert rel_err(y, ref) < tol, (dtype, wdtype)
        dx_terms = rstd[:, None] * w * dy.reshape(-1, n)
        assert rel_err(dx.reshape(-1, n), gx.reshape(-1, n), dx_terms) < tol, (dtype, wdtype)
        assert rel_err(dw, gw, dy) < max(tol, TOL[wdtype]), (dtype, wdtype)


def test_gradcheck_float64_cpu() -> None:
    def leaf(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, dtype=torch.float64, requires_grad=True)

    x, w, b = leaf(2, 3, 2, 5), leaf(2, 5), leaf(2, 5)
    assert torch.autograd.gradcheck(lambda x, w, b: kernels.layer_norm(x, (2, 5), w, b, impl="cpp"), (x, w, b))
    assert torch.autograd.gradcheck(lambda x, w: kernels.layer_norm(x, (2, 5), w, impl="cpp"), (x, w))
    x, w = leaf(6, 7), leaf(7)
    assert torch.autograd.gradcheck(lambda x, w: kernels.rms_norm(x, 7, w, impl="cpp"), (x, w))
    g, u = leaf(3, 11), leaf(3, 11)
    assert torch.autograd.gradcheck(lambda g, u: kernels.swiglu(g, u, impl="cpp"), (g, u))


@pytest.mark.parametrize("device", DEVICES)
def test_modules_match_torch_modules_forward_and_backward(device: str) -> None:
    x = torch.randn(4, 9, 33, device=device)
    torch_mods = [nn.LayerNorm(33, device=device), nn.RMSNorm(33, device=device)]
    for ref_mod in torch_mods:
        with torch.no_grad():
            ref_mod.weight.normal_()
            if getattr(ref_mod, "bias", None) is not None:
                ref_mod.bias.normal_()
        mod = {nn.LayerNorm: kernels.LayerNorm, nn.RMSNorm: kernels.RMSNorm}[type(ref_mod)].from_module(ref_mod)
        assert mod.weight is ref_mod.weight
        assert mod.state_dict().keys() == ref_mod.state_dict().keys()
        xs = [x.clone().requires_grad_() for _ in range(2)]
        out, ref = mod(xs[0]), ref_mod(xs[1])
        assert rel_err(out, ref.double()) < 1e-5
        dy = torch.randn_like(out)
        grads = torch.autograd.grad(out, [xs[0], *mod.parameters()], dy)
        ref_grads = torch.autograd.grad(ref, [xs[1], *ref_mod.parameters()], dy)
        for got, want in zip(grads, ref_grads, strict=True):
            assert rel_err(got, want.double()) < 1e-5


def test_rmsnorm_default_eps_is_torchs() -> None:
    """eps=None follows torch: float32's epsilon for bfloat16 input (bfloat16's would change this result)."""
    x = torch.randn(4, 16).mul_(1e-4).to(torch.bfloat16)
    ref_mod = nn.RMSNorm(16, dtype=torch.bfloat16)
    mod = kernels.RMSNorm.from_module(ref_mod)
    assert rel_err(mod(x), ref_mod(x).double()) < TOL[torch.bfloat16]
    assert mod(x).float().abs().mean() > 0.1  # ~0.22; with bfloat16's epsilon (0.0078) it would be ~0.001


def test_impl_choice_and_repr() -> None:
    ln = kernels.LayerNorm((3, 4), eps=1e-3, bias=False)
    assert "impl=cpp (auto)" in repr(ln) and "bias=False" in repr(ln)
    x = torch.randn(5, 3, 4)
    auto = ln(x)
    ln.impl = "torch"
    assert "impl=torch" in repr(ln)
    assert rel_err(auto, ln(x).double()) < 1e-5
    assert ln.build() is ln
    mlp = kernels.SwiGLUMLP(8, 16, impl="cpp")
    assert "impl=cpp" in repr(mlp)
    mlp.impl = "torch"
    assert mlp.act.impl == "torch"


def test_non_contiguous_inputs() -> None:
    x = torch.randn(10, 6, 40).transpose(0, 2)[:, ::2]  # (40, 3, 10), strided
    w, b = torch.randn(10), torch.randn(10)
    assert not x.is_contiguous()
    assert rel_err(kernels.layer_norm(x, 10, w, b), F.layer_norm(x.double(), (10,), w.double(), b.double())) < 1e-5
    ref = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    assert rel_err(kernels.rms_norm(x, 10, w, 1e-6), ref) < 1e-5
    gate, up = x, x.flip(0)
    assert rel_err(kernels.swiglu(gate, up), (F.silu(gate.double()) * up.double())) < 1e-5


def test_backward_with_expanded_grad() -> None:
    """loss = out.sum() hands backward a stride-0 gradient; it is made contiguous first."""
    x = torch.randn(3, 17, requires_grad=True)
    w = torch.randn(17, requires_grad=True)
    kernels.layer_norm(x, 17, w).sum().backward()
    xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    F.layer_norm(xr, (17,), wr).sum().backward()
    assert rel_err(x.grad, xr.grad) < 1e-4 and rel_err(w.grad, wr.grad) < 1e-5


def test_profiler_sees_the_operators() -> None:
    """The dispatcher records each registered operator under its name, forward and backward."""
    ln, mlp = kernels.LayerNorm(8), kernels.SwiGLUMLP(8, 12)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = mlp(ln(torch.randn(2, 8))) + kernels.rms_norm(torch.randn(2, 8), 8, torch.randn(8, requires_grad=True))
        out.sum().backward()
    names = {e.name for e in prof.events()}
    assert {
        "kprof::layer_norm",
        "kprof::layer_norm_fwd",
        "kprof::layer_norm_backward",
        "kprof::rms_norm",
        "kprof::rms_norm_backward",
        "kprof::swiglu",
        "kprof::swiglu_backward",
    } <= names


def test_from_module_keeps_parameters_and_state_dict() -> None:
    src = nn.LayerNorm((4, 6), eps=1e-3, bias=False)
    mod = kernels.LayerNorm.from_module(src, impl="cpp")
    assert mod.eps == 1e-3 and mod.bias is None and mod.normalized_shape == (4, 6)
    assert all(torch.equal(a, b) for a, b in zip(mod.state_dict().values(), src.state_dict().values(), strict=True))
    assert list(mod.state_dict()) == list(src.state_dict()) == ["weight"]
    src.eval()
    assert not kernels.RMSNorm.from_module(nn.RMSNorm(5).eval()).training


def test_bad_inputs_raise_clear_errors() -> None:
    x, w = torch.randn(4, 8), torch.randn(8)
    cases = [
        (RuntimeError, "Expected a value of type 'Tensor'", lambda: kernels.layer_norm([1.0], 8, w)),
        (TypeError, "x is Long on cpu; supported", lambda: kernels.rms_norm(torch.ones(2, 8, dtype=torch.long), 8, w)),
        (ValueError, "x of shape [4, 8] does not end in normalized_shape [7]", lambda: kernels.layer_norm(x, 7, w)),
        (ValueError, "weight is [7] on cpu, expected [8] on cpu", lambda: kernels.layer_norm(x, 8, torch.randn(7))),
        (TypeError, "weight dtype Float does not go with x dtype Double", lambda: kernels.layer_norm(x.double(), 8, w)),
        (
            TypeError,
            "weight and bias dtypes differ",
            lambda: kernels.layer_norm(x.bfloat16(), 8, w.bfloat16(), torch.randn(8)),
        ),
        (ValueError, "eps must be a number >= 0, got -1", lambda: kernels.rms_norm(x, 8, w, eps=-1.0)),
        (ValueError, "normalized_shape must be a non-empty list of positive sizes", lambda: kernels.rms_norm(x, [], w)),
        (ValueError, "impl must be", lambda: kernels.layer_norm(x, 8, w, impl="fast")),
        (ValueError, "impl='cuda' needs CUDA tensors", lambda: kernels.rms_norm(x, 8, w, impl="cuda")),
        (ValueError, "normalized_shape must be", lambda: kernels.LayerNorm(0)),
        (ValueError, "elementwise_affine=False", lambda: kernels.LayerNorm(8, elementwise_affine=False)),
        (
            ValueError,
            "elementwise_affine=False",
            lambda: kernels.RMSNorm.from_module(nn.RMSNorm(8, elementwise_affine=False)),
        ),
        (TypeError, "expected torch.nn.LayerNorm", lambda: kernels.LayerNorm.from_module(nn.RMSNorm(8))),
        (ValueError, "up has shape [4, 4], expected [4, 8]", lambda: kernels.swiglu(x, x[:, :4])),
        (TypeError, "up is Double on cpu", lambda: kernels.swiglu(x, x.double())),
        (
            TypeError,
            "no nn.Linear attribute(s) ['w_gate', 'w_up', 'w_down']",
            lambda: kernels.SwiGLUMLP.from_module(nn.Module()),
        ),
        (ValueError, "shapes do not chain", lambda: kernels.SwiGLUMLP.from_module(_bad_mlp())),
    ]
    for exc, message, call in cases:
        with pytest.raises(exc, match=re.escape(message)):
            call()


BAD_OPERATOR_CALLS = """
x, w = torch.randn(4, 8, device=device), torch.randn(8, device=device)
y, mean, rstd = ops.layer_norm_fwd(x, [8], w, None, 1e-5)
calls = [
    lambda: ops.layer_norm_backward(x[:, :7], x, w, mean, rstd, 1e-5, False),
    lambda: ops.layer_norm_backward(x, x, w, mean[:3], rstd, 1e-5, False),
    lambda: ops.rms_norm_backward(x, x, w, rstd.double(), 1e-5),
    lambda: ops.layer_norm_fwd(x, [0], w, None, 1e-5),
    lambda: ops.swiglu_backward(x[:2], x, x),
    lambda: ops.rms_norm_fwd(x, [8], w.cpu(), None),  # a parameter on another device (none on a CPU run)
    lambda: ops.rms_norm_fwd(torch.randn(2, 8193, device=device), [8193], torch.randn(8193, device=device), None),
]
"""


@pytest.mark.parametrize("device", DEVICES)
def test_operators_reject_bad_input_with_python_errors(device: str) -> None:
    """Every check is a TORCH_CHECK raised before any launch, so bad input is a Python exception on every build (the
    raw bindings' checks crashed the pytest worker on a GPU build before). In a child process, so a crash fails only
    this test."""
    lines = errors_in_child(BAD_OPERATOR_CALLS, ("layernorm", "rmsnorm", "swiglu"), device)
    assert_errors(
        lines[:5],
        [
            ("ValueError", "grad has shape [4, 7], expected [4, 8]"),
            ("ValueError", "mean must have shape [4]"),
            ("TypeError", "rstd has dtype Double"),
            ("ValueError", "normalized_shape must be"),
            ("ValueError", "grad has shape [2, 8]"),
        ],
    )
    if device == "cuda":
        assert_errors(
            lines[5:],
            [
                ("ValueError", "weight is [8] on cpu, expected [8] on cuda"),
                ("ValueError", "the CUDA kernels take rows of at most 8192 elements"),
            ],
        )
    else:  # the CPU kernels take both
        assert lines[5:] == ["no error", "no error"]


def _bad_mlp() -> nn.Module:
    mlp = LlamaMLP()
    mlp.w_down = nn.Linear(20, 11)
    return mlp


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA")
def test_cuda_limits_and_errors() -> None:
    w = torch.randn(8193, device="cuda")
    with pytest.raises(ValueError, match="at most 8192 elements"):
        kernels.layer_norm(torch.randn(2, 8193, device="cuda"), 8193, w)
    with pytest.raises(TypeError, match="Double on cuda"):
        kernels.rms_norm(
            torch.randn(2, 8, device="cuda", dtype=torch.float64), 8, torch.randn(8, device="cuda", dtype=torch.float64)
        )
    with pytest.raises(ValueError, match="weight is"):
        kernels.layer_norm(torch.randn(2, 8, device="cuda"), 8, torch.randn(8))
    with pytest.raises(ValueError, match="longer than"):
        kernels.LayerNorm.from_module(nn.LayerNorm(8193, device="cuda"))
    torch.cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA")
def test_cuda_many_rows_and_reproducible_grads() -> None:
    """More rows than resident blocks (the persistent backward loops); no atomics, so bitwise repeatable."""
    ln = kernels.LayerNorm(520, device="cuda")
    with torch.no_grad():
        ln.weight.normal_()
        ln.bias.normal_()
    x = torch.randn(70001, 520, device="cuda", requires_grad=True)
    dy = torch.randn(70001, 520, device="cuda")
    first = torch.autograd.grad(ln(x), [x, ln.weight, ln.bias], dy)
    second = torch.autograd.grad(ln(x), [x, ln.weight, ln.bias], dy)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    ref, grads = reference_grads(lambda x, w, b: F.layer_norm(x, (520,), w, b), [x, ln.weight, ln.bias], dy)
    for got, want in zip(first, grads, strict=True):
        assert rel_err(got, want) < 1e-5
