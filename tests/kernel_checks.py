"""What the kernel tests share: the devices to run on, NaN-poisoned output allocation, float64 references, a sample
call of every operator, and bad calls made in a child process."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

HAS_CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="no CUDA")])]
# Where the Triton twins run in the tests: compiled on a GPU, else on the CPU in Triton's interpreter (conftest.py).
TRITON_DEVICE = "cuda" if HAS_CUDA else "cpu"


@contextlib.contextmanager
def poisoned_outputs() -> Iterator[None]:
    """Every tensor allocated inside starts as NaN (torch fills uninitialized memory in deterministic mode): the
    operators allocate their own outputs, so an element a kernel fails to write stays NaN and fails the test."""
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    was_filling = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
        torch.utils.deterministic.fill_uninitialized_memory = was_filling


def reference_grads(fn, inputs: list[torch.Tensor], dy: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """fn's output and input gradients for ``dy``, all computed in float64."""
    leaves = [t.detach().double().requires_grad_() for t in inputs]
    out = fn(*leaves)
    out.backward(dy.double())
    return out.detach(), [t.grad for t in leaves]


def operator_samples(device: str, dtype: torch.dtype, prefix: str = "") -> list[tuple[str, tuple]]:
    """(operator name without ``prefix``, arguments) for every kprof operator, on odd shapes, inputs requiring grad
    where they can; the norms' saved statistics come from ``kprof::<prefix>layer_norm_fwd`` (``prefix="triton_"``:
    the Triton twins')."""

    def r(*shape: int, grad: bool = True) -> torch.Tensor:
        return torch.randn(*shape, device=device, dtype=dtype, requires_grad=grad)

    x, n = r(3, 5), 5
    ops = torch.ops.kprof
    _, mean, rstd = getattr(ops, f"{prefix}layer_norm_fwd")(x.detach(), [n], r(n, grad=False), None, 1e-5)
    _, rms = getattr(ops, f"{prefix}rms_norm_fwd")(x.detach(), [n], r(n, grad=False), None)
    return [
        ("square", (x, "vectorized")),
        ("square", (x, "grid2d")),
        ("square_backward", (r(3, 5), x)),
        ("add", (x, r(3, 5))),
        ("gelu", (x, "none")),
        ("gelu", (x, "tanh")),
        ("gelu_backward", (r(3, 5), x, "tanh")),
        ("bias_gelu", (x, r(n), "none")),
        ("bias_gelu_backward", (r(3, 5), x, r(n), "tanh")),
        ("swiglu", (x, r(3, 5))),
        ("swiglu_backward", (r(3, 5), x, r(3, 5))),
        ("layer_norm", (r(2, 3, n), [n], r(n), r(n), 1e-5)),
        ("layer_norm", (r(2, 3, n), [3, n], r(3, n), None, 1e-3)),
        ("layer_norm_fwd", (x.detach(), [n], r(n, grad=False), r(n, grad=False), 1e-5)),  # runs below autograd
        ("layer_norm_backward", (r(3, 5), x, r(n), mean, rstd, 1e-5, True)),
        ("layer_norm_backward", (r(3, 5), x, r(n), mean, rstd, 1e-5, False)),
        ("rms_norm", (r(2, 3, n), [n], r(n), None)),
        ("rms_norm", (r(3, n), [n], r(n), 1e-3)),
        ("rms_norm_fwd", (x.detach(), [n], r(n, grad=False), None)),
        ("rms_norm_backward", (r(3, 5), x, r(n), rms, 1e-6)),
        *linear_cross_entropy_samples(r, device),
    ]


def linear_cross_entropy_samples(r, device: str) -> list[tuple[str, tuple]]:
    """The fused loss's operators: each reduction, bias, label smoothing, softcap, and one chunk per row; the forward
    with gradients (the fused path) and without, and the recomputing backward, on inputs that need no grad."""
    h, w, b = r(2, 3, 5), r(11, 5), r(11)
    t = torch.tensor([[0, 10, -100], [4, 2, 7]], device=device)
    fixed = [v.detach() for v in (h, w, b)]
    return [
        ("linear_cross_entropy", (h, w, t, b, -100, "mean", 0.0, None)),
        ("linear_cross_entropy", (h, w, t.clamp(min=0), None, 2, "sum", 0.1, 3.0)),
        ("linear_cross_entropy", (h, w, t, b, -100, "none", 0.0, None)),
        ("linear_cross_entropy_fwd", (*fixed[:2], t, fixed[2], -100, "mean", 0.1, 2.0, [True, True, True], 1)),
        ("linear_cross_entropy_fwd", (*fixed[:2], t, None, -100, "none", 0.0, None, [False, False, False], 0)),
        (
            "linear_cross_entropy_backward",
            (r(2, 3, grad=False), *fixed[:2], t, fixed[2], -100, "none", 0.0, None, [True, False, True], 1),
        ),
    ]


