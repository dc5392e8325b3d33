"""Swap a GPT's LayerNorm and GELU for kprof's operators, check torch.compile sees no graph break, and time both.

The GPT is kprof_callbacks.models' nanoGPT-style model (GPT-2 small on a GPU, the tiny config on a CPU). The step
runs in bf16 autocast, where the kprof layers return the dtypes torch's layers return.

    python examples/gpt_swap.py                    # cuda when available, else cpu
    python examples/gpt_swap.py --compile          # both variants under torch.compile
    python examples/gpt_swap.py --impl torch       # the kprof layers running torch's own ops (the model vs itself)
"""

from __future__ import annotations

import argparse

import torch

import kprof_callbacks as kprof
from kprof_callbacks import models


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--impl", default=None, choices=("cuda", "cpp", "torch"), help="default: by device")
    parser.add_argument("--compile", action="store_true", help="time torch.compile'd variants")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()

    cfg, batch = (models.gpt2_small(), 8) if args.device == "cuda" else (models.tiny(), 4)
    torch.manual_seed(0)
    model = models.GPT(cfg).to(args.device)
    fast = kprof.swap(model, impl=args.impl)  # a copy; builds (or loads) the operators it uses before returning
    print(fast.kprof_swap_report)

    batches = models.random_batches(cfg, 4, batch, args.device)
    explained = torch._dynamo.explain(fast)(*batches[0])
    print(
        f"torch.compile of the swapped GPT: {explained.graph_count} graph(s), {explained.graph_break_count} "
        "graph break(s)"
    )

    def bf16_step(m: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        with torch.autocast(args.device, dtype=torch.bfloat16):
            return m(*batch)

    variants = {"torch": model, "kprof": fast}
    if args.compile:
        variants = {name: torch.compile(m) for name, m in variants.items()}
    result = kprof.compare(
        variants,
        bf16_step,
        batches,
        steps=args.steps,
        warmup=3,
        optimizer=lambda params: torch.optim.AdamW(params, lr=3e-4),
        check=False,
    )
    print(result)


if __name__ == "__main__":
    main()
