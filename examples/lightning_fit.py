"""Profile a PyTorch Lightning fit by adding one callback: kprof.ProfilerCallback.

A small convolutional network learns to tell noisy horizontal stripes from vertical ones. The callback records
batches 2-4 and 7-9 of training (wait=1, warmup=1, active=3, repeat=2), labels Lightning's training_step,
backward, zero_grad, optimizer update and data loading in the trace, logs every batch's step time, and prints a
summary when the fit ends.

    python examples/lightning_fit.py                 # CPU or the first GPU, well under a minute
    tensorboard --logdir lightning_logs              # Scalars (loss, kprof/step_time_ms) + PyTorch Profiler tab
    kprof summary lightning_logs/version_0/kprof/train
"""

from __future__ import annotations

import argparse

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kprof_callbacks as kprof

SIZE, BATCH = 28, 64


def stripes(n: int, seed: int) -> TensorDataset:
    """Images of horizontal (label 0) or vertical (label 1) stripes under noise."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(2, (n,), generator=gen)
    phase = torch.randint(4, (n, 1, 1), generator=gen)
    rows = ((torch.arange(SIZE).view(1, SIZE, 1) + phase) % 4 < 2).float().expand(n, SIZE, SIZE)
    images = torch.where(labels.view(n, 1, 1).bool(), rows.transpose(1, 2), rows)
    images = images + 0.8 * torch.randn(n, SIZE, SIZE, generator=gen)
    return TensorDataset(images.unsqueeze(1), labels)


class StripeNet(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(32 * 7 * 7, 64),
            nn.ReLU(),
            nn.Linear(64, 2),
        )

    def training_step(self, batch, batch_idx):
        images, labels = batch
        loss = nn.functional.cross_entropy(self.net(images), labels)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        images, labels = batch
        self.log("val_acc", (self.net(images).argmax(1) == labels).float().mean())

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=2e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=".", help="Trainer default_root_dir (traces go under <root>/lightning_logs)")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    torch.manual_seed(0)
    trainer = L.Trainer(
        default_root_dir=args.root,
        max_epochs=args.epochs,
        log_every_n_steps=10,
        enable_progress_bar=False,
        callbacks=[kprof.ProfilerCallback(wait=1, warmup=1, active=3, repeat=2)],
    )
    train = DataLoader(stripes(40 * BATCH, seed=0), batch_size=BATCH, shuffle=True)
    val = DataLoader(stripes(8 * BATCH, seed=1), batch_size=BATCH)
    trainer.fit(StripeNet(), train, val)

    print(f"val_acc {trainer.callback_metrics['val_acc']:.3f}")
    print(f"traces and scalars: {trainer.logger.log_dir}")


if __name__ == "__main__":
    main()
