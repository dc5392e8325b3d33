"""kprof.swap: a swapped model computes and trains like the torch model, keeps its state_dict, reports what
it swapped and skipped, honours inplace and impl, and with fallback keeps torch layers whose kernels cannot build.
On the GPT of kprof_callbacks.models: under torch.compile (no graph break, fullgraph) and bf16 autocast. The Triton
twins (impl="triton") run in Triton's interpreter without a GPU (tests/conftest.py)."""

from __future__ import annotations

import copy
import importlib
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import kprof_callbacks as kprof
from kprof_callbacks import kernels, models
from kprof_callbacks.swap import swap

from kernel_checks import DEVICES, HAS_CUDA, TRITON_DEVICE, graph_targets


def small_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(16, 32),
        nn.GELU(),
        nn.LayerNorm(32),
        nn.Linear(32, 32),
        nn.GELU(approximate="tanh"),
        nn.RMSNorm(32),
        nn.Linear(32, 1),
    )


@pytest.mark.parametrize("impl", [None, "triton"], ids=["auto", "triton"])
@pytest.mark.parametrize("device", DEVICES)
def test_swapped_model_matches_outputs_and_gradients(device: str, impl: str | None) -> None:
    if impl == "triton" and device == "cpu" and HAS_CUDA:
        pytest.skip("with a GPU the Triton kernels are compiled for it: CPU tensors need the interpreter")
    model = small_model().to(device)
    fast = swap(model, impl=impl)
    assert [type(m).__name__ for m in fast] == [type(m).__name__ for m in model]  # same names, other classes
    assert isinstance(fast[1], kernels.GELU) and isinstance(fast[2], kernels.LayerNorm)
    assert isinstance(fast[5], kernels.RMSNorm) and fast[4].approximate == "tanh"
    assert fast[1].impl == fast[2].impl == fast[5].impl == impl
    assert list(fast.state_dict()) == list(model.state_dict())
    x = torch.randn(64, 16, device=device)
    out, want = fast(x), model(x)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    out.square().mean().backward()
    want.square().mean().backward()
    for (name, p), q in zip(fast.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_swapped_model_trains() -> None:
    torch.manual_seed(0)
    model = swap(small_model())
    x = torch.randn(256, 16)
    y = torch.sin(x[:, :1] * 2) + x[:, 1:2] * x[:, 2:3]
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(60):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_copy_by_default_and_inplace_on_request() -> None:
    model = small_model()
    before = copy.deepcopy(model.state_dict())
    fast = swap(model)
    assert fast is not model and type(model[1]) is nn.GELU and type(model[2]) is nn.LayerNorm
    assert fast[0].weight is not model[0].weight  # a copy: training one leaves the other alone
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key])
    same = swap(model, inplace=True)
    assert same is model and isinstance(model[1], kernels.GELU)


def test_report_lists_swaps_and_reasons_for_skips(caplog: pytest.LogCaptureFixture) -> None:
    class MyGELU(nn.GELU):
        pass

    shared = nn.GELU()
    model = nn.Sequential(
        nn.LayerNorm(8, elementwise_affine=False), MyGELU(), shared, nn.Linear(8, 8), shared, nn.ReLU()
    )
    with caplog.at_level(logging.INFO, logger="kprof_callbacks.swap"):
        fast = swap(model, {nn.GELU: kernels.GELU, nn.LayerNorm: "LayerNorm", nn.ReLU: "NoSuchLayer"})
    report = fast.kprof_swap_report
    assert [(e.name, e.source, e.target) for e in report.swapped] == [("2", "nn.GELU", "kernels.GELU")]
    assert fast[2] is fast[4]  # a module used twice stays one module
    reasons = {e.name: e.reason for e in report.skipped}
    assert "elementwise_affine=False" in reasons["0"]
    assert "subclass of nn.GELU" in reasons["1"]
    assert "NoSuchLayer is not available" in reasons["5"]
    assert "elementwise_affine=False" in caplog.text and "skipped" in str(report)


def test_public_name_is_the_function() -> None:
    """``kprof.swap`` stays the function after its module (also named swap) has been imported."""
    importlib.import_module("kprof_callbacks.swap")
    assert kprof.swap is swap


def test_root_module_is_swapped_too() -> None:
    fast = swap(nn.GELU(approximate="tanh"))
    assert isinstance(fast, kernels.GELU) and fast.approximate == "tanh"


def test_bad_arguments_are_type_errors() -> None:
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        swap("model")
    with pytest.raises(TypeError, match="mapping must be a dict"):
        swap(nn.GELU(), [nn.GELU])
    with pytest.raises(TypeError, match="keys must be nn.Module subclasses"):
        swap(nn.GELU(), {"GELU": kernels.GELU})
    with pytest.raises(TypeError, match="must be a class with from_module"):
        swap(nn.GELU(), {nn.GELU: 3})


