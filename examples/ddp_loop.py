"""Profile a plain DistributedDataParallel loop started by torchrun, with kprof.session on every rank.

    torchrun --nproc_per_node=2 examples/ddp_loop.py      # NCCL, one GPU per rank; else gloo on the CPU
    torchrun --nproc_per_node=4 examples/ddp_loop.py --name slow --slow-data 2:20     # rank 2 sleeps 20 ms a step
    kprof summary log/ddp-loop                             # per-rank compute vs NCCL, overlap, straggler

All ranks use the same schedule and step together, so they profile the same steps; each writes its own
``rank<R>_<host>_<pid>.<ns>.pt.trace.json`` into ``log/<name>``; rank 0 prints the summary. ``--straggler R:MS`` makes
rank R compute MS milliseconds more each step (the `straggler` finding), ``--slow-data R:MS`` makes it sleep that long
loading each batch (the `late_rank` finding: the others wait for it, though it computes no longer).
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import kprof_callbacks as kprof
from kprof_callbacks import models


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logdir", default="log")
    parser.add_argument("--name", default="ddp-loop", help="run folder under the logdir")
    parser.add_argument("--width", type=int, default=None, help="MLP width (default: 2048 on GPU, 128 on CPU)")
    parser.add_argument("--batch", type=int, default=64, help="samples per rank and step")
    parser.add_argument("--steps", type=int, default=20)
    for flag, what in (("--straggler", "computes MS milliseconds more"), ("--slow-data", "sleeps MS milliseconds")):
        parser.add_argument(flag, type=models.rank_ms, default=(None, 0.0), metavar="R:MS", help=f"rank R {what}")
    args = parser.parse_args()
    if args.batch < 1:
        parser.error(f"--batch must be >= 1, got {args.batch}")
    if args.steps < 12:
        parser.error(f"--steps must be >= 12 (the profiler waits 5 steps, warms up 2 and records 5), got {args.steps}")
    return args


def main() -> None:
    args = parse_args()
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    gpu = torch.cuda.is_available() and torch.cuda.device_count() >= ranks_here  # NCCL needs a GPU per rank
    dist.init_process_group("nccl" if gpu else "gloo")
    rank = dist.get_rank()
    if rank == 0 and torch.cuda.is_available() and not gpu:
        print(f"{ranks_here} ranks on {torch.cuda.device_count()} GPU(s): running on the CPU with gloo")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    width = args.width or (2048 if gpu else 128)
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(width, width), nn.GELU())]).to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if gpu else None)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    gen = torch.Generator(device).manual_seed(rank)  # batches drawn where they are used, as a prefetching loader
    with kprof.session(args.logdir, run=args.name, wait=5, warmup=2, active=5) as s:
        for _ in range(args.steps):
            if rank == args.slow_data[0]:
                with s.region("data_loading"):
                    time.sleep(args.slow_data[1] / 1000.0)
            x = torch.randn(args.batch, width, generator=gen, device=device)
            with s.region("forward"):
                loss = ddp(x).square().mean()
                if rank == args.straggler[0]:
                    models.extra_work(device, args.straggler[1])
            with s.region("backward+allreduce"):
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            s.step(samples=args.batch)
    dist.barrier()  # every rank's trace is on disk before rank 0 reads them
    if rank == 0:
        print(s.summary())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
