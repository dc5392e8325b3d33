"""The Triton twins (``impl="triton"``): forward and every gradient against float64 PyTorch on small odd shapes, with
outputs NaN-poisoned; as operators (opcheck, double backward, autocast, torch.compile without graph breaks, the
profiler); through the layers and ``kprof.swap``; and a clear error without triton.

Without a GPU the kernels run in Triton's interpreter on CPU tensors (tests/conftest.py sets TRITON_INTERPRET=1 before
they load), in float32; on a GPU they are compiled and run on it, in float32, bfloat16 and float16."""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
import subprocess
import sys
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kprof_callbacks import kernels
from kprof_callbacks.cli import main
from kprof_callbacks.kernels import _triton

from kernel_checks import (
    HAS_CUDA,
    TRITON_DEVICE,
    assert_compiles_without_graph_breaks,
    operator_samples,
    poisoned_outputs,
    reference_grads,
)

if sys.platform != "linux":  # the dev extra installs triton where Triton has wheels: Linux, CI's platform
    pytest.importorskip("triton", reason="Triton ships wheels for Linux only")

DEVICE = TRITON_DEVICE
DTYPES = [torch.float32, torch.bfloat16, torch.float16] if HAS_CUDA else [torch.float32]
MODULES = ("gelu", "swiglu", "layernorm", "rmsnorm")
ops = torch.ops.kprof


@pytest.fixture(scope="module", autouse=True)
def libraries() -> None:
    for module in MODULES:
        importlib.import_module(f"kprof_callbacks.kernels.{module}").KERNELS.triton.load()


def test_the_kernels_run_compiled_on_a_gpu_and_interpreted_without_one() -> None:
    assert _triton.require().INTERPRETED is not HAS_CUDA
    assert _triton.unavailable(DEVICE) is None


# -- numbers: forward and every gradient against float64 -------------------------------------------------------------
def rms(x: torch.Tensor) -> torch.Tensor:
    """1 / the root mean square of each row: the size of a norm's rstd, for its gradients' error scale."""
    return x.double().square().mean(-1, keepdim=True).rsqrt()


@dataclasses.dataclass(frozen=True)
class Case:
    """A Triton layer as a function of its inputs, its PyTorch reference, input shapes from a base shape, and
    ``scale(*inputs, dy)``: the size of the terms the results are sums of, which sets the rounding a result that
    cancels to near zero keeps (GELU' at its zero near x = -0.75, a norm's dx for rows of one element)."""

    name: str
    triton: Callable[..., torch.Tensor]
    reference: Callable[..., torch.Tensor]
    shapes: Callable[[tuple[int, ...]], list[tuple[int, ...]]]
    scale: Callable[..., torch.Tensor]


