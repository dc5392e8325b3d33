"""Swap a model's GELU / LayerNorm / RMSNorm for kprof's kernel layers and measure both, side by side.

A small next-token model (embedding, pre-norm MLP blocks, RMSNorm, head) trains on random tokens; ``kprof.swap``
makes a copy whose norm and activation layers run kprof's kernels, and ``kprof.compare`` checks the two agree
(outputs, loss, every gradient) before timing them interleaved on the same batches.

    python examples/compare_layers.py                           # cuda when available, else cpu
    python examples/compare_layers.py --width 1024 --batch 32 --logdir log/compare_layers
    tensorboard --logdir log/compare_layers                     # Profiler tab: each variant; Diff view: both
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import kprof_callbacks as kprof
from kprof_callbacks.demo import Block  # pre-norm residual MLP: LayerNorm -> Linear -> GELU -> Linear


class TinyLM(nn.Module):
    """Embedding, pre-norm MLP blocks, RMSNorm and a head: every norm and activation is one swap can replace."""

    def __init__(self, vocab: int, width: int, depth: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.Sequential(*[Block(width) for _ in range(depth)])
        self.norm = nn.RMSNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.blocks(self.embed(tokens))))


def next_token_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The compare contract: forward and loss; compare does backward and the optimizer step."""
    inputs, targets = batch
    logits = model(inputs)
    return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per variant (default: 30)")
    parser.add_argument("--logdir", default=None, help="also profile each variant into LOGDIR/<variant>/")
    args = parser.parse_args()

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = TinyLM(args.vocab, args.width, args.depth).to(device)
    gen = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(8):
        tokens = torch.randint(args.vocab, (args.batch, args.seq + 1), generator=gen).to(device)
        batches.append((tokens[:, :-1], tokens[:, 1:]))

    swapped = kprof.swap(model)
    print(swapped.kprof_swap_report)
    print()
    result = kprof.compare(
        {"torch": model, "kernels": swapped},
        next_token_loss,
        batches,
        steps=args.steps,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
        logdir=args.logdir,
    )
    print(result)


if __name__ == "__main__":
    main()
