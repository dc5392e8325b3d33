"""What the kernel tests share: the devices to run on, NaN-poisoned output allocation, float64 references, and bad
calls made in a child process."""

from __future__ import annotations

import contextlib
import subprocess
import sys
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
    result = subprocess.run([sys.executable, "-X", "faulthandler", "-c", _CHILD + setup + _CHILD_CALLS, device,
                             ",".join(libraries)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.splitlines()


def assert_errors(lines: list[str], expected: list[tuple[str, str]]) -> None:
    """Each line is the exception type expected with a message containing the text expected."""
    assert len(lines) == len(expected), lines
    for line, (error, text) in zip(lines, expected, strict=True):
        assert line.startswith(f"{error} |") and text in line, (line, error, text)
