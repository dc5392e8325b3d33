"""Host time per forward call on a tiny tensor: each kprof layer against the torch op it replaces.

A training step of a mid-size model in bf16 is host-bound (the GPU waits for launches), so a layer that costs more
host time per call than torch's makes the step slower however fast its kernel is. On a tiny tensor the kernel time is
negligible and what is left is the call: Python, argument checks, autograd bookkeeping, dispatch, launch. Target:
kprof <= 1.1x torch per call.

Each round times a block of calls of the torch version and of the kprof version in a random order, and the ratio is
taken per round (paired, so drift on a shared machine hits both); the table shows medians over rounds and the
ratio's range. "grad" calls take an input that requires grad (autograd records the call, as in training); "no grad"
ones do not. On the CPU one intra-op thread is used, so OpenMP's thread wake-ups do not swamp the call itself; on
CUDA the host time is the wall time of the block (the GPU finishes each tiny kernel long before the next launch).

    python benchmarks/host_overhead.py [--device cpu|cuda] [--impl triton] [--rounds 30] [--calls 2000] [--quick]
                                       [--out r.json]

``--impl`` builds the kprof side with that implementation (``impl=`` of every layer); ``triton`` (CUDA only) times
the Triton twins' calls, and leaves out the layers without one (square, add).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from kprof_callbacks import kernels

from _record import commit

TARGET = 1.1
ROWS, WIDTH = 8, 64  # the tiny activation: [8, 64]


@dataclasses.dataclass(frozen=True)
class Pair:
    """A layer and the torch op it replaces, each a zero-argument call on the same inputs."""

    name: str
    torch_call: Callable[[], torch.Tensor]
    kprof_call: Callable[[], torch.Tensor]


NO_TRITON = (
    "torch.square -> kernels.square",
    "torch.add -> kernels.add",
    "F.cross_entropy(F.linear) -> kernels.linear_cross_entropy",
)


def pairs(device: str, grad: bool, impl: str | None = None) -> list[Pair]:
    """Every kprof layer (module and functional form, built with ``impl``) with its torch counterpart, on
    [ROWS, WIDTH] inputs."""
    x, up = (torch.randn(ROWS, WIDTH, device=device, requires_grad=grad) for _ in range(2))
    b = torch.randn(WIDTH, device=device, requires_grad=grad)
    target = torch.randint(WIDTH, (ROWS,), device=device)
    ln, rms, linear, act = (nn.LayerNorm(WIDTH), nn.RMSNorm(WIDTH), nn.Linear(WIDTH, WIDTH), nn.GELU())
    for module in (ln, rms, linear):
        module.to(device).requires_grad_(grad)
    gelu, k_ln, k_rms = (
        kernels.GELU(impl=impl),
        kernels.LayerNorm.from_module(ln, impl=impl),
        kernels.RMSNorm.from_module(rms, impl=impl),
    )
    linear_gelu = kernels.LinearGELU.from_module(linear, act, impl=impl)
    every = [
        Pair("nn.GELU -> kernels.GELU", lambda: act(x), lambda: gelu(x)),
        Pair("nn.LayerNorm -> kernels.LayerNorm", lambda: ln(x), lambda: k_ln(x)),
        Pair("nn.RMSNorm -> kernels.RMSNorm", lambda: rms(x), lambda: k_rms(x)),
        Pair("Linear+GELU -> kernels.LinearGELU", lambda: act(linear(x)), lambda: linear_gelu(x)),
        Pair("F.gelu -> kernels.gelu", lambda: F.gelu(x), lambda: kernels.gelu(x, impl=impl)),
        Pair(
            "F.layer_norm -> kernels.layer_norm",
            lambda: F.layer_norm(x, (WIDTH,), ln.weight, ln.bias),
            lambda: kernels.layer_norm(x, WIDTH, ln.weight, ln.bias, impl=impl),
        ),
        Pair(
            "F.rms_norm -> kernels.rms_norm",
            lambda: F.rms_norm(x, (WIDTH,), rms.weight),
            lambda: kernels.rms_norm(x, WIDTH, rms.weight, impl=impl),
        ),
        Pair("F.gelu(x + b) -> kernels.bias_gelu", lambda: F.gelu(x + b), lambda: kernels.bias_gelu(x, b, impl=impl)),
        Pair("F.silu(g) * u -> kernels.swiglu", lambda: F.silu(x) * up, lambda: kernels.swiglu(x, up, impl=impl)),
        Pair("torch.square -> kernels.square", lambda: torch.square(x), lambda: kernels.square(x, impl=impl)),
        Pair("torch.add -> kernels.add", lambda: torch.add(x, up), lambda: kernels.add(x, up, impl=impl)),
        Pair(
            "F.cross_entropy(F.linear) -> kernels.linear_cross_entropy",
            lambda: F.cross_entropy(F.linear(x, linear.weight).float(), target),
            lambda: kernels.linear_cross_entropy(x, linear.weight, target, impl=impl),
        ),
    ]
    return [pair for pair in every if impl != "triton" or pair.name not in NO_TRITON]


def per_call_us(call: Callable[[], torch.Tensor], calls: int, device: str) -> float:
    """Wall time of ``calls`` back-to-back calls, per call, in microseconds."""
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter_ns()
    for _ in range(calls):
        call()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter_ns() - start) / calls / 1e3


def measure(pair: Pair, rounds: int, calls: int, device: str, rng: random.Random) -> dict:
    """Paired rounds: torch and kprof blocks in a random order each round; medians and per-round ratios."""
    for call in (pair.torch_call, pair.kprof_call):
        per_call_us(call, max(calls // 10, 10), device)  # warm-up: first-call costs, caches, allocator
    times: dict[str, list[float]] = {"torch": [], "kprof": []}
    for _ in range(rounds):
        order = [("torch", pair.torch_call), ("kprof", pair.kprof_call)]
        rng.shuffle(order)
        for side, call in order:
            times[side].append(per_call_us(call, calls, device))
    ratios = [k / t for k, t in zip(times["kprof"], times["torch"], strict=True)]
    return {
        "layer": pair.name,
        "torch_us": statistics.median(times["torch"]),
        "kprof_us": statistics.median(times["kprof"]),
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }


def table(rows: list[dict]) -> str:
    lines = [
        f"| layer | autograd | torch us/call | kprof us/call | kprof / torch (range over rounds) | <= {TARGET}x |",
        "|---|---|---:|---:|---:|---|",
    ]
    for r in rows:
        met = "met" if r["ratio"] <= TARGET else "missed"
        lines.append(
            f"| {r['layer']} | {r['mode']} | {r['torch_us']:.2f} | {r['kprof_us']:.2f} | "
            f"{r['ratio']:.2f} ({r['ratio_min']:.2f} .. {r['ratio_max']:.2f}) | {met} |"
        )
    return "\n".join(lines)


def environment(device: str) -> dict:
    name = torch.cuda.get_device_name() if device == "cuda" else platform.processor() or platform.machine()
    return {
        "commit": commit(),
        "device": name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=int, default=30, help="paired rounds per layer (default: 30)")
    parser.add_argument("--calls", type=int, default=2000, help="calls per block (default: 2000)")
    parser.add_argument("--quick", action="store_true", help="3 rounds of 200 calls: a smoke run")
    parser.add_argument("--impl", choices=kernels.IMPLS, help="the kprof layers' impl (default: the device's kernels)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device")
    if args.impl == "triton" and args.device != "cuda":
        parser.error("--impl triton: the Triton kernels' host time is measured on CUDA (on a CPU they run interpreted)")
    rounds, calls = (3, 200) if args.quick else (args.rounds, args.calls)
    if args.device == "cpu":
        torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    rows = []
    for mode, grad in (("no grad", False), ("grad", True)):
        for pair in pairs(args.device, grad, args.impl):  # building the layers loads (or builds) their operators first
            row = {**measure(pair, rounds, calls, args.device, rng), "mode": mode}
            rows.append(row)
            print(f"[host_overhead] {row['layer']} ({mode}): {row['ratio']:.2f}x", file=sys.stderr, flush=True)
    env = environment(args.device)
    print(
        f"# Host time per forward call, [{ROWS}, {WIDTH}] float32 on {env['device']} (torch {env['torch']}, "
        f"CUDA {env['cuda']}, {env['threads']} thread(s)), kprof impl={args.impl!r}; median of {rounds} paired "
        f"rounds of {calls} calls\n"
    )
    print(table(rows), flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps({**env, "rounds": rounds, "calls": calls, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
