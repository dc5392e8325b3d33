"""What the kernel tests share: the devices to run on, NaN-poisoned output allocation, float64 references."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="no CUDA")])]


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
