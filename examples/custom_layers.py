"""Swap kprof's kernel layers into a model, check it still computes the same thing, and see what changed.

    python examples/custom_layers.py [--device cpu|cuda]

The first run builds the kernels (a progress line says so); later runs load them from the cache.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from kprof_callbacks import kernels
from kprof_callbacks.swap import swap


def mlp_block(width: int) -> nn.Module:
    """A transformer-style MLP stack: the layer types kprof.swap knows, plus one it leaves alone."""
    return nn.Sequential(
        nn.LayerNorm(width),
        nn.Linear(width, 4 * width),
        nn.GELU(approximate="tanh"),
        nn.Linear(4 * width, width),
        nn.RMSNorm(width),
        nn.Linear(width, width),
        nn.GELU(),
        nn.LayerNorm(width, elementwise_affine=False),  # not supported by the kernels: stays torch's
    )


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = mlp_block(256).to(args.device)
    fast = swap(model)  # a copy; builds (or loads) every kernel it uses before returning
    print(fast.kprof_swap_report)

    x = torch.randn(64, 256, device=args.device)
    out, ref = fast(x), model(x)
    out.square().mean().backward()
    ref.square().mean().backward()
    worst_grad = max(max_diff(p.grad, q.grad) for p, q in zip(fast.parameters(), model.parameters(), strict=True))
    print(f"outputs differ by at most {max_diff(out, ref):.2e}, parameter gradients by {worst_grad:.2e}")
    assert list(fast.state_dict()) == list(model.state_dict()), "swap must keep state_dict keys"

    # Linear + GELU as one matmul and one fused bias + GELU kernel, sharing the Linear's parameters.
    fused = kernels.LinearGELU.from_module(model[1], model[2])
    print(f"{fused}: differs from Linear + GELU by {max_diff(fused(x), model[2](model[1](x))):.2e}")

    # The same layer with each implementation, for side-by-side timing (see benchmarks/kernels.py).
    for impl in ("cuda" if args.device == "cuda" else "cpp", "torch"):
        layer = kernels.GELU(impl=impl)
        print(f"{layer}: {max_diff(layer(x), nn.functional.gelu(x)):.2e} from F.gelu")


if __name__ == "__main__":
    main()
