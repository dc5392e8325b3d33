"""Profile a plain DistributedDataParallel loop started by torchrun, with kprof.session on every rank.

    torchrun --nproc_per_node=2 examples/ddp_loop.py      # NCCL, one GPU per rank; else gloo on the CPU
    kprof summary log/ddp-loop                             # per-rank compute vs NCCL, overlap, straggler

All ranks use the same schedule and step together, so they profile the same steps; each writes its own
``rank<R>_<host>_<pid>.<ns>.pt.trace.json`` into ``log/ddp-loop``; rank 0 prints the summary.
"""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import kprof_callbacks as kprof


def main() -> None:
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    gpu = torch.cuda.is_available() and torch.cuda.device_count() >= ranks_here  # NCCL needs a GPU per rank
    dist.init_process_group("nccl" if gpu else "gloo")
    rank = dist.get_rank()
    if rank == 0 and torch.cuda.is_available() and not gpu:
        print(f"{ranks_here} ranks on {torch.cuda.device_count()} GPU(s): running on the CPU with gloo")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    width = 2048 if gpu else 128
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(width, width), nn.GELU())]).to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if gpu else None)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    with kprof.session("log", run="ddp-loop", wait=5, warmup=2, active=5) as s:
        for _ in range(20):
            x = torch.randn(64, width, generator=gen).to(device)
            with s.region("forward"):
                loss = ddp(x).square().mean()
            with s.region("backward+allreduce"):
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            s.step(samples=64)
    dist.barrier()  # every rank's trace is on disk before rank 0 reads them
    if rank == 0:
        print(s.summary())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
