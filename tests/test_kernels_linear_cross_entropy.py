"""The fused linear + cross-entropy against float64 PyTorch (``F.cross_entropy(F.linear(...))``) on the CPU (C++
kernels) and, where a GPU is present, on CUDA: loss, d hidden, d weight and d bias over every dtype and reduction,
label smoothing, softcap and ignored targets, on odd shapes, in chunks smaller than the batch, with NaN-poisoned
outputs and fresh random inputs; a tied output layer; the module and its checks."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kprof_callbacks as kprof
from kprof_callbacks import kernels, models

from kernel_checks import DEVICES, TOL, poisoned_outputs, rel_err

ops = torch.ops.kprof
LCE = importlib.import_module("kprof_callbacks.kernels.linear_cross_entropy")


@pytest.fixture(scope="module", autouse=True)
def library() -> None:
    LCE.LIBRARY.load()


def dtypes(device: str) -> list[torch.dtype]:
    return [torch.float32, torch.bfloat16, torch.float16] + ([torch.float64] if device == "cpu" else [])


def inputs(rows: int, width: int, vocab: int, dtype: torch.dtype, device: str, bias: bool = True):
    """hidden [rows, width], weight [vocab, width] scaled so logits spread over a few units, bias, and targets with
    every fifth one from the third ignored."""
    hidden = torch.randn(rows, width, device=device).to(dtype)
    weight = (torch.randn(vocab, width, device=device) * 2 / width**0.5).to(dtype)
    b = torch.randn(vocab, device=device).to(dtype) if bias else None
    target = torch.randint(vocab, (rows,), device=device)
    target[2::5] = -100
    return hidden, weight, b, target


def float64_reference(hidden, weight, bias, target, grad, **loss):
    """(loss, [d hidden, d weight, d bias]) in float64 on the CPU, from the logits rounded to the input dtype as the
    kernels see them (the product's output dtype) and upcast, like ``F.cross_entropy(logits.float())``."""
    leaves = [t.detach().cpu().double().requires_grad_() for t in (hidden, weight, bias) if t is not None]
    logits = F.linear(*leaves)
    if hidden.dtype != torch.float64:  # the product's output rounding, kept out of the gradient
        logits = logits + (F.linear(hidden, weight, bias).cpu().double() - logits).detach()
    cap = loss.pop("softcap", None)
    if cap is not None:
        logits = cap * torch.tanh(logits / cap)
    out = F.cross_entropy(logits, target.cpu(), **loss)
    return out.detach(), torch.autograd.grad(out, leaves, grad.cpu().double())


# Relative error allowed per dtype: the gradients pass through bf16/fp16 d logits (rounded once) and a product.
GRAD_TOL = {**TOL, torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 1e-4}

CASES = [
    dict(reduction="mean"),
    dict(reduction="sum", label_smoothing=0.1),
    dict(reduction="none"),
    dict(reduction="mean", softcap=3.0),
    dict(reduction="none", label_smoothing=0.2, softcap=5.0, ignore_index=7),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize(("rows", "width", "vocab"), [(37, 24, 1009), (1, 8, 3), (130, 16, 4099)], ids=str)
def test_loss_and_gradients_match_float64(device: str, case: dict, rows: int, width: int, vocab: int) -> None:
    for dtype in dtypes(device):
        hidden, weight, bias, target = inputs(rows, width, vocab, dtype, device)
        if "ignore_index" in case:
            target[target == -100] = case["ignore_index"]
        leaves = [t.requires_grad_() for t in (hidden, weight, bias)]
        with poisoned_outputs():
            loss = kernels.linear_cross_entropy(hidden, weight, target, bias, **case)
            grad = torch.randn_like(loss)
            got = torch.autograd.grad(loss, leaves, grad)
        want_loss, want = float64_reference(hidden, weight, bias, target, grad, **case)
        assert loss.dtype == torch.float64 if dtype == torch.float64 else torch.float32
        assert loss.shape == want_loss.shape
        assert rel_err(loss.cpu(), want_loss) < TOL[dtype] * 10, dtype
        for name, g, w in zip(("hidden", "weight", "bias"), got, want, strict=True):
            assert g.dtype == dtype and g.shape == w.shape
            assert rel_err(g.cpu(), w) < GRAD_TOL[dtype], (dtype, name, rel_err(g.cpu(), w))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_chunks_smaller_than_the_batch_give_the_same_result(device: str, reduction: str) -> None:
    """The operators with 3-row chunks (the automatic size covers these shapes in one): the gradients computed in the
    forward ("mean"/"sum") and the recomputed ones ("none") accumulate d weight and d bias over chunks, including a
    short last one, and fill d hidden chunk by chunk."""
    for dtype in dtypes(device):
        hidden, weight, bias, target = inputs(11, 12, 301, dtype, device)
        mask = [True, True, True]
        with poisoned_outputs():
            if reduction == "none":
                loss = ops.linear_cross_entropy_fwd(
                    hidden, weight, target, bias, -100, "none", 0.1, None, [False] * 3, 3
                )[0]
                grad = torch.randn_like(loss)
                got = ops.linear_cross_entropy_backward(
                    grad, hidden, weight, target, bias, -100, "none", 0.1, None, mask, 3
                )
            else:
                loss, *got = ops.linear_cross_entropy_fwd(
                    hidden, weight, target, bias, -100, reduction, 0.1, None, mask, 3
                )
                grad = torch.ones_like(loss)
        want_loss, want = float64_reference(
            hidden, weight, bias, target, grad, reduction=reduction, label_smoothing=0.1
        )
        assert rel_err(loss.cpu(), want_loss) < TOL[dtype] * 10
        for g, w in zip(got, want, strict=True):
            assert rel_err(g.cpu(), w) < GRAD_TOL[dtype], dtype


@pytest.mark.parametrize("device", DEVICES)
def test_all_targets_ignored_gives_torchs_loss_and_zero_gradients(device: str) -> None:
    """Mean over no tokens is NaN (0 / 0), as torch gives it; sum is 0, "none" zeros; every gradient is exactly 0."""
    hidden, weight, bias, target = inputs(6, 8, 50, torch.float32, device)
    target.fill_(-100)
    for reduction in ("mean", "sum", "none"):
        leaves = [t.detach().requires_grad_() for t in (hidden, weight, bias)]
        loss = kernels.linear_cross_entropy(*leaves[:2], target, leaves[2], reduction=reduction)
        want = F.cross_entropy(F.linear(hidden, weight, bias), target, reduction=reduction)
        torch.testing.assert_close(loss, want, equal_nan=True)
        loss.sum().backward()
        assert all(t.grad is not None and not t.grad.any() for t in leaves), reduction


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_only_for_what_requires_them(device: str) -> None:
    """A frozen weight (fine-tuning the trunk only) gets no gradient, and hidden's is still right; no grad mode
    computes the loss alone."""
    hidden, weight, _, target = inputs(9, 8, 77, torch.float32, device, bias=False)
    h = hidden.clone().requires_grad_()
    loss = kernels.linear_cross_entropy(h, weight, target)
    assert len(loss.grad_fn.next_functions) == 3 and loss.grad_fn.name() == "kprof::LinearCrossEntropyBackward"
    loss.backward()
    want = hidden.clone().requires_grad_()
    F.cross_entropy(F.linear(want, weight), target).backward()
    torch.testing.assert_close(h.grad, want.grad, rtol=1e-4, atol=1e-6)
    assert weight.grad is None
    with torch.no_grad():
        assert kernels.linear_cross_entropy(h, weight, target).grad_fn is None


def test_nan_logits_give_a_nan_loss_not_a_silent_number() -> None:
    hidden, weight, _, target = inputs(4, 8, 40, torch.float32, "cpu", bias=False)
    weight[3, 0] = float("nan")
    target[:] = 1
    assert kernels.linear_cross_entropy(hidden, weight, target, reduction="none").isnan().all()


def test_tied_output_layer_accumulates_into_the_embeddings_gradient() -> None:
    """kprof's GPT, whose lm_head shares the token embedding's weight, swapped: the fused loss's d weight and the
    embedding's own gradient add up in the one parameter, as torch's do."""
    torch.manual_seed(0)
    model = models.GPT(models.tiny()).double()
    fast = kprof.swap(model)
    assert isinstance(fast.lm_head, kernels.LinearCrossEntropy) and fast.lm_head.weight is fast.wte.weight
    idx, targets = models.random_batches(models.tiny(), 1, 3)[0]
    for m in (model, fast):
        m(idx, targets).backward()
    torch.testing.assert_close(fast.wte.weight.grad, model.wte.weight.grad, rtol=1e-9, atol=1e-12)
    assert model.lm_head(torch.zeros(1, 64, dtype=torch.float64)).shape == (1, 128)  # no targets: the logits


def test_module_from_a_linear_and_its_checks() -> None:
    linear = nn.Linear(8, 30, bias=True)
    layer = kernels.LinearCrossEntropy.from_module(linear, label_smoothing=0.1, reduction="sum")
    assert layer.weight is linear.weight and layer.bias is linear.bias
    assert list(layer.state_dict()) == list(linear.state_dict())
    assert "label_smoothing=0.1" in repr(layer) and "reduction='sum'" in repr(layer) and "impl=auto" in repr(layer)
    x, t = torch.randn(2, 5, 8), torch.randint(30, (2, 5))
    torch.testing.assert_close(layer(x), linear(x))
    want = F.cross_entropy(linear(x).flatten(0, 1), t.flatten(), label_smoothing=0.1, reduction="sum")
    torch.testing.assert_close(layer(x, t), want)
    with pytest.raises(TypeError, match="expected torch.nn.Linear"):
        kernels.LinearCrossEntropy.from_module(nn.GELU())
    with pytest.raises(TypeError, match="unknown loss option"):
        kernels.LinearCrossEntropy.from_module(linear, smoothing=0.1)
    with pytest.raises(ValueError, match="reduction must be one of"):
        kernels.LinearCrossEntropy(8, 30, reduction="avg")
    with pytest.raises(ValueError, match="softcap must be"):
        kernels.LinearCrossEntropy(8, 30, softcap=0)


BAD_CALLS = """
h, w, t = torch.randn(4, 8, device=device), torch.randn(10, 8, device=device), torch.randint(10, (4,), device=device)
f = ops.linear_cross_entropy
calls = [
    lambda: f(h, w, t, None, -100, "avg", 0.0, None),
    lambda: f(h, w[:, :7], t, None, -100, "mean", 0.0, None),
    lambda: f(h, w, t.int(), None, -100, "mean", 0.0, None),
    lambda: f(h, w, t[:3], None, -100, "mean", 0.0, None),
    lambda: f(h, w.double(), t, None, -100, "mean", 0.0, None),
    lambda: f(h, w, t, torch.randn(9, device=device), -100, "mean", 0.0, None),
    lambda: f(h, w, t, None, -100, "mean", 1.5, None),
    lambda: f(h, w, t, None, -100, "mean", 0.0, -1.0),
    lambda: f(h, w[:0], t, None, -100, "mean", 0.0, None),
]
"""


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs_are_clear_errors(device: str) -> None:
    from kernel_checks import assert_errors, errors_in_child

    lines = errors_in_child(BAD_CALLS, ("linear_cross_entropy",), device)
    assert_errors(
        lines,
        [
            ("ValueError", "reduction must be 'none', 'mean' or 'sum', got 'avg'"),
            ("ValueError", "weight has shape [10, 7], expected [10, 8]"),
            ("TypeError", "target is Int"),
            ("ValueError", "target has shape [3], expected hidden's leading dims [4]"),
            ("TypeError", "weight is Double"),
            ("ValueError", "bias has shape [9], expected [10]"),
            ("ValueError", "label_smoothing must be in [0, 1], got 1.5"),
            ("ValueError", "softcap must be > 0 or None, got -1"),
            ("ValueError", "weight has no rows"),
        ],
    )


def test_out_of_range_targets_are_an_index_error_on_the_cpu() -> None:
    hidden, weight, _, target = inputs(4, 8, 10, torch.float32, "cpu", bias=False)
    target[2] = 10
    with pytest.raises(IndexError, match="target 10 is out of range for 10 classes"):
        kernels.linear_cross_entropy(hidden, weight, target)


def test_double_backward_is_a_clear_error() -> None:
    hidden, weight, _, target = inputs(4, 8, 10, torch.float64, "cpu", bias=False)
    hidden.requires_grad_()
    for reduction in ("mean", "none"):
        loss = kernels.linear_cross_entropy(hidden, weight, target, reduction=reduction).sum()
        with pytest.raises(NotImplementedError, match="second derivative"):
            torch.autograd.grad(loss, hidden, create_graph=True)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_compiles_fullgraph_keeping_the_kernel_with_an_automatic_impl(backend: str, reduction: str) -> None:
    """torch.compile(fullgraph=True) traces the operator (no graph break) and keeps it even with impl=None, where the
    other layers hand inductor torch's math: loss and gradients equal eager's, for two batch sizes (dynamic)."""
    from kernel_checks import graph_targets

    weight = torch.randn(53, 16, requires_grad=True)

    def step(hidden: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return kernels.linear_cross_entropy(torch.tanh(hidden), weight, target, reduction=reduction).sum() * 2

    assert "kprof.linear_cross_entropy.default" in graph_targets(step, torch.randn(4, 16), torch.randint(53, (4,)))
    torch._dynamo.reset()
    compiled = torch.compile(step, backend=backend, fullgraph=True)
    for rows in (6, 9):
        hidden, target = torch.randn(rows, 16, requires_grad=True), torch.randint(53, (rows,))
        got, want = compiled(hidden, target), step(hidden, target)
        torch.testing.assert_close(got, want)
        for g, w in zip(torch.autograd.grad(got, [hidden, weight]), torch.autograd.grad(want, [hidden, weight])):
            torch.testing.assert_close(g, w)


def test_the_operators_below_autograd_refuse_gradients_and_name_the_public_one() -> None:
    hidden, weight, _, target = inputs(4, 8, 10, torch.float32, "cpu", bias=False)
    hidden.requires_grad_()
    with pytest.raises(RuntimeError, match="runs below the autograd of kprof::linear_cross_entropy, the layer's"):
        ops.linear_cross_entropy_fwd(hidden, weight, target, None, -100, "mean", 0.0, None, [True] * 3, 0)
    with pytest.raises(RuntimeError, match="kprof::linear_cross_entropy_backward has no autograd of its own"):
        ops.linear_cross_entropy_backward(torch.ones(()), hidden, weight, target, None, -100, "mean", 0.0, None,
                                          [True] * 3, 0)  # fmt: skip


def test_kprof_compare_runs_the_gpt_with_its_loss_head_swapped(capsys: pytest.CaptureFixture) -> None:
    """``kprof compare --model kprof_callbacks.models:compare_setup``: the GPT against kprof.swap (loss head included),
    checked against float64."""
    from kprof_callbacks.cli import main

    model, _, _ = models.compare_setup("cpu")
    assert isinstance(kprof.swap(model).lm_head, kernels.LinearCrossEntropy)
    assert main(["compare", "--model", "kprof_callbacks.models:compare_setup", "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "kprof.swap" in out and "FAILED" not in out


def test_a_hidden_size_of_zero_gives_the_bias_logits_loss() -> None:
    """hidden [rows, 0]: the logits are the bias alone, as F.linear gives them, and nothing divides by zero."""
    hidden, weight = torch.randn(3, 0, requires_grad=True), torch.randn(7, 0, requires_grad=True)
    bias, target = torch.randn(7, requires_grad=True), torch.tensor([1, 4, 6])
    got = kernels.linear_cross_entropy(hidden, weight, target, bias)
    want = F.cross_entropy(F.linear(hidden, weight, bias), target)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad(got, bias)[0], torch.autograd.grad(want, bias)[0])
