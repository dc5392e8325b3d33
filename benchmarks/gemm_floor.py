"""The floor under Linear+GELU: its GEMMs alone, against eager Linear+GELU and kprof's bias+GELU after the GEMM.

Forward + backward of ``gelu(x @ w.T + b)`` runs three GEMMs (``x @ w.T``, ``dy @ w``, ``dy.T @ x``) plus elementwise
work (bias + GELU, GELU's backward, the bias gradient's column sum). No fusion of that work can beat the GEMMs alone,
so the table says how much of a Linear+GELU speedup is left to win at all. Shape and dtype: ``kprof bench``'s
linear row (rows x in x out). CUDA events, median of ``--iters`` calls after 10 warm-ups.

    python benchmarks/gemm_floor.py [--device cuda|cpu] [--quick]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import kprof_callbacks as kprof
from kprof_callbacks import kernels
from kprof_callbacks.bench import ops as bench_ops


def eager(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(F.linear(x, w, b))


def fused(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return kernels.bias_gelu(F.linear(x, w), b)


def variants(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, dy: torch.Tensor) -> dict:
    """name -> (forward only, forward + backward) callables."""
    leaves = [t.detach().requires_grad_() for t in (x, w, b)]

    def with_backward(fn):
        return lambda: torch.autograd.grad(fn(*leaves), leaves, dy)

    return {
        "GEMMs alone": (lambda: x @ w.t(), lambda: (x @ w.t(), dy @ w, dy.t() @ x)),
        "eager Linear+GELU": (lambda: eager(x, w, b), with_backward(eager)),
        "kprof bias_gelu after the GEMM": (lambda: fused(x, w, b), with_backward(fused)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="a tiny float32 shape, 3 calls (a smoke test)")
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args(argv)
    sizes = bench_ops.QUICK_SIZES if args.quick else bench_ops.FULL_SIZES
    dtype, (rows, k, n) = sizes["linear"][-1]
    iters = 3 if args.quick else args.iters
    linear = next(op for op in bench_ops.OPS if op.name == "linear_gelu")
    x, w, b = linear.make((rows, k, n), dtype, args.device)
    dy = torch.randn(rows, n, dtype=dtype, device=args.device)
    times = {
        name: [
            kprof.time_cuda(fn, warmup=1 if args.quick else 10, iters=iters, device=args.device).median_ms
            for fn in pair
        ]
        for name, pair in variants(x, w, b, dy).items()
    }
    floor = times["GEMMs alone"][1]
    print(f"{rows} x {k} x {n} {str(dtype).removeprefix('torch.')} on {args.device}, median of {iters} calls")
    print("| | fwd ms | fwd+bwd ms | fwd+bwd / GEMMs alone |\n|---|---:|---:|---:|")
    for name, (forward, forward_backward) in times.items():
        print(f"| {name} | {forward:.4f} | {forward_backward:.4f} | {forward_backward / floor:.3f} |")
    print(f"GEMMs alone, forward + backward: {3 * 2 * rows * k * n / floor / 1e9:.1f} TFLOP/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
