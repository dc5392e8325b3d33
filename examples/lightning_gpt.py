"""Swap kprof's kernel layers into a Lightning GPT and profile it, with two callbacks; MFU from the FLOPs per batch.

``kprof.SwapCallback`` replaces the GPT's LayerNorm and GELU layers with kprof's when the trainer sets the model up
(before the optimizer is built and before DDP wraps the model), and ``kprof.ProfilerCallback`` profiles the fit
and, given the FLOPs of a batch (6 x parameters x tokens for a transformer's forward and backward), logs achieved
TFLOP/s and MFU against the GPU's dense peak. bf16 mixed precision on a GPU (GPT-2 small, 124M parameters), fp32 on
a CPU (a tiny GPT, seconds).

    python examples/lightning_gpt.py                     # add --no-swap for the torch layers, to compare
    kprof summary lightning_logs/version_0/kprof/train   # where the time went, MFU, memory growth
"""

from __future__ import annotations

import argparse

import lightning as L
import torch

import kprof_callbacks as kprof
from kprof_callbacks import models


class GPTModule(L.LightningModule):
    def __init__(self, cfg: models.GPTConfig) -> None:
        super().__init__()
        self.model = models.GPT(cfg)

    def training_step(self, batch, batch_idx):
        loss = self.model(*batch)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=".", help="Trainer default_root_dir")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--no-swap", action="store_true", help="keep torch's LayerNorm and GELU")
    args = parser.parse_args()

    gpu = torch.cuda.is_available()
    cfg, batch = (models.gpt2_small(), 8) if gpu else (models.tiny(), 4)
    torch.manual_seed(0)
    module = GPTModule(cfg)
    params = sum(p.numel() for p in module.parameters())
    flops = 6 * params * batch * cfg.block_size
    callbacks = [kprof.ProfilerCallback(wait=10, warmup=2, active=3, flops_per_batch=flops)]
    if not args.no_swap:
        callbacks.insert(0, kprof.SwapCallback())
    trainer = L.Trainer(
        default_root_dir=args.root,
        max_steps=args.steps,
        precision="bf16-mixed" if gpu else "32",
        log_every_n_steps=5,
        enable_progress_bar=False,
        callbacks=callbacks,
    )
    data = models.random_batches(cfg, 8, batch, "cpu")
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=None))
    print(f"{params / 1e6:.1f}M parameters; layers: {type(module.model.blocks[0].ln_1).__module__}")


if __name__ == "__main__":
    main()
