"""The kernels as PyTorch operators: ``torch.library.opcheck`` of every operator (schema, autograd registration,
fake kernels, AOT dispatch with static and dynamic shapes), double backward equal to torch's, autocast dtypes equal
to those of the torch op each layer replaces, torch.compile with no graph break, and a build cache consulted once
per process, never per call."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from kprof_callbacks import kernels
from kprof_callbacks.kernels import _build

from kernel_checks import (
    DEVICES,
    HAS_CUDA,
    assert_compiles_without_graph_breaks,
    graph_targets,
    operator_samples,
    poisoned_outputs,
)

LIBRARIES = ("add", "gelu", "square", "swiglu", "layernorm", "rmsnorm", "linear_cross_entropy")


@pytest.fixture(scope="module", autouse=True)
def libraries() -> None:
    for module in LIBRARIES:
        importlib.import_module(f"kprof_callbacks.kernels.{module}").LIBRARY.load()


def test_every_operator_has_a_sample() -> None:
    registered = {
        op for module in LIBRARIES for op in importlib.import_module(f"kprof_callbacks.kernels.{module}").LIBRARY.ops
    }
    assert {name for name, _ in operator_samples("cpu", torch.float64)} == registered


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_every_operator(device: str) -> None:
    dtype = torch.float64 if device == "cpu" else torch.float32
    for name, args in operator_samples(device, dtype):
        result = torch.library.opcheck(getattr(torch.ops.kprof, name).default, args)
        assert set(result.values()) == {"SUCCESS"}, (name, result)


def test_a_norm_forward_is_not_differentiated_directly() -> None:
    """layer_norm_fwd/rms_norm_fwd return the statistics their backward reads; their gradients come from the public
    operators, so differentiating them directly is an error, not a silently missing gradient."""
    x, w = torch.randn(3, 5, requires_grad=True), torch.randn(5)
    for call in (
        lambda: torch.ops.kprof.layer_norm_fwd(x, [5], w, None, 1e-5),
        lambda: torch.ops.kprof.rms_norm_fwd(x, [5], w, None),
    ):
        with pytest.raises(RuntimeError, match="has no autograd of its own.*call that to get gradients"):
            call()
        with torch.no_grad():
            assert call()[0].shape == (3, 5)


# each layer's differentiable operator on x and w (inputs that require grad), and the tensor inputs it records
GRAPH_NODES = {
    "kprof::SquareBackward": (lambda x, w: kernels.square(x), 1),
    "kprof::AddBackward": (lambda x, w: kernels.add(x, x * 2), 2),
    "kprof::GeluBackward": (lambda x, w: kernels.gelu(x, "tanh"), 1),
    "kprof::BiasGeluBackward": (lambda x, w: kernels.bias_gelu(x, w), 2),
    "kprof::SwigluBackward": (lambda x, w: kernels.swiglu(x, x * 3), 2),
    "kprof::LayerNormBackward": (lambda x, w: kernels.layer_norm(x, 5, w, w * 2), 3),
    "kprof::RMSNormBackward": (lambda x, w: kernels.rms_norm(x, 5, w), 2),
    # reduction "none" saves its inputs and recomputes; with "mean" the node holds the gradients themselves
    "kprof::LinearCrossEntropyBackward": (
        lambda x, w: kernels.linear_cross_entropy(x, torch.outer(w, w), torch.tensor([0, 4, 2]), reduction="none"),
        3,
    ),
}


@pytest.mark.parametrize("node", GRAPH_NODES)
def test_each_layer_is_one_named_node_that_behaves_as_torchs_own(node: str) -> None:
    """Each layer records a backward node of its own (as torch's generated ones, not a torch.autograd.Function's
    context): it is named in the graph and the profiler, keeps its inputs' versions, frees what it saved after the
    backward, and refuses forward-mode AD instead of dropping the tangent."""
    call, inputs = GRAPH_NODES[node]
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, dtype=torch.float64, requires_grad=True)
    out = call(x, w)
    assert out.grad_fn.name() == node and len(out.grad_fn.next_functions) == inputs
    out.sum().backward(retain_graph=True)
    first = x.grad.clone()
    out.sum().backward()  # the retained graph runs again
    torch.testing.assert_close(x.grad, 2 * first)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        out.sum().backward()
    if node != "kprof::AddBackward":  # add saves nothing: an input modified in place does not matter to it
        y = x.detach().clone().requires_grad_()
        leaf = y * 1.0
        again = call(leaf, w)
        leaf.mul_(2)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            again.sum().backward()
    import torch.autograd.forward_ad as fwAD

    with fwAD.dual_level(), pytest.raises(NotImplementedError, match="forward-mode AD"):
        call(fwAD.make_dual(x.detach(), torch.ones_like(x)).requires_grad_(), w)


def test_poisoned_outputs_start_as_nan() -> None:
    """The mechanism the kernel tests rely on: inside, a fresh allocation is NaN until written."""
    with poisoned_outputs():
        assert torch.empty(1000).isnan().all() and torch.empty(3, dtype=torch.bfloat16).isnan().all()
    assert not torch.are_deterministic_algorithms_enabled()


# -- double backward: a gradient penalty through each layer equals torch's ------------------------------------------
# (torch version, kprof version) of x -> layer(x @ w ...), with shared float64 parameters.
PENALTY = {
    "square": (lambda x, p: torch.square(x @ p["w"]), lambda x, p: kernels.square(x @ p["w"])),
    "add": (lambda x, p: (x @ p["w"]) + (x @ p["v"]) ** 2, lambda x, p: kernels.add(x @ p["w"], (x @ p["v"]) ** 2)),
    "gelu": (lambda x, p: F.gelu(x @ p["w"]), lambda x, p: kernels.gelu(x @ p["w"])),
    "gelu-tanh": (lambda x, p: F.gelu(x @ p["w"], approximate="tanh"), lambda x, p: kernels.gelu(x @ p["w"], "tanh")),
    "bias_gelu": (lambda x, p: F.gelu(x @ p["w"] + p["b"]), lambda x, p: kernels.bias_gelu(x @ p["w"], p["b"])),
    "swiglu": (lambda x, p: F.silu(x @ p["w"]) * (x @ p["v"]), lambda x, p: kernels.swiglu(x @ p["w"], x @ p["v"])),
    "layer_norm": (
        lambda x, p: F.layer_norm(x @ p["w"], (7,), p["g"], p["b"]),
        lambda x, p: kernels.layer_norm(x @ p["w"], 7, p["g"], p["b"]),
    ),
    "layer_norm-nobias": (
        lambda x, p: F.layer_norm(x @ p["w"], (7,), p["g"]),
        lambda x, p: kernels.layer_norm(x @ p["w"], 7, p["g"]),
    ),
    "rms_norm": (
        lambda x, p: F.rms_norm(x @ p["w"], (7,), p["g"], 1e-5),
        lambda x, p: kernels.rms_norm(x @ p["w"], 7, p["g"], 1e-5),
    ),
}


def penalty_grads(
    fn, x: torch.Tensor, params: dict[str, torch.Tensor], weights: torch.Tensor
) -> list[torch.Tensor | None]:
    """d/dparams of sum(weights * fn(x)) + |d sum(weights * fn(x)) / dx|^2: a WGAN-GP style gradient penalty."""
    x = x.clone().requires_grad_()
    out = (fn(x, params) * weights).sum()
    (gx,) = torch.autograd.grad(out, x, create_graph=True)
    return list(torch.autograd.grad(out + gx.square().sum(), list(params.values()), allow_unused=True))


@pytest.mark.parametrize("name", PENALTY)
def test_gradient_penalty_matches_torch(name: str) -> None:
    """Double backward through every layer: the kprof layer's parameter gradients equal torch's (GELU, bias-GELU and
    square once gave a silently wrong [0.431, None, None])."""
    gen = torch.Generator().manual_seed(0)

    def param(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_()

    params = {"w": param(6, 7), "v": param(6, 7), "b": param(7), "g": param(7)}
    x, weights = (
        torch.randn(5, 6, generator=gen, dtype=torch.float64),
        torch.randn(5, 7, generator=gen, dtype=torch.float64),
    )
    reference, ours = PENALTY[name]
    want = penalty_grads(reference, x, params, weights)
    got = penalty_grads(ours, x, params, weights)
    for key, w, g in zip(params, want, got, strict=True):
        assert (w is None) == (g is None), key
        if w is not None:
            torch.testing.assert_close(g, w, rtol=1e-7, atol=1e-9, msg=key)
    assert any(w is not None and w.abs().sum() > 0 for w in want)


@pytest.mark.parametrize("name", ["gelu", "layer_norm", "rms_norm", "swiglu"])
def test_gradgradcheck(name: str) -> None:
    params = {
        k: torch.randn(*s, dtype=torch.float64, requires_grad=True)
        for k, s in {"w": (4, 7), "v": (4, 7), "b": (7,), "g": (7,)}.items()
    }
    fn = PENALTY[name][1]
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda x, *p: fn(x, dict(zip(params, p))), (x, *params.values()))


# -- autocast: each layer returns the dtype of the torch op it replaces ----------------------------------------------
def autocast_pairs(x: torch.Tensor) -> dict[str, tuple]:
    """(torch call, kprof call) per layer on activations x; parameters float32, as a model's stay under autocast."""
    n = x.shape[-1]
    w, b = torch.randn(n, device=x.device), torch.randn(n, device=x.device)
    head, target = torch.randn(7, n, device=x.device), torch.randint(7, x.shape[:-1], device=x.device)
    return {
        "square": (lambda: torch.square(x), lambda: kernels.square(x)),
        "add": (lambda: torch.add(x, x), lambda: kernels.add(x, x)),
        "gelu": (lambda: F.gelu(x), lambda: kernels.gelu(x)),
        "bias_gelu": (lambda: F.gelu(x + b.to(x.dtype)), lambda: kernels.bias_gelu(x, b.to(x.dtype))),
        "swiglu": (lambda: F.silu(x) * x, lambda: kernels.swiglu(x, x)),
        "layer_norm": (lambda: F.layer_norm(x, (n,), w, b), lambda: kernels.layer_norm(x, n, w, b)),
        "rms_norm": (lambda: F.rms_norm(x, (n,), w), lambda: kernels.rms_norm(x, n, w)),
        "linear_cross_entropy": (
            lambda: F.cross_entropy(F.linear(x, head), target),
            lambda: kernels.linear_cross_entropy(x, head, target),
        ),
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("autocast_dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("input_dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_autocast_dtypes_follow_the_replaced_op(
    device: str, autocast_dtype: torch.dtype, input_dtype: torch.dtype
) -> None:
    x = torch.randn(4, 24, device=device).to(input_dtype)
    with torch.autocast(device, dtype=autocast_dtype):
        for name, (reference, ours) in autocast_pairs(x).items():
            want, got = reference(), ours()
            assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
            torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2, msg=name)


# -- torch.compile and the build cache ------------------------------------------------------------------------------
def test_functional_forms_compile_without_graph_breaks() -> None:
    def step(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        h = kernels.layer_norm(x, x.shape[-1], w, b, impl="cpp")
        h = kernels.add(kernels.bias_gelu(h, b, "tanh", impl="cpp"), kernels.square(h, impl="cpp"), impl="cpp")
        return kernels.rms_norm(
            kernels.swiglu(h, kernels.gelu(h, impl="cpp"), impl="cpp"), (x.shape[-1],), w, impl="cpp"
        )

    assert_compiles_without_graph_breaks(step)


def test_under_compile_automatic_layers_trace_torch_math_and_an_explicit_impl_keeps_the_kernel() -> None:
    """impl=None lets inductor fuse the layer's math with its neighbours; "cpp" (or "cuda", "triton") keeps the
    kernel as an operator in the graph."""
    x, w, b = torch.randn(4, 16), torch.randn(16), torch.randn(16)
    auto = graph_targets(lambda t: kernels.gelu(kernels.layer_norm(t, 16, w, b)), x)
    explicit = graph_targets(lambda t: kernels.gelu(kernels.layer_norm(t, 16, w, b, impl="cpp"), impl="cpp"), x)
    assert not [t for t in auto if "kprof" in t] and any("layer_norm" in t for t in auto), auto
    assert {"kprof.layer_norm.default", "kprof.gelu.default"} <= set(explicit), explicit


# -- the eager entry: the operator without torch.ops' argument parsing -----------------------------------------------
def test_eager_calls_take_the_extension_entry_and_dynamo_traces_it_as_the_operator() -> None:
    from kprof_callbacks.kernels import layernorm

    entry = layernorm.LIBRARY.layer_norm
    assert not isinstance(entry, torch._ops.OpOverload), "the eager entry is the extension's, not the OpOverload"
    x, w, b = torch.randn(5, 7, requires_grad=True), torch.randn(7, requires_grad=True), torch.randn(7)
    got, want = entry(x, (7,), w, b, 1e-5), torch.ops.kprof.layer_norm.default(x, (7,), w, b, 1e-5)
    assert torch.equal(got, want) and got.grad_fn is not None
    (gx, gw), (wx, ww) = torch.autograd.grad(got.sum(), (x, w)), torch.autograd.grad(want.sum(), (x, w))
    assert torch.equal(gx, wx) and torch.equal(gw, ww)
    assert "kprof.layer_norm.default" in graph_targets(lambda t: entry(t, (7,), w, b, 1e-5), x.detach())


class Logged(torch.Tensor):
    """A Tensor subclass that records every function called on it through __torch_function__."""

    calls: list = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.calls.append(func)
        return super().__torch_function__(func, types, args, kwargs or {})


def test_the_eager_entry_hands_what_it_does_not_take_to_the_operator() -> None:
    """Tensor subclasses, __torch_function__ modes, keywords and a wrong number of arguments go to the OpOverload:
    the same results, overrides and errors as torch.ops."""
    gelu, layernorm = (importlib.import_module(f"kprof_callbacks.kernels.{m}") for m in ("gelu", "layernorm"))
    x, w = torch.randn(3, 4), torch.randn(4)
    Logged.calls.clear()
    kernels.gelu(x.as_subclass(Logged))
    assert torch.ops.kprof.gelu.default in Logged.calls

    class Mode(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            Logged.calls.append(func)
            return func(*args, **(kwargs or {}))

    Logged.calls.clear()
    with Mode():
        kernels.layer_norm(x, 4, w)
    assert torch.ops.kprof.layer_norm.default in Logged.calls
    torch.testing.assert_close(
        layernorm.LIBRARY.layer_norm(x, (4,), w, None, eps=1e-3), F.layer_norm(x, (4,), w, eps=1e-3)
    )
    torch.testing.assert_close(gelu.LIBRARY.gelu(x), F.gelu(x))  # the OpOverload applies the schema's default
    with pytest.raises(ValueError, match="kprof layer_norm"):
        layernorm.LIBRARY.layer_norm(x, (5,), w, None, 1e-5)


FRESH_COMPILE = """
import torch
from kprof_callbacks import kernels
assert not hasattr(torch.ops.kprof, "gelu")  # nothing loaded yet: the first call is inside the compiled function
f = torch.compile(lambda x: kernels.gelu(x, impl="cpp") * 2, backend="aot_eager", fullgraph=True)
x = torch.randn(5)
torch.testing.assert_close(f(x), torch.nn.functional.gelu(x) * 2)
print("ok")
"""


def test_first_call_inside_compile_loads_the_library_at_trace_time() -> None:
    """In a fresh process the library is loaded while Dynamo traces (OpLibrary.ensure), not traced into."""
    result = subprocess.run([sys.executable, "-c", FRESH_COMPILE], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_calls_never_consult_the_build_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once loaded, layers, functional forms and their backwards run without the build cache (no stat, no hash)."""

    def no_build(*args, **kwargs):
        raise AssertionError("the build cache was consulted after the libraries were loaded")

    for name in ("load", "load_inline", "_cached"):
        monkeypatch.setattr(_build, name, no_build)
    x, w = torch.randn(3, 8, requires_grad=True), torch.randn(8, requires_grad=True)
    layers = [kernels.GELU(), kernels.LayerNorm(8), kernels.RMSNorm(8), kernels.Square(), kernels.BiasGELU(8)]
    out = sum(layer(x).sum() for layer in layers) + kernels.swiglu(x, x).sum() + kernels.add(x, x).sum()
    (out + kernels.layer_norm(x, 8, w).sum()).backward()
    assert x.grad is not None and w.grad is not None


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA")
def test_cuda_autocast_runs_norms_like_torch() -> None:
    """CUDA autocast gives torch's layer_norm (and from torch 2.12 rms_norm) the fp32 policy: float32 out of
    bfloat16 in, which the layers must mirror (the parametrized test above checks every layer's dtype)."""
    x = torch.randn(4, 24, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(24, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert kernels.layer_norm(x, 24, w).dtype == F.layer_norm(x, (24,), w).dtype == torch.float32
        assert kernels.rms_norm(x, 24, w).dtype == F.rms_norm(x, (24,), w).dtype
