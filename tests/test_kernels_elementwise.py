"""square, add, GELU and bias + GELU operators against float64 PyTorch references, on the CPU (C++ kernels) and,
where a GPU is present, on CUDA. Operators allocate their outputs; under ``poisoned_outputs()`` every allocation is
filled with NaN first (torch's deterministic-mode fill), so an element the kernels fail to write shows up. Inputs
are fresh random draws every time."""

from __future__ import annotations

import dataclasses
import importlib
import re
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kprof_callbacks import kernels
from kprof_callbacks.cli import main

from kernel_checks import DEVICES, HAS_CUDA, assert_errors, errors_in_child, poisoned_outputs, reference_grads

# (rtol, atol) per dtype against the float64 reference: a rounding or two of the dtype, and an absolute floor
# for results near zero (float16 subnormals; float32 tanh-GELU loses digits to cancellation for x << 0,
# as PyTorch's own kernel does). Gradients get GRAD_SLACK times more.
TOL = {
    torch.float64: (1e-10, 1e-12),
    torch.float32: (1e-5, 1e-6),
    torch.float16: (2e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-4),
}
GRAD_SLACK = 4
# Sizes off every pack (16 bytes), block (256 threads x 2 packs) and CPU grain (32768), a size of 1, and a
# row of one element.
SHAPES = [(1,), (7,), (1, 1), (3, 1000), (2049,), (2, 3, 257), (100_003,), (5, 1)]
# [rows..., cols] for bias + GELU: one column, odd columns, a column count off the 32-pack block width.
BIAS_SHAPES = [(1, 1), (37, 1), (3, 129), (2, 5, 64), (1000, 36), (9, 4104)]


@pytest.fixture(scope="module", autouse=True)
def libraries() -> None:
    """The operators are registered (built or loaded from the cache) before the tests call torch.ops.kprof."""
    for module in ("add", "gelu", "square"):
        importlib.import_module(f"kprof_callbacks.kernels.{module}").LIBRARY.load()


def dtypes(device: str) -> list[torch.dtype]:
    extra = [torch.float64] if device == "cpu" else []
    return [torch.float32, torch.bfloat16, torch.float16, *extra]


def assert_matches(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, slack: float = 1, what: str = "") -> None:
    """out (in dtype, from the kernels) against the float64 reference; NaN (a poisoned, unwritten element) fails."""
    rtol, atol = TOL[dtype]
    assert out.dtype == dtype and out.shape == ref.shape, what
    torch.testing.assert_close(out.double(), ref, rtol=rtol * slack, atol=atol * slack, msg=lambda m: f"{what}: {m}")


def assert_sum_matches(got: torch.Tensor, want: torch.Tensor, terms: torch.Tensor, dtype: torch.dtype) -> None:
    """A sum over rows against float64: each term may be off by what assert_matches allows it, so the bound is
    the sum of those allowances (a sum that cancels to near zero keeps the rounding error of its large terms)."""
    rtol, atol = TOL[dtype]
    assert got.dtype == dtype and got.shape == want.shape and torch.isfinite(got).all()
    bound = GRAD_SLACK * (rtol * terms.abs().sum(0) + atol * terms.shape[0]) + rtol * want.abs()  # + final rounding
    excess = (got.double() - want).abs() - bound
    assert (excess <= 0).all(), f"bias gradient off by up to {excess.max().item():.3g} beyond the bound"


@dataclasses.dataclass(frozen=True)
class Case:
    """One operator pair called directly: ``forward(*inputs)`` and ``backward(grad, *inputs)`` (the input
    gradients), and ``reference``, the same function in torch."""

    name: str
    forward: Callable[..., torch.Tensor]
    backward: Callable[..., list[torch.Tensor]]
    reference: Callable[..., torch.Tensor]
    input_shapes: Callable[[tuple[int, ...]], list[tuple[int, ...]]]


def same(shape):
    return [shape]


def pair(shape):
    return [shape, shape]


def with_bias(shape):
    return [shape, shape[-1:]]


