"""A tiny Lightning fit with ``kprof.ProfilerCallback`` (or without it, as a control), run as a subprocess.

Prints ``step <n> recording=<0|1> traces=<k>`` after every training batch, like loop.py. Callback options come
as ``--option name=<python literal>``; ``--no-kprof`` runs the same fit without the callback.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kprof_callbacks as kprof

from loop import option_arg


class Regression(L.LightningModule):
    def __init__(self, step_sleep: float) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 1))
        self.step_sleep = step_sleep

    def training_step(self, batch, batch_idx):
        time.sleep(self.step_sleep)
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def regression_data() -> DataLoader:
    """8 batches of 8 samples."""
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)


class Progress(L.Callback):
    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        traces = len(list(self.logdir.rglob("*.pt.trace.json")))
        recording = int(torch.autograd.profiler._is_profiler_enabled)
        print(f"step {trainer.global_step} recording={recording} traces={traces}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("logdir", type=Path)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--step-sleep", type=float, default=0.02)
    parser.add_argument("--no-kprof", action="store_true")
    parser.add_argument("--option", type=option_arg, action="append", default=[])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    callbacks = [Progress(args.logdir)]
    if not args.no_kprof:
        callbacks.insert(0, kprof.ProfilerCallback(logdir=args.logdir, run="r", summary=False, **dict(args.option)))
    trainer = L.Trainer(
        max_steps=args.steps,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=args.logdir,
    )
    trainer.fit(Regression(args.step_sleep), regression_data())
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