def assert_compiles_without_graph_breaks(step, device: str = "cpu") -> None:
    """``step(x, w, b)`` (x [rows, 16], w and b [16]) traces with no graph break, and compiled (aot_eager, fullgraph,
    static and dynamic shapes) it gives eager's output and input gradient for two row counts."""
    x, w, b = (torch.randn(*s, device=device, requires_grad=True) for s in ((6, 16), (16,), (16,)))
    explained = torch._dynamo.explain(step)(x, w, b)
    assert explained.graph_break_count == 0, explained.break_reasons
    for dynamic in (False, True):
        torch._dynamo.reset()
        compiled = torch.compile(step, backend="aot_eager", fullgraph=True, dynamic=dynamic)
        for rows in (6, 9):
            xs = torch.randn(rows, 16, device=device, requires_grad=True)
            got, want = compiled(xs, w, b), step(xs, w, b)
            torch.testing.assert_close(got, want)
            (gx,), (wx,) = torch.autograd.grad(got.sum(), [xs]), torch.autograd.grad(want.sum(), [xs])
            torch.testing.assert_close(gx, wx)


def graph_targets(fn, *args) -> list[str]:
    """The call_function targets of the one graph torch.compile makes of ``fn``."""
    targets: list[str] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> torch.fx.GraphModule:
        targets.extend(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return gm

    torch._dynamo.reset()
    torch.compile(fn, backend=backend, fullgraph=True)(*args)
    return targets


_CHILD = """
import importlib, sys, torch
for module in sys.argv[2].split(","):
    importlib.import_module(f"kprof_callbacks.kernels.{module}").LIBRARY.load()
device, ops = sys.argv[1], torch.ops.kprof
"""
_CHILD_CALLS = """
for call in calls:
    try:
        call()
        print("no error", flush=True)
    except (TypeError, ValueError) as exc:
        print(type(exc).__name__, "|", str(exc).splitlines()[0], flush=True)
if device == "cuda":
    torch.cuda.synchronize()  # a launch that slipped through would fail here
"""


def errors_in_child(setup: str, libraries: tuple[str, ...], device: str) -> list[str]:
    """Runs ``setup`` (Python that defines ``calls``, zero-argument callables, with ``torch``, ``ops`` (torch.ops.kprof)
    and ``device`` in scope) in a child process, so that a crash in an error path fails the test instead of ending
    the session; returns a line per call: "ValueError | <first line of the message>", or "no error"."""
    result = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", _CHILD + setup + _CHILD_CALLS, device, ",".join(libraries)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.splitlines()


def assert_errors(lines: list[str], expected: list[tuple[str, str]]) -> None:
    """Each line is the exception type expected with a message containing the text expected."""
    assert len(lines) == len(expected), lines
    for line, (error, text) in zip(lines, expected, strict=True):
        assert line.startswith(f"{error} |") and text in line, (line, error, text)


# Relative error ||out - ref|| / ||ref|| allowed per output dtype (bf16/fp16 outputs are rounded once).
TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def rel_err(out: torch.Tensor, ref: torch.Tensor, terms: torch.Tensor | None = None) -> float:
    """||out - ref|| / (||ref|| + ||terms||). ``terms`` are what a result is a difference or sum of (a norm's dx:
    rstd * weight * dy; its dweight: dy), so results that cancel to ~0 (hidden size 1) are judged against the
    size of those terms rather than against rounding noise."""
    assert torch.isfinite(out).all(), "non-finite values in the output (an unwritten or poisoned element)"
    scale = ref.norm() + (terms.double().norm() if terms is not None else 0.0)
    return ((out.double() - ref).norm() / scale.clamp_min(1e-300)).item()


def cases(device: str) -> list[tuple[torch.dtype, torch.dtype]]:
    """(x dtype, parameter dtype) pairs the kernels support on `device`."""
    pairs = [
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.bfloat16),
        (torch.bfloat16, torch.float32),
        (torch.float16, torch.float16),
        (torch.float16, torch.float32),
    ]
    return pairs + [(torch.float64, torch.float64)] if device == "cpu" else pairs


class LlamaMLP(nn.Module):
    """A Llama-style MLP, the module SwiGLUMLP.from_module takes."""

    def __init__(self) -> None:
        super().__init__()
        self.w_gate, self.w_up, self.w_down = nn.Linear(12, 20), nn.Linear(12, 20), nn.Linear(20, 12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))
