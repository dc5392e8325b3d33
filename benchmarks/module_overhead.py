"""What the module view costs a training step: ``kprof.session(model=...)`` against the same session without it.

Two launch-bound models, where every module call is a few microseconds of host work, so the two hooks and the range
each call gets weigh the most they can:
- ``mlp``: the worst case, a deep stack of small Linear + ReLU blocks (AdamW): three module calls per matrix product;
- ``gpt``: a real training model, ``models.GPT`` with GPT-2 small's layers and vocabulary but 4 blocks and one
  sequence of 64 tokens (bf16 autocast and fused AdamW on a GPU, float32 on the CPU).
Per model:
- In a window: one long recorded window in which the module ranges are switched on and off every other step
  (``ModelCapture.sync``, as a session does at a window's start and end). Each step is paired with the next, so the
  process's drift cancels; the cost is the median of the paired ratios, with their range.
- The hooks alone: what a module call gains from them and its range while a profiler records (``hook_cost``: the
  fastest of several repeats, which a busy machine cannot inflate), times the module calls of a step, against the step.
- Outside windows the hooks are gone; what is left is the session's per-step call: ``s.step()`` is timed long after
  the window, with and without ``model=``, each in a fresh process, and its difference set against the step.
Each target is judged per model, on the median over rounds of the paired steps (in a window) and of ``s.step()``'s
extra time (outside).

    python benchmarks/module_overhead.py --out benchmarks/results/module_overhead-cpu.json
    python benchmarks/module_overhead.py --quick          # CI smoke test
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn.modules import module as nn_module

import kprof_callbacks as kprof
from kprof_callbacks import models
from kprof_callbacks.attribution import ModelCapture

from _isolated import Isolated
from _record import command, header

MLP = {"full": (256, 24, 64), "quick": (32, 4, 8)}  # width, blocks, batch
GPT = {  # config, batch
    "full": (models.GPTConfig(n_layer=4, n_head=12, n_embd=768, vocab_size=50304, block_size=64), 1),
    "quick": (models.tiny(), 2),
}
PAIRS = {"full": 60, "quick": 20}  # paired steps in a window; steps timed outside one
MODELS = ("mlp", "gpt")
TARGETS = {"inside": 0.05, "outside": 0.01}


class Loop:
    """A launch-bound model (``MODELS``), its optimizer and one batch."""

    def __init__(self, name: str, sizes: str) -> None:
        torch.manual_seed(0)
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        cuda = self.device == "cuda"
        self.autocast = contextlib.nullcontext()
        if name == "mlp":
            width, blocks, batch = MLP[sizes]
            layers = [nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(blocks)]
            self.model = nn.Sequential(*layers).to(self.device)
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
            self.inputs, self.loss = (torch.randn(batch, width, device=self.device),), lambda y: y.square().mean()
        else:
            cfg, batch = GPT[sizes]
            self.model = models.GPT(cfg).to(self.device)
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=cuda)
            (self.inputs,) = models.random_batches(cfg, n=1, batch=batch, device=self.device)
            self.loss = lambda loss: loss
            self.autocast = torch.autocast("cuda", torch.bfloat16) if cuda else self.autocast
        self.calls = self._module_calls()

    def step(self) -> float:
        """One training step; its seconds (the GPU's work included)."""
        start = time.perf_counter()
        with self.autocast:
            loss = self.loss(self.model(*self.inputs))
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if self.device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    def _module_calls(self) -> int:
        """Calls of the model's modules in one step (its first, which also warms it up)."""
        ids, seen = {id(m) for m in self.model.modules()}, []
        handle = nn_module.register_module_forward_pre_hook(lambda module, args: seen.append(id(module) in ids))
        try:
            self.step()
        finally:
            handle.remove()
        return sum(seen)


def describe(name: str, sizes: str) -> str:
    """One model's line in the record."""
    if name == "mlp":
        width, blocks, batch = MLP[sizes]
        return f"{blocks} blocks of Sequential(Linear({width}, {width}), ReLU), batch {batch}, AdamW, float32"
    cfg, batch = GPT[sizes]
    return (
        f"models.GPT: {cfg.n_layer} blocks of {cfg.n_head} heads x {cfg.n_embd}, vocabulary {cfg.vocab_size}, "
        f"batch {batch} x {cfg.block_size} tokens, AdamW (fused) in bf16 autocast on a GPU, float32 on the CPU"
    )


def inside(name: str, sizes: str) -> dict:
    """Paired steps in one recorded window, module ranges on in the first of each pair and off in the second."""
    loop, pairs = Loop(name, sizes), PAIRS[sizes]
    for _ in range(10):
        loop.step()
    ratios, on_s, off_s = [], [], []
    with tempfile.TemporaryDirectory() as logdir:
        with kprof.session(logdir, model=loop.model, wait=0, warmup=1, active=2 * pairs + 2, scalars=False) as s:
            s.step()
            for _ in range(pairs):
                s._recorder.model.sync(True)
                on_s.append(loop.step())
                s.step()
                s._recorder.model.sync(False)
                off_s.append(loop.step())
                s.step()
            s._recorder.model.sync(True)
    ratios = [a / b for a, b in zip(on_s, off_s)]
    return {
        "step_ms": statistics.median(off_s) * 1e3,
        "module_calls": loop.calls,
        "inside": [statistics.median(ratios) - 1, min(ratios) - 1, max(ratios) - 1],
        "per_call_us": (statistics.median(on_s) - statistics.median(off_s)) / loop.calls * 1e6,
    }


def hook_cost(calls: int = 5000, repeats: int = 7) -> float:
    """Host µs one module call gains from the hooks and its range while a profiler records: an ``nn.Identity`` called
    ``calls`` times with the ranges on and off, the fastest of ``repeats`` each (a figure a busy machine cannot
    inflate, unlike a step's)."""
    module, x = nn.Identity(), torch.zeros(1)
    capture = ModelCapture(module)
    best = {True: float("inf"), False: float("inf")}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        for _ in range(repeats):
            for on in (True, False):
                capture.sync(on)
                start = time.perf_counter()
                for _ in range(calls):
                    module(x)
                best[on] = min(best[on], time.perf_counter() - start)
        capture.sync(False)
    return (best[True] - best[False]) / calls * 1e6


def step_call(name: str, sizes: str, with_model: bool) -> dict:
    """``s.step()``'s own time long after the window (median over the steps), and the step's."""
    loop, pairs = Loop(name, sizes), PAIRS[sizes]
    calls, steps = [], []
    with tempfile.TemporaryDirectory() as logdir:
        model = loop.model if with_model else None
        with kprof.session(logdir, model=model, wait=0, warmup=1, active=2, scalars=False) as s:
            for k in range(pairs + 10):
                steps.append(loop.step())
                start = time.perf_counter()
                s.step()
                if k >= 10:
                    calls.append(time.perf_counter() - start)
    return {"call_us": statistics.median(calls) * 1e6, "step_ms": statistics.median(steps[10:]) * 1e3}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny models, few steps (CI smoke test)")
    p.add_argument("--rounds", type=int, default=3, help="fresh processes per measurement")
    p.add_argument("--out", type=Path, help="write the result of record here")
    args = p.parse_args(argv)
    sizes = "quick" if args.quick else "full"
    rounds = 1 if args.quick else args.rounds
    isolated = Isolated(preload=("torch", "kprof_callbacks"), timeout=900)
    rows = []
    for k in range(rounds):
        hook_us = isolated(hook_cost)
        for name in MODELS:
            rows.append(_round(isolated, name, sizes, hook_us) | {"round": k + 1})
            print(f"  round {k + 1}: {rows[-1]}", file=sys.stderr, flush=True)
    result = _record(rows, sizes, isolated.cores)
    print(render(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


def _round(isolated: Isolated, name: str, sizes: str, hook_us: float) -> dict:
    """One model's figures, each measurement in a fresh process."""
    got = isolated(inside, name, sizes)
    with_model, without = isolated(step_call, name, sizes, True), isolated(step_call, name, sizes, False)
    extra_us = with_model["call_us"] - without["call_us"]
    return {
        "model": name,
        "step_ms": round(got["step_ms"], 3),
        "module_calls": got["module_calls"],
        "per_call_us": round(got["per_call_us"], 2),
        "inside": [round(x, 4) for x in got["inside"]],
        "hook_us": round(hook_us, 2),
        "estimated_inside": round(hook_us * got["module_calls"] / 1e3 / without["step_ms"], 4),
        "outside_us": round(extra_us, 2),
        "outside": round(extra_us / 1e3 / without["step_ms"], 5),
    }


def _record(rows: list[dict], sizes: str, cores: list[int]) -> dict:
    cuda = torch.cuda.is_available()
    return {
        **header(
            torch.cuda.get_device_name() if cuda else f"CPU, {len(cores)} pinned cores ({platform.machine()})",
            command("module_overhead.py", None),
        ),
        "models": {name: describe(name, sizes) for name in MODELS},
        "pairs": PAIRS[sizes],
        "targets": TARGETS,
        "verdicts": verdicts(rows),
        "rows": rows,
    }


def verdicts(rows: list[dict]) -> dict:
    """Per model and target: the median over rounds, and whether it meets the target."""
    out = {}
    for name in MODELS:
        mine = [r for r in rows if r["model"] == name]
        inside = statistics.median(r["inside"][0] for r in mine)
        outside = statistics.median(r["outside"] for r in mine)
        out[name] = {
            "inside": inside,
            "inside_met": inside <= TARGETS["inside"],
            "outside": outside,
            "outside_met": outside <= TARGETS["outside"],
        }
    return out


def render(result: dict) -> str:
    lines = [f"{result['device']}, torch {result['versions']['torch']}; {result['pairs']} step pairs"]
    lines += [f"  {name}: {text}" for name, text in result["models"].items()]
    lines += [
        "",
        "| model | round | step ms | module calls a step | in a window: paired steps (median, range) | "
        "hooks µs a call | in a window: calls x hooks / step | outside: s.step() µs more | outside, of the step |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        mid, lo, hi = r["inside"]
        lines.append(
            f"| {r['model']} | {r['round']} | {r['step_ms']:.3f} | {r['module_calls']} | "
            f"{mid:+.1%} ({lo:+.1%} .. {hi:+.1%}) | {r['hook_us']:.2f} | {r['estimated_inside']:+.2%} | "
            f"{r['outside_us']:+.2f} | {r['outside']:+.3%} |"
        )
    lines.append("")
    for name, v in result["verdicts"].items():
        lines.append(
            f"{name}: in a window {v['inside']:+.1%} (target <= {TARGETS['inside']:.0%}: "
            f"{'met' if v['inside_met'] else 'MISSED'}); outside {v['outside']:+.3%} "
            f"(target <= {TARGETS['outside']:.0%}: {'met' if v['outside_met'] else 'MISSED'})"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