ops = torch.ops.kprof
CASES = [
    Case("square", lambda x: ops.square(x), lambda g, x: [ops.square_backward(g, x)], torch.square, same),
    Case(
        "square-grid2d", lambda x: ops.square(x, "grid2d"), lambda g, x: [ops.square_backward(g, x)], torch.square, same
    ),
    Case("add", lambda a, b: ops.add(a, b), lambda g, a, b: [g, g], torch.add, pair),
    Case("gelu", lambda x: ops.gelu(x), lambda g, x: [ops.gelu_backward(g, x)], F.gelu, same),
    Case(
        "gelu-tanh",
        lambda x: ops.gelu(x, "tanh"),
        lambda g, x: [ops.gelu_backward(g, x, "tanh")],
        lambda x: F.gelu(x, approximate="tanh"),
        same,
    ),
]
BIAS_CASES = [
    Case(
        "bias_gelu",
        lambda x, b: ops.bias_gelu(x, b),
        lambda g, x, b: list(ops.bias_gelu_backward(g, x, b)),
        lambda x, b: F.gelu(x + b),
        with_bias,
    ),
    Case(
        "bias_gelu-tanh",
        lambda x, b: ops.bias_gelu(x, b, "tanh"),
        lambda g, x, b: list(ops.bias_gelu_backward(g, x, b, "tanh")),
        lambda x, b: F.gelu(x + b, approximate="tanh"),
        with_bias,
    ),
]


