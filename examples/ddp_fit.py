"""Profile data-parallel training on every visible GPU (or 2 CPU processes): Lightning DDP + ProfilerCallback.

Every rank profiles the same batches (the schedule counts batches, which DDP keeps in lockstep) and writes its
own trace, named ``rank<R>_<host>_<pid>``, into one run folder; only rank 0 prints the summary, whose ranks table
shows compute vs communication per rank, how much of the all-reduce overlaps the backward pass, and the
straggler.

    python examples/ddp_fit.py                       # all GPUs (NCCL), or 2 CPU processes (gloo)
    kprof summary lightning_logs/version_0/kprof/train
    tensorboard --logdir lightning_logs               # PyTorch Profiler tab -> Distributed view

On a host whose GPUs share NVLink, keep NVLink multicast off if your cluster asks for it:
``NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 python examples/ddp_fit.py``.
"""

from __future__ import annotations

import argparse

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kprof_callbacks as kprof


class Regressor(L.LightningModule):
    """An MLP big enough that its gradient all-reduce is visible next to the compute."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            *[m for _ in range(4) for m in (nn.Linear(width, width), nn.GELU())], nn.Linear(width, 1)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x).squeeze(1), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=".", help="Trainer default_root_dir")
    parser.add_argument("--width", type=int, default=None, help="MLP width (default: 2048 on GPU, 128 on CPU)")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    gpu = torch.cuda.is_available()
    width = args.width or (2048 if gpu else 128)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64 * args.steps * max(torch.cuda.device_count(), 2), width, generator=gen)
    data = TensorDataset(x, x.sum(1) / width**0.5)
    trainer = L.Trainer(
        default_root_dir=args.root,
        accelerator="gpu" if gpu else "cpu",
        devices=-1 if gpu else 2,
        strategy="ddp",
        max_steps=args.steps,
        enable_progress_bar=False,
        enable_checkpointing=False,
        callbacks=[kprof.ProfilerCallback(wait=5, warmup=2, active=5)],
    )
    trainer.fit(Regressor(width), DataLoader(data, batch_size=64))


if __name__ == "__main__":
    main()