BROKEN_BUILD = """
import warnings, torch
from torch import nn
import kprof_callbacks as kprof
from kprof_callbacks import kernels
model = nn.Sequential(nn.Linear(4, 4), nn.GELU())
try:
    kprof.swap(model, {nn.GELU: kernels.GELU})
    print("swap: no error")
except kernels.KernelBuildError as exc:
    print("swap:", type(exc).__name__, str(exc).splitlines()[0])
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    fast = kprof.swap(model, {nn.GELU: kernels.GELU}, fallback=True)
print("fallback:", type(fast[1]).__name__, "|", fast.kprof_swap_report.skipped[0].reason.splitlines()[0])
print("warning:", [str(w.message).splitlines()[0] for w in caught])
x = torch.randn(3, 4)
print("same output:", torch.equal(fast(x), model(x)))
"""


def test_build_failure_surfaces_at_swap_time_and_fallback_keeps_torch_layers(tmp_path: Path) -> None:
    """In a fresh process (one whose operators are not registered yet) with an empty cache and no C++ compiler:
    swap raises KernelBuildError; with fallback=True it keeps nn.GELU, warns and the model still runs."""
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path), "CXX": str(tmp_path / "no-such-compiler")}
    result = subprocess.run([sys.executable, "-c", BROKEN_BUILD], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    assert lines["swap"].startswith("KernelBuildError") and "no C++ compiler" in lines["swap"]
    assert lines["fallback"].startswith("GELU |") and "kernel build failed" in lines["fallback"]
    assert "keeping nn.GELU at 1" in lines["warning"]
    assert lines["same output"] == "True"


def test_impl_reaches_every_swapped_layer() -> None:
    model = small_model()
    reference = swap(model, impl="torch")
    assert [m.impl for m in reference if isinstance(m, kernels.GELU | kernels.LayerNorm | kernels.RMSNorm)] == [
        "torch"
    ] * 4
    assert "impl=torch" in repr(reference[2])
    x = torch.randn(16, 16)
    torch.testing.assert_close(reference(x), model(x))  # PyTorch's own ops inside the kprof layers
    assert all(m.impl == "cpp" for m in swap(model, impl="cpp") if isinstance(m, kernels.GELU))
    with pytest.raises(ValueError, match="impl must be None or one of .*'cuda', 'cpp', 'triton', 'torch'.*got 'fast'"):
        swap(model, impl="fast")


def test_swapped_layers_are_named_in_profiler_traces() -> None:
    fast = swap(small_model())
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fast(torch.randn(4, 16))
    names = {e.name for e in prof.events()}
    assert {"kprof::gelu", "kprof::layer_norm", "kprof::rms_norm"} <= names


# -- the GPT: torch.compile and bf16 autocast ------------------------------------------------------------------------
def gpt_pair(device: str = "cpu", impl: str | None = None) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    model = models.GPT(models.tiny()).to(device)
    return model, swap(model, impl=impl)


# The compiled GPT tests run each kernel impl named (under torch.compile an automatic impl traces torch's math):
# the C++ kernels on the CPU, and the Triton twins where they run.
GPT_IMPLS = pytest.mark.parametrize(
    ("impl", "device"), [("cpp", "cpu"), ("triton", TRITON_DEVICE)], ids=["cpp", "triton"]
)


def grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad for name, p in model.named_parameters()}


@GPT_IMPLS
def test_swapped_gpt_has_no_graph_break(impl: str | None, device: str) -> None:
    model, fast = gpt_pair(device, impl)
    # ln_1, ln_2 per block, ln_f, one GELU per block, and the loss head (which has no Triton twin)
    assert len(fast.kprof_swap_report.swapped) == 2 * 2 + 1 + 2 + (impl != "triton")
    if impl == "triton":
        assert "has no Triton kernels" in fast.kprof_swap_report.skipped[0].reason
    idx, targets = models.random_batches(models.tiny(), 1, 2, device)[0]
    explained = torch._dynamo.explain(fast)(idx, targets)
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons


@GPT_IMPLS
def test_compiled_swapped_gpt_matches_eager_fullgraph(impl: str | None, device: str) -> None:
    """fullgraph=True (any break is an error); loss and every gradient equal eager's, through aot_eager."""
    _, fast = gpt_pair(device, impl)
    idx, targets = models.random_batches(models.tiny(), 1, 3, device)[0]
    eager_loss = fast(idx, targets)
    eager_loss.backward()
    eager = {k: v.clone() for k, v in grads(fast).items()}
    fast.zero_grad()
    loss = torch.compile(fast, backend="aot_eager", fullgraph=True)(idx, targets)
    loss.backward()
    torch.testing.assert_close(loss, eager_loss)
    for name, grad in grads(fast).items():
        torch.testing.assert_close(grad, eager[name], rtol=1e-5, atol=1e-6, msg=name)