def check_case(case: Case, shape: tuple[int, ...], device: str) -> None:
    for dtype in dtypes(device):
        inputs = [torch.randn(s, device=device).mul_(2).to(dtype) for s in case.input_shapes(shape)]
        dy = torch.randn_like(inputs[0])
        with poisoned_outputs():
            y = case.forward(*inputs)
            grads = case.backward(dy, *inputs)
        ref, ref_grads = reference_grads(case.reference, inputs, dy)
        assert_matches(y, ref, dtype, what=f"{case.name} {dtype}")
        for k, (got, want) in enumerate(zip(grads, ref_grads, strict=True)):
            if got.shape == inputs[0].shape:
                assert_matches(got, want, dtype, GRAD_SLACK, f"{case.name} {dtype} grad {k}")
            else:  # a broadcast input's gradient: a sum over rows, whose rounding scales with the sum of |terms|
                assert_sum_matches(got, want, ref_grads[0].reshape(-1, got.numel()), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_kernels_match_float64_reference(case: Case, shape: tuple[int, ...], device: str) -> None:
    check_case(case, shape, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", BIAS_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("case", BIAS_CASES, ids=lambda c: c.name)
def test_bias_gelu_kernels_match_float64_reference(case: Case, shape: tuple[int, ...], device: str) -> None:
    check_case(case, shape, device)


@pytest.mark.parametrize("device", DEVICES)
def test_misaligned_views_take_the_scalar_path(device: str) -> None:
    """A storage offset of one element breaks 16-byte alignment of the inputs: the kernels must still be exact."""
    base = torch.randn(4 * 1031 + 1, device=device)
    x = base[1:].view(4, 1031)
    b = torch.randn(1032, device=device)[1:]
    assert x.data_ptr() % 16 != 0 and x.is_contiguous() and b.data_ptr() % 16 != 0
    with poisoned_outputs():
        y, yb = ops.gelu(x), ops.bias_gelu(x, b, "tanh")
    assert_matches(y, F.gelu(x.double()), torch.float32)
    assert_matches(yb, F.gelu(x.double() + b.double(), approximate="tanh"), torch.float32)


FUNCTIONAL = [
    ("square", lambda x: kernels.square(x), torch.square),
    ("square-grid2d", lambda x: kernels.square(x, variant="grid2d"), torch.square),
    ("add", lambda x: kernels.add(x, x * 0.5), lambda x: x + x * 0.5),
    ("gelu", lambda x: kernels.gelu(x), F.gelu),
    ("gelu-tanh", lambda x: kernels.gelu(x, "tanh"), lambda x: F.gelu(x, approximate="tanh")),
    ("bias_gelu", lambda x: kernels.bias_gelu(x, x[0] * 0.3), lambda x: F.gelu(x + x[0] * 0.3)),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("name", "fn", "ref"), FUNCTIONAL, ids=[f[0] for f in FUNCTIONAL])
def test_autograd_on_non_contiguous_input(name: str, fn, ref, device: str) -> None:
    """Strided views are read through contiguous copies; forward and backward agree with torch."""
    x = torch.randn(33, 20, device=device).t()[:, ::2]  # transposed and strided
    assert not x.is_contiguous()
    x.requires_grad_()
    dy = torch.randn(x.shape, device=device)
    out = fn(x)
    out.backward(dy)
    want, (want_grad,) = reference_grads(ref, [x], dy)
    assert_matches(out.detach(), want, torch.float32)
    assert_matches(x.grad, want_grad, torch.float32, GRAD_SLACK)


@pytest.mark.parametrize(("name", "fn", "ref"), FUNCTIONAL, ids=[f[0] for f in FUNCTIONAL])
def test_gradcheck_float64_cpu(name: str, fn, ref) -> None:
    x = torch.randn(4, 7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(fn, (x,))


def test_gradcheck_bias_gelu_both_inputs() -> None:
    x = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, requires_grad=True)
    for approximate in ("none", "tanh"):
        assert torch.autograd.gradcheck(lambda x, b: kernels.bias_gelu(x, b, approximate), (x, b))


@pytest.mark.parametrize("device", DEVICES)
def test_impls_agree_and_repr_names_them(device: str) -> None:
    x = torch.randn(6, 50, device=device)
    for impl in (None, "torch", "cuda" if device == "cuda" else "cpp"):
        assert torch.allclose(kernels.GELU(impl=impl)(x), F.gelu(x), atol=1e-6)
        assert torch.allclose(kernels.Square(impl=impl)(x), x * x, atol=1e-6)
        assert torch.allclose(kernels.Add(impl=impl)(x, x), x + x)
    assert "impl=auto" in repr(kernels.GELU()) and "impl=torch" in repr(kernels.GELU(impl="torch"))
    assert "variant='grid2d'" in repr(kernels.Square(variant="grid2d"))


def test_modules_from_torch_keep_parameters_and_state_dict() -> None:
    gelu = kernels.GELU.from_module(nn.GELU(approximate="tanh"))
    assert gelu.approximate == "tanh"
    linear, act = nn.Linear(12, 24), nn.GELU()
    fused = kernels.LinearGELU.from_module(linear, act)
    assert list(fused.state_dict()) == list(linear.state_dict()) == ["weight", "bias"]
    assert fused.weight is linear.weight and fused.bias is linear.bias
    x = torch.randn(3, 5, 12, requires_grad=True)
    out = fused(x)
    want = act(linear(x.detach()))
    assert torch.allclose(out, want, atol=1e-6)
    out.sum().backward()
    grad_fused = linear.weight.grad.clone()
    linear.weight.grad = None
    act(linear(x.detach())).sum().backward()
    assert torch.allclose(grad_fused, linear.weight.grad, atol=1e-5)
    bias_gelu = kernels.BiasGELU(24, "tanh")
    assert list(bias_gelu.state_dict()) == ["bias"] and "features=24" in repr(bias_gelu)


def test_fused_layers_follow_autocast_dtypes() -> None:
    """Under autocast the matmul output is bfloat16 while the bias parameter stays float32."""
    fused = kernels.LinearGELU(8, 16)
    x = torch.randn(4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fused(x)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert fused.bias.grad is not None and fused.bias.grad.dtype == torch.float32
    torch.testing.assert_close(out.float(), F.gelu(fused.weight @ x.T + fused.bias[:, None]).T, rtol=2e-2, atol=2e-2)


def test_profiler_sees_the_operators() -> None:
    """The dispatcher records each registered operator under its name, forward and backward."""
    x = torch.randn(4, 8, requires_grad=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = kernels.gelu(x) + kernels.LinearGELU(8, 8)(x) + kernels.square(x)
        out.sum().backward()
    names = {e.name for e in prof.events()}
    assert {
        "kprof::gelu",
        "kprof::bias_gelu",
        "kprof::square",
        "kprof::gelu_backward",
        "kprof::bias_gelu_backward",
        "kprof::square_backward",
    } <= names


BAD_INPUTS = [
    (lambda: kernels.gelu(torch.arange(4)), TypeError, "x is Long on cpu; supported"),
    (lambda: kernels.gelu([1.0, 2.0]), RuntimeError, "Expected a value of type 'Tensor'"),
    (lambda: kernels.gelu(torch.randn(3), "fast"), ValueError, "approximate must be 'none' or 'tanh', got 'fast'"),
    (lambda: kernels.GELU("fast"), ValueError, "approximate must be one of"),
    (lambda: kernels.gelu(torch.randn(3), impl="fast"), ValueError, "impl must be None or one of"),
    (lambda: kernels.square(torch.randn(3), impl="triton"), ValueError, "kprof square has no Triton kernels"),
    (lambda: kernels.gelu(torch.randn(3), impl="cuda"), ValueError, "impl='cuda' needs CUDA tensors, got one on cpu"),
    (lambda: kernels.add(torch.randn(3), torch.randn(4)), ValueError, "b has shape [4], expected [3]"),
    (lambda: kernels.add(torch.randn(3), torch.randn(3, dtype=torch.float64)), TypeError, "b is Double on cpu"),
    (lambda: kernels.square(torch.randn(3), variant="2d"), ValueError, "variant must be 'vectorized' or 'grid2d'"),
    (lambda: kernels.Square(variant="2d"), ValueError, "variant must be one of"),
    (lambda: kernels.bias_gelu(torch.randn(3, 4), torch.randn(3)), ValueError, "bias has shape [3], expected [4]"),
    (lambda: kernels.bias_gelu(torch.tensor(1.0), torch.randn(1)), ValueError, "at least one dimension"),
    (lambda: kernels.GELU.from_module(nn.ReLU()), TypeError, "nn.GELU"),
    (lambda: kernels.LinearGELU.from_module(nn.Linear(2, 2, bias=False), nn.GELU()), TypeError, "with a bias"),
]


@pytest.mark.parametrize(("call", "error", "message"), BAD_INPUTS, ids=[b[2] for b in BAD_INPUTS])
def test_bad_input_is_a_clear_error(call, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        call()


BAD_OPERATOR_CALLS = """
x = torch.randn(6, 4, device=device)
calls = [
    lambda: ops.gelu_backward(torch.randn(5, device=device), x),
    lambda: ops.add(x, x.double()),
    lambda: ops.square_backward(torch.randn(5, device=device), x),
    lambda: ops.bias_gelu_backward(torch.randn(3, device=device), x, x[0], "tanh"),
    lambda: ops.bias_gelu(x, x[:, 0]),
    lambda: ops.square(x.int()),
]
"""


@pytest.mark.parametrize("device", DEVICES)
def test_operators_reject_bad_input_with_python_errors(device: str) -> None:
    """Every check is a TORCH_CHECK raised before any launch, so bad input is a Python exception on every build (the
    CUDA build of the old square binding segfaulted on one). In a child process, so a crash fails only this test."""
    lines = errors_in_child(BAD_OPERATOR_CALLS, ("add", "gelu", "square"), device)
    assert_errors(
        lines,
        [
            ("ValueError", "grad has shape [5], expected [6, 4]"),
            ("TypeError", "b is Double"),
            ("ValueError", "grad has shape [5]"),
            ("ValueError", "grad has shape [3]"),
            ("ValueError", "bias has shape [6], expected [4]"),
            ("TypeError", "x is Int"),
        ],
    )


def test_bench_prints_progress_to_stderr_and_one_table_to_stdout(capsys: pytest.CaptureFixture) -> None:
    assert main(["bench", "--quick", "--ops", "add,gelu"]) == 0
    out, err = capsys.readouterr()
    table = [line for line in out.splitlines() if line.startswith("|")]
    assert len(table) == 2 + 4  # header, separator, two ops x (fwd, fwd+bwd)
    assert out.rstrip().endswith(table[-1])  # one block at the end: nothing interleaved
    assert err.count("[kprof bench] |") == 4 and "[kprof bench]" not in out  # a row each, after notes (no Triton)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA")
def test_cuda_rejects_float64_and_mixed_devices() -> None:
    with pytest.raises(TypeError, match="Double on cuda"):
        kernels.gelu(torch.randn(4, device="cuda", dtype=torch.float64))
    with pytest.raises(TypeError, match="expected Float on cuda"):
        kernels.add(torch.randn(4, device="cuda"), torch.randn(4))
    with pytest.raises(ValueError, match="impl='cpp' needs CPU"):
        kernels.gelu(torch.randn(4, device="cuda"), impl="cpp")
