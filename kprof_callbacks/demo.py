"""``kprof demo``: train a small model under ``kprof.session`` and show where the time went.

The toy model is a stack of pre-norm MLP blocks (LayerNorm -> Linear -> GELU -> Linear) on a synthetic
classification task, so it trains for real in seconds on a CPU and has layers ``kprof.swap`` can replace.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn


class Block(nn.Module):
    """Pre-norm residual MLP block."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.act = nn.GELU()
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.act(self.up(self.norm(x))))


class ToyModel(nn.Module):
    """A few residual MLP blocks and a classifier head."""

    def __init__(self, features: int = 64, width: int = 128, depth: int = 4, classes: int = 10) -> None:
        super().__init__()
        self.inp = nn.Linear(features, width)
        self.blocks = nn.Sequential(*[Block(width) for _ in range(depth)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.blocks(self.inp(x))))


def synthetic_batches(
    steps: int, batch: int = 64, features: int = 64, classes: int = 10, device: str = "cpu", seed: int = 0
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """A learnable task: labels come from a fixed random linear teacher, so the loss really goes down."""
    gen = torch.Generator().manual_seed(seed)
    teacher = torch.randn(features, classes, generator=gen)
    for _ in range(steps):
        x = torch.randn(batch, features, generator=gen)
        yield x.to(device), (x @ teacher).argmax(dim=1).to(device)


SCHEDULE = dict(wait=5, warmup=2, active=5, repeat=2)  # KPROF_<NAME> variables override it, as in any session


def run_cli(logdir: str, steps: int, device: str | None) -> int:
    """``kprof demo``: ``run_demo``, with bad input said in one line on stderr (exit status 2)."""
    try:
        run_demo(logdir, steps, device)
    except ValueError as exc:
        print(f"kprof demo: {exc}", file=sys.stderr)
        return 2
    return 0


def run_demo(logdir: str = "log", steps: int = 60, device: str | None = None) -> Path:
    """Train ``ToyModel`` for ``steps`` steps under a profiling session; print the summary; return the run dir.

    Too few steps for a profiling window, or profiling switched off (``KPROF=0``), is a ValueError before training.
    """
    import kprof_callbacks as kprof
    from kprof_callbacks.shell import typed_command
    from kprof_callbacks.tensorboard.launch import open_hint

    run = "demo-" + time.strftime("%Y%m%d-%H%M%S")
    config = kprof.ProfileConfig.from_kwargs(logdir=logdir, run=run, record_shapes=True, **SCHEDULE)
    if not config.enabled:
        raise ValueError("profiling is switched off (KPROF=0), and the demo shows what profiling finds: unset KPROF")
    first_window_ends = config.skip_first + config.wait + config.warmup + config.active
    if steps < first_window_ends:
        raise ValueError(
            f"--steps must be at least {first_window_ends}, where the first profiling window ends (got {steps})"
        )
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = ToyModel().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    with kprof.Session(config, model=model) as s:  # model=: the summary says which of its modules took the time
        for x, y in synthetic_batches(steps, device=device):
            with s.region("forward"):
                loss = nn.functional.cross_entropy(model(x), y)
            with s.region("backward"):
                loss.backward()
            with s.region("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
            losses.append(loss.detach())
            s.step(samples=x.shape[0])
    first, last = losses[0].item(), torch.stack(losses[-10:]).mean().item()
    torch.save(model.state_dict(), s.run_dir / "model.pt")
    print(f"trained ToyModel for {steps} steps on {device}: loss {first:.3f} -> {last:.3f}")
    print(f"model weights: {s.run_dir / 'model.pt'}")
    print("traces:")
    for path in s.trace_files:
        print(f"  {path}")
    print()
    print(s.summary())
    print()
    print(open_hint(logdir))
    print(
        f"summary again:    {typed_command()} summary {shlex.quote(str(s.run_dir))}   (--html report.html: the same, "
        "with timelines)"
    )
    return s.run_dir
