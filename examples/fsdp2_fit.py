"""Profile FSDP2 training of a GPT under Lightning: ModelParallelStrategy shards it with fully_shard in
``configure_model``, ProfilerCallback profiles every rank (all visible GPUs with NCCL, or 2 CPU processes with gloo).

    python examples/fsdp2_fit.py                                 # each block and the root sharded
    python examples/fsdp2_fit.py --devices 4                     # on 4 of the GPUs (or 4 CPU processes)
    python examples/fsdp2_fit.py --no-reshard-after-forward     # blocks kept unsharded until their backward
    kprof summary lightning_logs/version_0/kprof/train           # communication by collective, FSDP findings

Every rank profiles the same batches and writes its own ``rank<R>_<host>_<pid>`` trace into one run folder, with
memory recorded (for the unsharded-parameter finding); rank 0 prints the summary. examples/fsdp2_loop.py is the plain
torchrun loop with the same model and more flags; docs/multi-gpu.md says what each finding means.
"""

from __future__ import annotations

import argparse

import lightning as L
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.data import DataLoader, TensorDataset

import kprof_callbacks as kprof
from kprof_callbacks import models


class ShardedGPT(L.LightningModule):
    """models.GPT with fully_shard on each block and on the root, over the strategy's data-parallel mesh."""

    def __init__(self, cfg: models.GPTConfig, reshard_after_forward: bool) -> None:
        super().__init__()
        self.model = models.GPT(cfg)
        self.reshard_after_forward = reshard_after_forward

    def configure_model(self) -> None:
        mesh = self.device_mesh["data_parallel"]
        bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        policy = bf16 if self.device_mesh.device_type == "cuda" else MixedPrecisionPolicy()
        for block in self.model.blocks:
            fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=self.reshard_after_forward)
        fully_shard(self.model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)  # backward needs it first

    def training_step(self, batch, batch_idx):
        idx, targets = batch
        return self.model(idx, targets)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=".", help="Trainer default_root_dir")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--devices", type=int, default=None, help="ranks (default: every GPU, or 2 on the CPU)")
    parser.add_argument(
        "--no-reshard-after-forward",
        dest="reshard",
        action="store_false",
        help="keep each block's parameters unsharded from its forward to its backward",
    )
    args = parser.parse_args()
    gpu = torch.cuda.is_available()
    ranks = args.devices if args.devices is not None else (torch.cuda.device_count() if gpu else 2)
    if ranks < 1 or (gpu and ranks > torch.cuda.device_count()):
        parser.error(f"--devices must be between 1 and the number of GPUs ({torch.cuda.device_count()}), got {ranks}")
    cfg = models.GPTConfig(
        n_layer=12 if gpu else 4,
        n_head=8 if gpu else 4,
        n_embd=1024 if gpu else 64,
        vocab_size=8192 if gpu else 512,
        block_size=512 if gpu else 64,
    )
    batch = 4 if gpu else 8
    tokens = torch.randint(
        cfg.vocab_size, (batch * args.steps * ranks, cfg.block_size + 1), generator=torch.Generator().manual_seed(0)
    )
    data = TensorDataset(tokens[:, :-1], tokens[:, 1:])
    trainer = L.Trainer(
        default_root_dir=args.root,
        accelerator="gpu" if gpu else "cpu",
        devices=ranks,
        strategy=ModelParallelStrategy(data_parallel_size=ranks, tensor_parallel_size=1),
        max_steps=args.steps,
        enable_progress_bar=False,
        enable_checkpointing=False,
        callbacks=[kprof.ProfilerCallback(wait=3, warmup=1, active=4, profile_memory=True)],
    )
    trainer.fit(ShardedGPT(cfg, args.reshard), DataLoader(data, batch_size=batch))


if __name__ == "__main__":
    main()