def gelu_scale(x: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
    """y ~ x (with the bias, if any), dx ~ dy (|GELU'| < 1.2), the bias gradient a sum of dx."""
    return (x.double() + rest[0].double() if len(rest) == 2 else x.double()).abs() + rest[-1].double().abs()


def swiglu_scale(g: torch.Tensor, u: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    g, u, dy = g.double().abs(), u.double().abs(), dy.double().abs()
    return (g + 1) * (u + 1) * (dy + 1)  # y ~ g u, dgate ~ dy u (1 + g), dup ~ dy g


def norm_scale(x: torch.Tensor, w: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
    return rms(x) * w.double() * rest[-1].double()  # dx ~ rstd w dy, dweight a sum of dy xhat


EPS = 1e-6
ELEMENTWISE = [
    Case("gelu", lambda x: kernels.gelu(x, impl="triton"), F.gelu, lambda s: [s], gelu_scale),
    Case(
        "gelu-tanh",
        lambda x: kernels.gelu(x, "tanh", impl="triton"),
        lambda x: F.gelu(x, approximate="tanh"),
        lambda s: [s],
        gelu_scale,
    ),
    Case(
        "swiglu",
        lambda g, u: kernels.swiglu(g, u, impl="triton"),
        lambda g, u: F.silu(g) * u,
        lambda s: [s, s],
        swiglu_scale,
    ),
]
BIAS = [
    Case(
        "bias_gelu",
        lambda x, b: kernels.bias_gelu(x, b, impl="triton"),
        lambda x, b: F.gelu(x + b),
        lambda s: [s, s[-1:]],
        gelu_scale,
    ),
    Case(
        "bias_gelu-tanh",
        lambda x, b: kernels.bias_gelu(x, b, "tanh", impl="triton"),
        lambda x, b: F.gelu(x + b, approximate="tanh"),
        lambda s: [s, s[-1:]],
        gelu_scale,
    ),
]
NORMS = [
    Case(
        "layer_norm",
        lambda x, w, b: kernels.layer_norm(x, x.shape[-1], w, b, EPS, impl="triton"),
        lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b, EPS),
        lambda s: [s, s[-1:], s[-1:]],
        norm_scale,
    ),
    Case(
        "layer_norm-nobias",
        lambda x, w: kernels.layer_norm(x, x.shape[-1], w, None, EPS, impl="triton"),
        lambda x, w: F.layer_norm(x, x.shape[-1:], w, None, EPS),
        lambda s: [s, s[-1:]],
        norm_scale,
    ),
    Case(
        "rms_norm",
        lambda x, w: kernels.rms_norm(x, x.shape[-1], w, EPS, impl="triton"),
        lambda x, w: F.rms_norm(x, x.shape[-1:], w, EPS),
        lambda s: [s, s[-1:]],
        norm_scale,
    ),
]
# Sizes off the 1024-element block, one element; bias rows of one column, odd columns, two column blocks (1100 > 1024)
# and more row tiles than programs (the backward's loop); norm rows of one element, off every power of two, past the
# CUDA kernels' 8192, and 4099 rows of 8 in 65 tiles of 64 rows.
SHAPES = [(1,), (7,), (3, 1001), (2049,), (2, 3, 257)]
BIAS_SHAPES = [(1, 1), (37, 1), (3, 129), (2, 5, 64), (9, 1100), (300, 36)]
NORM_SHAPES = [(3, 1), (7, 1000), (5, 1030), (2, 3, 64), (4099, 8), (2, 10000)]
PARAMS = [
    (c, s)
    for cases, shapes in ((ELEMENTWISE, SHAPES), (BIAS, BIAS_SHAPES), (NORMS, NORM_SHAPES))
    for c in cases
    for s in shapes
]


@pytest.mark.parametrize(("case", "shape"), PARAMS, ids=[f"{c.name}-{'x'.join(map(str, s))}" for c, s in PARAMS])
def test_triton_matches_float64(case: Case, shape: tuple[int, ...]) -> None:
    """Output and every input gradient at most 4x as far from float64 as PyTorch's own result in the same dtype,
    plus a rounding of the dtype of the result and 8 of the terms it is a sum of (PyTorch's own error may happen to
    be smaller where a result cancels to near zero)."""
    for dtype in DTYPES:
        inputs = [
            torch.randn(s, device=DEVICE).mul_(2).add_(0.5).to(dtype).requires_grad_() for s in case.shapes(shape)
        ]
        with poisoned_outputs():
            out = case.triton(*inputs)
            dy = torch.randn_like(out)
            got = [out, *torch.autograd.grad(out, inputs, dy)]
        own_out = case.reference(*inputs)
        own = [own_out, *torch.autograd.grad(own_out, inputs, dy)]
        ref_out, ref_grads = reference_grads(case.reference, inputs, dy)
        terms = case.scale(*inputs, dy).norm().item()
        for k, (g, o, w) in enumerate(zip(got, own, [ref_out, *ref_grads], strict=True)):
            assert g.dtype == o.dtype and g.shape == w.shape and torch.isfinite(g).all(), (dtype, k)
            err, own_err = (g.double() - w).norm().item(), (o.double() - w).norm().item()
            bound = 4 * own_err + torch.finfo(dtype).eps * (w.norm().item() + 8 * terms)
            assert err <= bound, f"{case.name} {dtype} output {k}: error {err:.3g} > {bound:.3g} (torch: {own_err:.3g})"


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_norm_forwards_return_float32_statistics(bias: bool) -> None:
    x = torch.randn(37, 520, device=DEVICE).mul_(3).add_(1)
    w, b = torch.randn(520, device=DEVICE), torch.randn(520, device=DEVICE) if bias else None
    with poisoned_outputs():
        _, mean, rstd = ops.triton_layer_norm_fwd(x, [520], w, b, 1e-5)
        _, rms_rstd = ops.triton_rms_norm_fwd(x, [520], w, None)
    xd = x.double()
    assert mean.dtype == rstd.dtype == rms_rstd.dtype == torch.float32 and mean.shape == rstd.shape == (37,)
    torch.testing.assert_close(mean.double(), xd.mean(-1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rstd.double(), (xd.var(-1, correction=0) + 1e-5).rsqrt(), rtol=1e-5, atol=0)
    torch.testing.assert_close(
        rms_rstd.double(), (xd.square().mean(-1) + torch.finfo(torch.float32).eps).rsqrt(), rtol=1e-5, atol=0
    )


def test_backward_is_reproducible() -> None:
    """The parameter gradients are per-program partial sums and their sum, no atomics: bitwise equal run to run."""
    x = torch.randn(300, 40, device=DEVICE, requires_grad=True)
    w, b = (torch.randn(40, device=DEVICE, requires_grad=True) for _ in range(2))
    dy = torch.randn(300, 40, device=DEVICE)

    def grads() -> list[torch.Tensor]:
        return [
            *torch.autograd.grad(kernels.layer_norm(x, 40, w, b, impl="triton"), [x, w, b], dy),
            *torch.autograd.grad(kernels.bias_gelu(x, b, impl="triton"), [x, b], dy),
        ]

    assert all(torch.equal(a, c) for a, c in zip(grads(), grads(), strict=True))


# -- operators --------------------------------------------------------------------------------------------------------
def triton_ops() -> set[str]:
    return {op for m in MODULES for op in importlib.import_module(f"kprof_callbacks.kernels.{m}").KERNELS.triton.ops}


def test_every_triton_operator_is_registered_and_has_a_sample() -> None:
    names = triton_ops()
    assert names == {
        "gelu",
        "gelu_backward",
        "bias_gelu",
        "bias_gelu_backward",
        "swiglu",
        "swiglu_backward",
        "layer_norm",
        "layer_norm_fwd",
        "layer_norm_backward",
        "rms_norm",
        "rms_norm_fwd",
        "rms_norm_backward",
    }
    assert all(hasattr(ops, f"triton_{name}") for name in names)
    assert names <= {name for name, _ in operator_samples(DEVICE, torch.float32, "triton_")}


def test_opcheck_every_triton_operator() -> None:
    """Schema, autograd registration, fake kernel and AOT dispatch (static and dynamic shapes) of every operator. The
    backward operators are differentiated through their forward's autograd (see the penalty test), not directly, so
    their sample inputs do not require grad."""
    for name, args in operator_samples(DEVICE, torch.float32, "triton_"):
        if name not in triton_ops():
            continue
        if name.endswith("_backward"):
            args = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
        result = torch.library.opcheck(getattr(ops, f"triton_{name}").default, args)
        assert set(result.values()) == {"SUCCESS"}, (name, result)


TRITON_PENALTY = {
    "gelu": lambda x, p, impl: kernels.gelu(x @ p["w"], impl=impl),
    "gelu-tanh": lambda x, p, impl: kernels.gelu(x @ p["w"], "tanh", impl=impl),
    "bias_gelu": lambda x, p, impl: kernels.bias_gelu(x @ p["w"], p["b"], impl=impl),
    "swiglu": lambda x, p, impl: kernels.swiglu(x @ p["w"], x @ p["v"], impl=impl),
    "layer_norm": lambda x, p, impl: kernels.layer_norm(x @ p["w"], 7, p["g"], p["b"], impl=impl),
    "layer_norm-nobias": lambda x, p, impl: kernels.layer_norm(x @ p["w"], 7, p["g"], impl=impl),
    "rms_norm": lambda x, p, impl: kernels.rms_norm(x @ p["w"], 7, p["g"], 1e-5, impl=impl),
}


@pytest.mark.parametrize("name", TRITON_PENALTY)
def test_gradient_penalty_matches_torch(name: str) -> None:
    """Double backward: under create_graph a backward computes with differentiable PyTorch ops (its twin), so the
    parameter gradients of a gradient penalty through a Triton layer are torch's (float32 against float64)."""
    gen = torch.Generator().manual_seed(0)
    shapes = {"w": (6, 7), "v": (6, 7), "b": (7,), "g": (7,)}
    params = {k: torch.randn(*s, generator=gen, dtype=torch.float64).to(DEVICE) for k, s in shapes.items()}
    x, weights = torch.randn(5, 6, generator=gen).to(DEVICE), torch.randn(5, 7, generator=gen).to(DEVICE)

    def penalty_grads(impl: str, dtype: torch.dtype) -> list[torch.Tensor | None]:
        p = {k: v.to(dtype).requires_grad_() for k, v in params.items()}
        xs = x.to(dtype).requires_grad_()
        out = (TRITON_PENALTY[name](xs, p, impl) * weights.to(dtype)).sum()
        (gx,) = torch.autograd.grad(out, xs, create_graph=True)
        return list(torch.autograd.grad(out + gx.square().sum(), list(p.values()), allow_unused=True))

    want, got = penalty_grads("torch", torch.float64), penalty_grads("triton", torch.float32)
    for key, w, g in zip(params, want, got, strict=True):
        assert (w is None) == (g is None), key
        if w is not None:
            torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-4 * w.abs().max().item(), msg=key)
    assert any(w is not None and w.abs().sum() > 0 for w in want)


def autocast_pairs(x: torch.Tensor) -> dict[str, tuple]:
    """(torch call, Triton call) per layer on activations x; parameters float32, as a model's stay under autocast."""
    n = x.shape[-1]
    w, b = torch.randn(n, device=x.device), torch.randn(n, device=x.device)
    return {
        "gelu": (lambda: F.gelu(x), lambda: kernels.gelu(x, impl="triton")),
        "bias_gelu": (lambda: F.gelu(x + b.to(x.dtype)), lambda: kernels.bias_gelu(x, b.to(x.dtype), impl="triton")),
        "swiglu": (lambda: F.silu(x) * x, lambda: kernels.swiglu(x, x, impl="triton")),
        "layer_norm": (lambda: F.layer_norm(x, (n,), w, b), lambda: kernels.layer_norm(x, n, w, b, impl="triton")),
        "rms_norm": (lambda: F.rms_norm(x, (n,), w), lambda: kernels.rms_norm(x, n, w, impl="triton")),
    }


@pytest.mark.parametrize("input_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_autocast_dtypes_follow_the_replaced_op(input_dtype: torch.dtype) -> None:
    """Each layer returns the dtype torch's op returns under autocast on this device (layer_norm in float32 under CUDA
    autocast, everything following its input on the CPU)."""
    x = torch.randn(4, 24, device=DEVICE).to(input_dtype)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        for name, (reference, ours) in autocast_pairs(x).items():
            want, got = reference(), ours()
            assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
            torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2, msg=name)


def step(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Every Triton layer in one function: what torch.compile must take without a graph break."""
    h = kernels.layer_norm(x, x.shape[-1], w, b, impl="triton")
    h = kernels.swiglu(kernels.bias_gelu(h, b, "tanh", impl="triton"), kernels.gelu(h, impl="triton"), impl="triton")
    return kernels.rms_norm(h, (x.shape[-1],), w, impl="triton")


def test_functional_forms_compile_without_graph_breaks() -> None:
    assert_compiles_without_graph_breaks(step, DEVICE)


# Child processes without TRITON_INTERPRET, where the operators are triton_ops over compiled kernels.
# benchmarks/triton_sm90.py stands in for the CUDA driver with an H100 (sm_90) target, so Triton compiles (Triton IR
# to a cubin, with its bundled ptxas) and torch analyses the kernels as on the GPU, and lets CPU tensors pass the
# device check; nothing launches.
COMPILE_EVERY_LAUNCH = """
import torch, triton_sm90
# the three kinds of norm tile: 64 rows of 64, 4 rows of 1024, one row of 8192
launches = triton_sm90.compile_every_launch([torch.float32, torch.bfloat16, torch.float16], [64, 1000, 8192])
assert all(compiled.asm["cubin"] for _, compiled, _ in launches)
print(len(launches), sorted({triton_sm90.kernel_name(kernel) for kernel, _, _ in launches}))
"""
TRACE_COMPILE = """
import logging, re, torch, triton_sm90
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd
from torch._higher_order_ops import triton_kernel_wrap
import test_kernels_triton as t

triton_sm90.as_on_an_h100()
failed = []  # where torch cannot analyse a kernel it logs a warning from this module and assumes every argument written

def note(record):
    if record.levelno >= logging.WARNING and record.pathname == triton_kernel_wrap.__file__:
        failed.append(record.getMessage())
    return True

triton_kernel_wrap.log.addFilter(note)
graphs = []

def record(gm, inputs):
    graphs.append(gm.code)
    return make_boxed_func(gm.forward)

x, w, b = (torch.randn(*s, requires_grad=True) for s in ((6, 16), (16,), (16,)))
compiled = torch.compile(t.step, backend=aot_autograd(fw_compiler=record, bw_compiler=record), fullgraph=True,
                         dynamic=True)
try:
    compiled(x, w, b).sum().backward()
except AttributeError:  # the stand-in driver cannot launch
    pass
assert not failed, failed
for code in graphs:
    table = triton_kernel_wrap.kernel_side_table
    kernels = [triton_sm90.kernel_name(table.get_kernel(int(i))) for i in re.findall(r"kernel_idx = (\\d+)", code)]
    print(sorted(kernels), re.findall(r"kprof\\.\\w+", code))
"""


def as_on_an_h100(script: str) -> list[str]:
    """Runs ``script`` in a child process without TRITON_INTERPRET (tests/ and benchmarks/ importable); its stdout
    lines."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    here = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = os.pathsep.join([here, os.path.join(here, "..", "benchmarks"), env.get("PYTHONPATH", "")])
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's default (FMA contraction); set, so it does not warn
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.splitlines()


def test_every_launch_compiles_for_sm90() -> None:
    """Each launch the operators make, forward and backward, in each dtype and kind of norm tile, with the launch
    settings they choose, compiles to an sm_90 cubin: what the interpreter cannot check (it runs the kernels'
    Python, not Triton's compiler)."""
    count, kernels_compiled = as_on_an_h100(COMPILE_EVERY_LAUNCH)[-1].split(" ", 1)
    assert int(count) == 3 * 3 * 16  # per dtype and row length: 8 forward launches and their 8 backwards
    assert kernels_compiled == str(
        sorted(
            [
                "gelu_triton._forward",
                "gelu_triton._backward",
                "gelu_triton._bias_backward",
                "swiglu_triton._forward",
                "swiglu_triton._backward",
                "norm_triton._forward",
                "norm_triton._backward",
            ]
        )
    )


def test_torch_compile_traces_into_the_compiled_kernels() -> None:
    """With compiled kernels the operators are triton_ops: AOTAutograd traces into their bodies, so the graphs hold
    the Triton kernels themselves (which inductor calls from its own code), forward and backward, with dynamic
    shapes, and torch could analyse what each kernel writes."""
    forward, backward = as_on_an_h100(TRACE_COMPILE)[-2:]
    norm, gelu, swiglu = "norm_triton.", "gelu_triton.", "swiglu_triton."
    want = [norm + "_forward", gelu + "_forward", gelu + "_forward", swiglu + "_forward", norm + "_forward"]
    assert forward == f"{sorted(want)} []", forward
    want = [norm + "_backward", gelu + "_bias_backward", gelu + "_backward", swiglu + "_backward", norm + "_backward"]
    assert backward == f"{sorted(want)} []", backward


def test_profiler_sees_the_operators() -> None:
    x = torch.randn(4, 8, device=DEVICE, requires_grad=True)
    w = torch.randn(8, device=DEVICE, requires_grad=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step(x, w, w).sum().backward()
    names = {e.name for e in prof.events()}
    assert {
        f"kprof::triton_{op}"
        for op in (
            "gelu",
            "gelu_backward",
            "bias_gelu",
            "bias_gelu_backward",
            "swiglu",
            "swiglu_backward",
            "layer_norm_fwd",
            "layer_norm_backward",
            "rms_norm_fwd",
            "rms_norm_backward",
        )
    } <= names


# -- layers, swap, errors ---------------------------------------------------------------------------------------------
def test_fused_layers_take_triton() -> None:
    x = torch.randn(3, 5, 12, device=DEVICE)
    linear, act = nn.Linear(12, 24).to(DEVICE), nn.GELU()
    fused = kernels.LinearGELU.from_module(linear, act, impl="triton")
    torch.testing.assert_close(fused(x), act(linear(x)), rtol=1e-5, atol=1e-5)
    mlp = kernels.SwiGLUMLP(12, 20, impl="triton", device=DEVICE)
    ref = mlp.w_down(F.silu(mlp.w_gate(x)) * mlp.w_up(x))
    torch.testing.assert_close(mlp(x), ref, rtol=1e-5, atol=1e-5)
    assert "impl=triton" in repr(mlp) and "impl=triton" in repr(fused)


def test_bad_inputs_are_clear_errors() -> None:
    x, w = torch.randn(4, 8, device=DEVICE), torch.randn(8, device=DEVICE)
    _, mean, rstd = ops.triton_layer_norm_fwd(x, [8], w, None, 1e-5)
    cases = [
        (TypeError, "kprof triton_gelu: x is int64", lambda: kernels.gelu(x.long(), impl="triton")),
        (TypeError, "x is float64", lambda: kernels.gelu(x.double(), impl="triton")),
        (
            ValueError,
            "approximate must be 'none' or 'tanh', got 'fast'",
            lambda: kernels.gelu(x, "fast", impl="triton"),
        ),
        (ValueError, "bias has shape [3], expected [8]", lambda: kernels.bias_gelu(x, w[:3], impl="triton")),
        (ValueError, "x must have at least one dimension", lambda: kernels.bias_gelu(x[0, 0], w[:1], impl="triton")),
        (ValueError, "up has shape [4, 4], expected [4, 8]", lambda: kernels.swiglu(x, x[:, :4], impl="triton")),
        (TypeError, "up is bfloat16", lambda: kernels.swiglu(x, x.bfloat16(), impl="triton")),
        (ValueError, "grad has shape [5], expected [4, 8]", lambda: ops.triton_gelu_backward(x[0, :5], x)),
        (ValueError, "does not end in normalized_shape [7]", lambda: kernels.layer_norm(x, 7, w[:7], impl="triton")),
        (ValueError, "weight is [7]", lambda: kernels.layer_norm(x, 8, w[:7], impl="triton")),
        (
            TypeError,
            "weight dtype bfloat16 does not go with x dtype float32",
            lambda: kernels.rms_norm(x, 8, w.bfloat16(), impl="triton"),
        ),
        (ValueError, "eps must be a number >= 0, got -1", lambda: kernels.rms_norm(x, 8, w, -1.0, impl="triton")),
        (
            ValueError,
            "rows of at most 65536 elements",
            lambda: kernels.rms_norm(x.new_ones(1, 65537), 65537, w.new_ones(65537), impl="triton"),
        ),
        (
            ValueError,
            "mean must have shape [4]",
            lambda: ops.triton_layer_norm_backward(x, x, w, mean[:3], rstd, 1e-5, False),
        ),
        (
            ValueError,
            "longer than the 65536 elements the Triton kernels take",
            lambda: kernels.LayerNorm.from_module(nn.LayerNorm(65537, device="meta"), impl="triton"),
        ),
        (
            TypeError,
            "supported: float32/float16/bfloat16 on CUDA and by the Triton kernels",
            lambda: kernels.RMSNorm.from_module(nn.RMSNorm(8, dtype=torch.float64), impl="triton"),
        ),
        (ValueError, "kprof add has no Triton kernels", lambda: kernels.add(x, x, impl="triton")),
    ]
    for exc, message, call in cases:
        with pytest.raises(exc, match=re.escape(message)):
            call()


def test_bench_checks_and_lists_the_triton_twins(capsys: pytest.CaptureFixture) -> None:
    assert main(["bench", "--check", "--ops", "gelu,rms_norm,square"]) == 0
    out = capsys.readouterr().out.splitlines()
    checked = {line.split()[1] + (" triton" if "(triton)" in line else "") for line in out}
    assert checked == {"gelu", "gelu triton", "rms_norm", "rms_norm triton", "square"}  # square has no twin
    assert all(line.startswith("ok ") for line in out)
    assert main(["bench", "--quick", "--ops", "gelu"]) == 0
    out, err = capsys.readouterr()
    assert "| triton ms | triton % of copy | eager ms |" in out
    assert "no Triton columns: on the CPU the Triton kernels run in Triton's interpreter" in err


def test_compare_ab_tests_each_impl_on_one_model(capsys: pytest.CaptureFixture) -> None:
    native = "cuda" if HAS_CUDA else "cpp"
    code = main(
        [
            "compare",
            "--steps",
            "3",
            "--warmup",
            "0",
            "--device",
            DEVICE,
            "--width",
            "32",
            "--depth",
            "1",
            "--batch-size",
            "8",
            "--check",
            "raise",
            "--impls",
            f"{native},triton,torch",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    rows = [line.split()[0] for line in out.splitlines() if line.startswith(("torch ", "kprof.swap"))]
    variants = [name for name in rows if not name.endswith(":")]  # not the notes below the table
    assert variants == ["torch", f"kprof.swap-{native}", "kprof.swap-triton", "kprof.swap-torch"]
    with pytest.raises(SystemExit) as bad:
        main(["compare", "--device", DEVICE, "--impls", "triton,fast"])
    assert bad.value.code == 2 and "--impls: impl must be None or one of" in capsys.readouterr().err


NO_INTERPRETER = """
import torch
from kprof_callbacks import kernels
try:
    kernels.gelu(torch.randn(3), impl="triton")
except ValueError as exc:
    print(exc)
"""


@pytest.mark.skipif(HAS_CUDA, reason="on a GPU the interpreter is off and CPU tensors are the error case in-process")
def test_cpu_tensors_need_the_interpreter() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", NO_INTERPRETER], capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (
        "x is on cpu: the Triton kernels take CUDA tensors; cpu tensors run only in Triton's interpreter "
        "(TRITON_INTERPRET=1" in result.stdout
    )


WITHOUT_TRITON = """
import sys
sys.modules["triton"] = None  # as if triton were not installed: importing it raises ImportError
import torch
from torch import nn
import kprof_callbacks as kprof
from kprof_callbacks import kernels
from kprof_callbacks.kernels import _triton
x = torch.randn(4, 8)
model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.LayerNorm(8))
for call in (lambda: kernels.gelu(x, impl="triton"), lambda: kernels.LayerNorm(8, impl="triton"),
             lambda: kernels.GELU(impl="triton").build(), lambda: kprof.swap(model, impl="triton"),
             lambda: kprof.swap(model, impl="triton", fallback=True)):
    try:
        call()
        print("no error")
    except ImportError as exc:
        print(type(exc).__name__, "|", exc)
print(_triton.unavailable("cuda"))
torch.testing.assert_close(kernels.gelu(x, impl="cpp"), kernels.gelu(x, impl="torch"))
print(sorted({type(m).__name__ for m in kprof.swap(model).modules()}))
"""


def test_without_triton_impl_triton_names_the_extra() -> None:
    """Without the triton package every front door to impl="triton" raises an ImportError naming the extra (a
    swap with fallback=True too: the user asked for Triton), and the other impls work as before."""
    result = subprocess.run([sys.executable, "-c", WITHOUT_TRITON], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    message = "impl='triton' needs the triton package: pip install 'kprof-callbacks[triton]'"
    assert lines[:5] == [f"ImportError | {message}"] * 5, lines
    assert lines[5] == message
    assert lines[6] == "['GELU', 'LayerNorm', 'Linear', 'Sequential']"
