"""Step time and peak memory of a real model with and without ``kprof.swap``: the GPT of ``kprof_callbacks.models``
(GPT-2 small, 124M parameters, batch 8 x 512 tokens on a GPU; the tiny config on a CPU), fused AdamW, in eager fp32,
eager bf16 autocast, ``torch.compile`` (bf16 autocast) and ``torch.compile(mode="reduce-overhead")``.

Variants: ``torch`` (the model as it is: its loss upcasts the logits to float32, as nanoGPT's does under autocast),
``torch-bf16-logits`` (the same with the loss on the bf16 logits, autocast off for it) and one per ``--impl``
(``kprof.swap(impl=...)``: its LayerNorm, GELU and the fused linear + cross-entropy loss head). Each variant runs
first as a bare loop (the step a user writes: forward, backward, ``optimizer.step()``; CUDA events around ``--steps``
steps, no synchronization between them) for its time per step and its peak allocated memory (parameters and optimizer
state included); then all go through ``kprof.compare`` (interleaved blocks of ``--block`` steps, so its per-step
bookkeeping overlaps the GPU's work) for the speedup's confidence interval. The harness's torch step over the bare
loop's says what the harness costs (``harness_x``). ``compare``'s check (each variant against a float64 run of the
torch model, no tolerance) runs in the eager modes. ``--train-check N`` also trains the torch model and the swapped
one from the same weights for N steps on the same batches, bf16, and compares their losses with how far the
bf16-logits variant's stray from torch's (the size of bf16 noise).

    python benchmarks/real_model.py [--quick] [--modes fp32,bf16,compile,reduce-overhead] [--impl auto,cuda]
                                    [--steps 100] [--block 10] [--train-check 50] [--out r.json] [--logdir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import kprof_callbacks as kprof
from kprof_callbacks import kernels, models

from _record import command, header

MODES = ("fp32", "bf16", "compile", "reduce-overhead")
ROUNDS = 5  # rounds of the bare loops
COMPILE = {"compile": "default", "reduce-overhead": "reduce-overhead"}


class Bf16LogitsHead(nn.Module):
    """``models.LMHead`` with the loss on the logits as they come (bf16 under autocast), not upcast to float32."""

    def __init__(self, head: models.LMHead) -> None:
        super().__init__()
        self.weight = head.weight

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        logits = F.linear(x, self.weight)
        if targets is None:
            return logits
        with torch.autocast(x.device.type, enabled=False):
            return F.cross_entropy(logits.flatten(0, -2), targets.flatten())


def step_fn(device: str, autocast: bool) -> Callable[[nn.Module, tuple], torch.Tensor]:
    """The forward and loss (compare and the bare loop run backward and the optimizer step), under bf16 autocast."""

    def step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        context = torch.autocast(device, dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
        with context:
            return model(*batch)

    return step


def optimizer(params) -> torch.optim.Optimizer:
    """What a user trains GPT-2 with: AdamW, fused into one kernel per step where the parameters are on a GPU."""
    params = list(params)
    return torch.optim.AdamW(params, lr=3e-4, fused=params[0].is_cuda)


def variants(model: nn.Module, impls: list[str], bf16_logits: bool = True) -> dict[str, nn.Module]:
    """torch, (with ``bf16_logits``) torch with the loss on bf16 logits, and ``kprof.swap`` for each impl."""
    out = {"torch": model}
    if bf16_logits:
        out["torch-bf16-logits"] = kprof.swap(model, {models.LMHead: Bf16LogitsHead})
    for impl in impls:
        out["kprof" if impl == "auto" else f"kprof-{impl}"] = swapped = kprof.swap(
            model, impl=None if impl == "auto" else impl
        )
    print(swapped.kprof_swap_report, file=sys.stderr, flush=True)
    return out


def bare_loop(
    model: nn.Module, opt: torch.optim.Optimizer, step: Callable, batches: list, steps: int, warmup: int
) -> dict:
    """ms per step of a plain training loop (events around all ``steps``, no synchronization inside) and its peak
    allocated GiB: its parameters, and what its steps allocate from the first (optimizer state, gradients,
    activations, CUDA graph pools), not the other variants' memory; on a CPU, wall-clock time and no memory."""
    cuda = next(model.parameters()).is_cuda
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() - sum(p.numel() * p.element_size() for p in model.parameters())

    def one(i: int) -> None:
        loss = step(model, batches[i % len(batches)])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for i in range(warmup):
        one(i)
    timing = kprof.time_cuda(lambda: [one(i) for i in range(steps)], warmup=0, iters=1)
    peak = (torch.cuda.max_memory_allocated() - before) / 2**30 if cuda else None
    return {"bare_ms": timing.median_ms / steps, "peak_gib": peak}


