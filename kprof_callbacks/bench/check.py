"""``kprof bench --check``: every kernel (and Triton twin) forward and backward once on small odd shapes, against
float64."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

from .ops import Op, family

CHECK_SHAPES = {
    "elementwise": [(3, 1001), (1,)],
    "bias": [(3, 1001), (5, 64)],
    "linear": [(7, 24, 40)],
    "norm": [(3, 1001), (37, 520), (5, 64), (2, 8192)],
}
CHECK_DTYPES = [torch.float32, torch.bfloat16, torch.float16]
CPU_CHECK_DTYPES = {None: [torch.float32, torch.float64], "triton": [torch.float32]}  # Triton takes no float64
CHECK_TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 3e-3}


def check(ops: list[Op], device: str, triton: bool) -> bool:
    """Every kernel (and Triton twin when ``triton``) forward and backward once on small odd shapes, against float64;
    True when all pass."""
    ok = True
    for op in ops:
        for impl in op.impls(triton):
            kernel = functools.partial(op.kernel, impl=impl)
            for shape in CHECK_SHAPES[family(op)]:
                for dtype in CHECK_DTYPES if device == "cuda" else CPU_CHECK_DTYPES[impl]:
                    passed, error = _check_one(op, kernel, shape, dtype, device)
                    ok &= passed
                    name = op.name + (" (triton)" if impl else "")
                    print(
                        f"{'ok  ' if passed else 'FAIL'} {name:24s} {str(dtype):15s} {str(shape):15s} "
                        f"max rel err {error:.2e}",
                        flush=True,
                    )
    if device == "cuda":
        torch.cuda.synchronize()
    return ok


def _check_one(
    op: Op, kernel: Callable[..., torch.Tensor], shape: tuple[int, ...], dtype: torch.dtype, device: str
) -> tuple[bool, float]:
    """(passed, the largest relative error) of kernel's output and input gradients against float64."""
    inputs = [t.requires_grad_() for t in op.make(shape, dtype, device)]
    out = kernel(*inputs)
    dy = torch.randn_like(out)
    got = [out, *torch.autograd.grad(out, inputs, dy)]
    ref_inputs = [t.detach().double().requires_grad_() for t in inputs]
    ref_out = op.reference(*ref_inputs)
    want = [ref_out, *torch.autograd.grad(ref_out, ref_inputs, dy.double())]
    errors = [((g.double() - w).norm() / (w.norm() + 1e-6)).item() for g, w in zip(got, want, strict=True)]
    tol = CHECK_TOL.get(dtype, 1e-10) * (20 if op.name.startswith("linear") else 4)
    return all(math.isfinite(e) and e < tol for e in errors), max(errors)
