"""Profile FSDP2 (``torch.distributed.fsdp.fully_shard``) training of a GPT, started by torchrun, on every rank.

    torchrun --nproc_per_node=2 examples/fsdp2_loop.py                 # a good configuration
    torchrun --nproc_per_node=2 examples/fsdp2_loop.py --wrap root     # fully_shard on the root alone
    torchrun --nproc_per_node=2 examples/fsdp2_loop.py --no-reshard-after-forward
    torchrun --nproc_per_node=4 examples/fsdp2_loop.py --replicate 2   # HSDP: a 2 x 2 mesh, replicate x shard
    kprof summary log/fsdp2-loop                                       # communication by collective, findings

One GPU per rank with NCCL and a bf16 MixedPrecisionPolicy (fp32 gradient reduction) when there are enough GPUs;
else gloo on the CPU in fp32. Each block gets its own ``fully_shard`` and the root one more (``--wrap root``: only the
root), so FSDP all-gathers a block's parameters before its forward and backward and reduce-scatters its gradients after
its backward. Each rank writes ``rank<R>_<host>_<pid>.<ns>.pt.trace.json`` into ``log/<run>`` (memory recorded, for
the unsharded-parameter finding, unless ``--no-profile-memory``: the memory profiler costs host time per operator);
rank 0 prints the summary.

``--replicate N`` shards over a 2-D device mesh (HSDP): N replicas, each sharded over world size / N ranks, so the
parameters are all-gathered and the gradients reduce-scattered within a replica (``mesh_shard``) and then all-reduced
across replicas (``mesh_replicate``); the communication table tells the two levels apart by process group.
The flags make each finding fire or stay quiet (docs/multi-gpu.md says which fires where): ``--wrap root``,
``--no-reshard-after-forward``, ``--prefetch N`` (explicit prefetching, N groups ahead; 0: FSDP's implicit one),
``--separate-reduce-scatter`` (reduce-scatter on its own process group), ``--straggler R:MS`` (rank R computes MS
milliseconds longer each step), ``--slow-data R:MS`` (rank R sleeps MS milliseconds loading each batch), and sizes.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import kprof_callbacks as kprof
from kprof_callbacks import models


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logdir", default="log")
    parser.add_argument("--name", default="fsdp2-loop", help="run folder under the logdir")
    parser.add_argument(
        "--wrap",
        choices=("blocks", "root"),
        default="blocks",
        help="fully_shard each block and the root (blocks) or the root alone (root)",
    )
    parser.add_argument(
        "--no-reshard-after-forward",
        dest="reshard",
        action="store_false",
        help="keep each block's parameters unsharded from its forward to its backward",
    )
    parser.add_argument(
        "--prefetch",
        type=int,
        default=1,
        help="groups each block prefetches explicitly in forward and backward (0: FSDP's implicit)",
    )
    parser.add_argument("--replicate", type=int, default=1, metavar="N", help="HSDP: N replicas, each sharded")
    parser.add_argument(
        "--separate-reduce-scatter", action="store_true", help="run gradient reduce-scatter on its own process group"
    )
    parser.add_argument(
        "--straggler",
        type=models.rank_ms,
        default=(None, 0.0),
        metavar="R:MS",
        help="rank R does MS milliseconds of extra matrix products each step",
    )
    parser.add_argument(
        "--slow-data",
        type=models.rank_ms,
        default=(None, 0.0),
        metavar="R:MS",
        help="rank R sleeps MS milliseconds loading each batch",
    )
    parser.add_argument(
        "--profile-memory",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="record allocations (the unsharded-memory finding reads them; they cost host time per operator)",
    )
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch", type=int, default=None, help="sequences per rank (default: 4 on GPU, 8 on CPU)")
    parser.add_argument("--layers", type=int, default=None, help="blocks (default: 12 on GPU, 6 on CPU)")
    parser.add_argument("--width", type=int, default=None, help="embedding width (default: 1024 on GPU, 64 on CPU)")
    args = parser.parse_args(argv)
    if args.prefetch < 0:
        parser.error(f"--prefetch must be >= 0, got {args.prefetch}")
    if args.replicate < 1:
        parser.error(f"--replicate must be >= 1, got {args.replicate}")
    if args.steps < 8:
        parser.error(f"--steps must be >= 8 (the profiler waits 3 steps, warms up 1 and records 4), got {args.steps}")
    return args


def shard(model: models.GPT, args: argparse.Namespace, gpu: bool) -> None:
    """fully_shard the blocks (unless --wrap root) and the root, and set prefetching and the reduce-scatter group."""
    bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    policy = bf16 if gpu else MixedPrecisionPolicy()
    mesh = device_mesh(args.replicate, gpu)
    blocks = list(model.blocks) if args.wrap == "blocks" else []
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=args.reshard)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)  # backward needs the root first
    if args.prefetch:
        for i, block in enumerate(blocks):
            block.set_modules_to_forward_prefetch(blocks[i + 1 : i + 1 + args.prefetch])
            block.set_modules_to_backward_prefetch(blocks[max(i - args.prefetch, 0) : i][::-1])
        if not gpu:  # gloo has no streams: all-gathers run beside compute only when FSDP issues them asynchronously
            model._set_unshard_async_op(True)
    if args.separate_reduce_scatter:
        if not hasattr(model, "set_separate_reduce_scatter_group"):
            raise SystemExit(
                f"--separate-reduce-scatter needs FSDPModule.set_separate_reduce_scatter_group "
                f"(not in torch {torch.__version__})"
            )
        model.set_separate_reduce_scatter_group()


def device_mesh(replicate: int, gpu: bool) -> DeviceMesh:
    """The mesh fully_shard shards over: every rank (1-D), or ``replicate`` replicas x the rest (HSDP). Built on the
    CPU for gloo ranks, whose machine may have fewer GPUs than ranks (fully_shard's default mesh is on the machine's
    accelerator)."""
    world = dist.get_world_size()
    if world % replicate:
        raise SystemExit(f"--replicate {replicate} does not divide the {world} ranks")
    device = "cuda" if gpu else "cpu"
    if replicate == 1:
        return init_device_mesh(device, (world,))
    return init_device_mesh(device, (replicate, world // replicate), mesh_dim_names=("replicate", "shard"))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    gpu = torch.cuda.is_available() and torch.cuda.device_count() >= ranks_here  # NCCL needs a GPU per rank
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if gpu else "gloo", device_id=device if gpu else None)
    rank = dist.get_rank()
    cfg = models.GPTConfig(
        n_layer=args.layers or (12 if gpu else 6),
        n_head=8 if gpu else 4,
        n_embd=args.width or (1024 if gpu else 64),
        vocab_size=8192 if gpu else 512,
        block_size=512 if gpu else 64,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = models.GPT(cfg)
    shard(model, args, gpu)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batches = models.random_batches(cfg, n=args.steps, batch=args.batch or (4 if gpu else 8), device=device, seed=rank)
    schedule = dict(wait=3, warmup=1, active=4)
    with kprof.session(args.logdir, run=args.name, **schedule, profile_memory=args.profile_memory) as s:
        for idx, targets in batches:
            if rank == args.slow_data[0]:
                with s.region("data_loading"):
                    time.sleep(args.slow_data[1] / 1000.0)
            with s.region("forward"):
                loss = model(idx, targets)
                if rank == args.straggler[0]:
                    models.extra_work(device, args.straggler[1])
            with s.region("backward"):
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            s.step(samples=idx.shape[0])
    dist.barrier()  # every rank's trace is on disk before rank 0 reads them
    if rank == 0:
        print(s.summary())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
