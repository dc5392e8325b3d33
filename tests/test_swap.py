"""kprof.swap: a swapped model computes and trains like the torch model, keeps its state_dict, reports what
it swapped and skipped, honours inplace, and with fallback keeps torch layers whose kernels cannot build."""

from __future__ import annotations

import copy
import importlib
import logging
from pathlib import Path

import pytest
import torch
from torch import nn

import kprof_callbacks as kprof
from kprof_callbacks import kernels
from kprof_callbacks.kernels import KernelBuildError
from kprof_callbacks.swap import swap

HAS_CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="no CUDA")])]


def small_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32),
        nn.Linear(32, 32), nn.GELU(approximate="tanh"), nn.RMSNorm(32),
        nn.Linear(32, 1),
    )


@pytest.mark.parametrize("device", DEVICES)
def test_swapped_model_matches_outputs_and_gradients(device: str) -> None:
    model = small_model().to(device)
    fast = swap(model)
    assert [type(m).__name__ for m in fast] == [type(m).__name__ for m in model]  # same names, other classes
    assert isinstance(fast[1], kernels.GELU) and isinstance(fast[2], kernels.LayerNorm)
    assert isinstance(fast[5], kernels.RMSNorm) and fast[4].approximate == "tanh"
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
    model = nn.Sequential(nn.LayerNorm(8, elementwise_affine=False), MyGELU(), shared, nn.Linear(8, 8), shared,
                          nn.ReLU())
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


@pytest.fixture
def broken_toolchain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An empty extension cache and no C++ compiler: building the GELU kernels must fail."""
    gelu_module = importlib.import_module("kprof_callbacks.kernels.gelu")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    gelu_module._ext.cache_clear()
    yield
    gelu_module._ext.cache_clear()


def test_build_failure_surfaces_at_swap_time(broken_toolchain) -> None:
    with pytest.raises(KernelBuildError, match="no C\\+\\+ compiler"):
        swap(nn.Sequential(nn.Linear(4, 4), nn.GELU()), {nn.GELU: kernels.GELU})


def test_fallback_keeps_torch_layers_with_a_warning(broken_toolchain) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.GELU())
    with pytest.warns(UserWarning, match="keeping nn.GELU at 1"):
        fast = swap(model, {nn.GELU: kernels.GELU}, fallback=True)
    assert type(fast[1]) is nn.GELU
    (entry,) = fast.kprof_swap_report.skipped
    assert "kernel build failed" in entry.reason
    x = torch.randn(3, 4)
    torch.testing.assert_close(fast(x), model(x))


def test_swapped_layers_are_labelled_in_profiler_traces() -> None:
    fast = swap(small_model())
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fast(torch.randn(4, 16))
    names = {e.name for e in prof.events()}
    assert "kprof::gelu" in names