@GPT_IMPLS
def test_inductor_compiles_the_swapped_gpt(impl: str | None, device: str) -> None:
    """The custom operators are extern calls between inductor's generated kernels (on a GPU, inductor launches the
    Triton twins' kernels itself); results match eager."""
    _, fast = gpt_pair(device, impl)
    idx, targets = models.random_batches(models.tiny(), 1, 2, device)[0]
    torch._dynamo.reset()
    loss = torch.compile(fast, fullgraph=True)(idx, targets)
    torch.testing.assert_close(loss, fast(idx, targets), rtol=1e-4, atol=1e-5)


def test_compiled_swapped_gpt_with_automatic_layers_is_the_torch_models_graph() -> None:
    """kprof.swap(model) compiled gives inductor the graph of the torch model compiled (the layers trace their
    reference math, which inductor fuses with its neighbours), so compiling a swapped model never costs speed; the
    one exception is the loss head, whose fused operator replaces the logits and torch's cross-entropy (inductor
    cannot compute the loss without holding the logits)."""
    model, fast = gpt_pair()
    idx, targets = models.random_batches(models.tiny(), 1, 2)[0]

    torch_graph, swapped_graph = graph_targets(model, idx, targets), graph_targets(fast, idx, targets)
    assert swapped_graph[:-1] == torch_graph[:-2] and not [t for t in swapped_graph[:-1] if "kprof" in t]
    assert swapped_graph[-1] == "kprof.linear_cross_entropy.default"
    assert [t.split(" at ")[0] for t in torch_graph[-2:]] == ["<built-in function linear>", "<function cross_entropy"]
    unswapped = swap(model, {nn.LayerNorm: "LayerNorm", nn.GELU: "GELU"})
    assert graph_targets(unswapped, idx, targets) == torch_graph


@pytest.mark.parametrize(
    ("impl", "device"),
    [(None, "cpu"), pytest.param(None, "cuda", marks=DEVICES[1].marks), ("triton", TRITON_DEVICE)],
    ids=["auto-cpu", "auto-cuda", "triton"],
)
def test_swapped_gpt_matches_torch_under_bf16_autocast(impl: str | None, device: str) -> None:
    """A bf16 autocast training step: the swapped model's loss and gradients equal the torch model's to bf16 noise,
    eager and compiled, and the kprof layers return the dtypes torch's layers return."""
    model, fast = gpt_pair(device, impl)
    idx, targets = models.random_batches(models.tiny(), 1, 4, device)[0]
    dtypes: dict[str, dict[str, torch.dtype]] = {"torch": {}, "kprof": {}}

    def record(name: str, layer: str):
        def hook(module: nn.Module, args: tuple, out: torch.Tensor) -> None:
            dtypes[name].setdefault(layer, out.dtype)

        return hook

    for name, m in (("torch", model), ("kprof", fast)):
        m.blocks[0].ln_1.register_forward_hook(record(name, "ln_1"))
        m.blocks[0].mlp.gelu.register_forward_hook(record(name, "gelu"))
    losses = {}
    for name, m in (("torch", model), ("kprof", fast), ("compiled", torch.compile(fast, backend="aot_eager"))):
        m.zero_grad()
        with torch.autocast(device, dtype=torch.bfloat16):
            losses[name] = m(idx, targets)
        losses[name].backward()
        if name == "kprof":
            kprof_grads = {k: v.clone() for k, v in grads(fast).items()}
    assert dtypes["kprof"] == dtypes["torch"] and len(dtypes["torch"]) == 2
    torch.testing.assert_close(losses["kprof"], losses["torch"], rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(losses["compiled"], losses["kprof"], rtol=2e-2, atol=2e-2)
    for name, grad in grads(model).items():
        scale = grad.abs().max().item()
        torch.testing.assert_close(kprof_grads[name], grad, rtol=5e-2, atol=5e-2 * scale, msg=name)


def test_gpt_swap_example_runs_and_reports_no_graph_break() -> None:
    example = Path(__file__).resolve().parents[1] / "examples" / "gpt_swap.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, str(example), "--device", "cpu", "--steps", "3"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "swapped ln_f: nn.LayerNorm -> kernels.LayerNorm" in result.stdout
    assert "1 graph(s), 0 graph break(s)" in result.stdout
    assert re.findall(r"^(torch|kprof) +\d+\.\d+ ", result.stdout, re.MULTILINE) == ["torch", "kprof"]  # timed rows