def bare_loops(runs: dict[str, nn.Module], step: Callable, batches: list, steps: int, warmup: int) -> dict:
    """Each variant's bare loop in ``ROUNDS`` rounds of ``steps / ROUNDS`` steps, the order rotated each round (so a
    GPU clock ramping up or a noisy neighbour does not fall on one variant): the median round's ms per step, and
    the largest peak."""
    names, results = list(runs), {name: [] for name in runs}
    opts = {name: optimizer(m.parameters()) for name, m in runs.items()}
    for r in range(ROUNDS):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            results[name].append(bare_loop(runs[name], opts[name], step, batches, max(steps // ROUNDS, 1), warmup))
    return {
        name: {
            "bare_ms": sorted(x["bare_ms"] for x in rounds)[len(rounds) // 2],
            "peak_gib": max((x["peak_gib"] for x in rounds if x["peak_gib"] is not None), default=None),
        }
        for name, rounds in results.items()
    }


def run_mode(mode: str, cfg: models.GPTConfig, batch: int, device: str, args: argparse.Namespace) -> list[dict]:
    """The bare loop of every variant, then one ``kprof.compare`` of them all; a row per variant."""
    torch.manual_seed(0)
    model = models.GPT(cfg).to(device)
    runs = variants(model, args.impls, bf16_logits=mode not in COMPILE or args.compile_bf16_logits)
    if mode in COMPILE:
        torch.compiler.reset()
        runs = {name: torch.compile(m, mode=COMPILE[mode]) for name, m in runs.items()}
    step = step_fn(device, autocast=mode != "fp32")
    batches = models.random_batches(cfg, 4, batch, device)
    bare = bare_loops(runs, step, batches, args.steps, args.warmup)
    result = kprof.compare(
        runs,
        step,
        batches,
        steps=args.steps,
        warmup=args.warmup,
        block=args.block,
        optimizer=optimizer,
        check="warn" if mode not in COMPILE else False,  # compiled: the eager modes check the same math
        logdir=None if args.logdir is None else args.logdir / mode,
    )
    print(result, file=sys.stderr, flush=True)
    base = result["torch"].timing
    rows = []
    for name, run in result.variants.items():
        rows.append(
            {
                "mode": mode,
                "variant": name,
                **bare[name],
                "torch_bare_ms": bare["torch"]["bare_ms"],
                "bare_x": bare["torch"]["bare_ms"] / bare[name]["bare_ms"],
                "torch_ms": base.median_ms if base else None,
                "kprof_ms": run.timing.median_ms if run.timing else None,
                "harness_x": base.median_ms / bare["torch"]["bare_ms"] if base else None,
                "speedup": run.speedup,
                "ci": list(run.ci) if run.ci else None,
                "verdict": run.verdict or run.error,
                "check": run.check_detail,
            }
        )
    return rows


def train_check(cfg: models.GPTConfig, batch: int, device: str, steps: int) -> dict:
    """``steps`` bf16 training steps of each variant from the same weights on the same 4 batches (a task it can learn):
    the median per-step loss difference of the swapped model from torch's, and the mean of the last 10 losses,
    against the bf16-logits model's (the size of bf16 noise; a loss spike, which both models show at slightly
    different heights, decides no maximum)."""
    losses = {}
    for name in ("torch", "torch-bf16-logits", "kprof"):
        torch.manual_seed(0)
        model = variants(models.GPT(cfg).to(device), ["auto"])[name]
        opt, step = optimizer(model.parameters()), step_fn(device, autocast=True)
        batches = models.random_batches(cfg, 4, batch, device, seed=1)
        history = []
        for i in range(steps):
            loss = step(model, batches[i % 4])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            history.append(loss.detach())
        losses[name] = torch.stack(history).float().cpu()
    gap = {name: (losses[name] - losses["torch"]).abs() for name in ("kprof", "torch-bf16-logits")}
    tail = {name: losses[name][-10:].mean().item() for name in losses}
    return {
        "steps": steps,
        "loss": {name: [round(v, 4) for v in curve.tolist()] for name, curve in losses.items()},
        "median_abs_diff": gap["kprof"].median().item(),
        "bf16_logits_median_abs_diff": gap["torch-bf16-logits"].median().item(),
        "last10_mean": tail,
        "tracks": gap["kprof"].median().item() <= max(2 * gap["torch-bf16-logits"].median().item(), 1e-3)
        and abs(tail["kprof"] - tail["torch"]) <= max(2 * abs(tail["torch-bf16-logits"] - tail["torch"]), 0.01),
    }


def _ms(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def table(rows: list[dict]) -> str:
    lines = [
        "| mode | variant | bare loop ms/step | × torch (bare) | peak GiB | compare ms/step | speedup [95% CI] "
        "| verdict | harness / bare (torch) |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        ci = f" [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}]" if r["ci"] else ""
        lines.append(
            f"| {r['mode']} | {r['variant']} | {_ms(r['bare_ms'])} | {_ms(r['bare_x'], '.3f')} | "
            f"{_ms(r['peak_gib'])} | {_ms(r['kprof_ms'])} | {_ms(r['speedup'], '.3f')}{ci} | {r['verdict']} | "
            f"{_ms(r['harness_x'], '.3f')} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="20 timed steps after 3 warm-up (compile needs them)")
    parser.add_argument("--modes", default="fp32,bf16,compile", help=f"comma-separated, of {MODES}")
    parser.add_argument("--impl", default="auto", help=f"comma-separated kprof.swap impls: auto or of {kernels.IMPLS}")
    parser.add_argument("--steps", type=int, default=100, help="timed steps per variant (default: 100)")
    parser.add_argument("--block", type=int, default=10, help="compare's steps per block (default: 10)")
    parser.add_argument("--train-check", type=int, default=0, help="also train N steps of torch and kprof, compared")
    parser.add_argument(
        "--compile-bf16-logits", action="store_true", help="the bf16-logits variant in the compiled modes too"
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, help="also write the rows as JSON here")
    parser.add_argument("--logdir", type=Path, help="also profile each variant into LOGDIR/<mode>/<variant>")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - set(MODES):
        parser.error(f"--modes: choose from {MODES}, got {args.modes!r}")
    args.impls = [i for i in args.impl.split(",") if i]
    if not args.impls or set(args.impls) - {"auto", *kernels.IMPLS}:
        parser.error(f"--impl: choose from auto,{','.join(kernels.IMPLS)}, got {args.impl!r}")
    cfg, batch = (models.gpt2_small(), 8) if args.device == "cuda" else (models.tiny(), 4)
    args.warmup = 3 if args.quick else 5
    args.steps, args.block = (20, 5) if args.quick else (args.steps, args.block)
    rows: list[dict] = []
    for mode in modes:
        print(f"[real_model] {mode} ...", file=sys.stderr, flush=True)
        rows += run_mode(mode, cfg, batch, args.device, args)
    training = train_check(cfg, batch, args.device, args.train_check) if args.train_check else None
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(
        f"# GPT ({cfg.n_layer} x {cfg.n_embd}, vocab {cfg.vocab_size}, batch {batch} x {cfg.block_size}) on {device}, "
        f"fused AdamW; bare loop and kprof.compare (blocks of {args.block}), {args.steps} timed steps per variant\n"
    )
    print(table(rows), flush=True)
    if training:
        print(f"\ntraining check: {json.dumps({k: v for k, v in training.items() if k != 'loss'})}", flush=True)
    if args.out is not None:
        record = {
            **header(device, command("real_model.py", argv)),
            "steps": args.steps,
            "model": dataclasses.asdict(cfg),
            "batch": batch,
            "rows": rows,
            "training": training,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
