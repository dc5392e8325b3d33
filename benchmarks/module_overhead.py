"""What the module view costs a training step: ``kprof.session(model=...)`` against the same session without it.

A launch-bound model (a deep stack of small Linear + ReLU blocks, AdamW): every module call is a few microseconds of
host work, so the two hooks and the range each call gets weigh the most they can.
- In a window: one long recorded window in which the module ranges are switched on and off every other step
  (``ModelCapture.sync``, as a session does at a window's start and end). Each step is paired with the next, so the
  process's drift cancels; the cost is the median of the paired ratios, with their range.
- The hooks alone: what a module call gains from them and its range while a profiler records (``hook_cost``: the
  fastest of several repeats, which a busy machine cannot inflate), times the module calls of a step, against the step.
- Outside windows the hooks are gone; what is left is the session's per-step call: ``s.step()`` is timed long after
  the window, with and without ``model=``, each in a fresh process, and its difference set against the step.

    python benchmarks/module_overhead.py --out benchmarks/results/module_overhead-cpu.json
    python benchmarks/module_overhead.py --quick          # CI smoke test
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

import kprof_callbacks as kprof
from kprof_callbacks.attribution import ModelCapture

from _isolated import Isolated
from _record import command, header

SIZES = {"full": (256, 24, 64, 60), "quick": (32, 4, 8, 20)}  # width, blocks, batch, paired steps
TARGETS = {"inside": 0.05, "outside": 0.01}


class Loop:
    """The launch-bound model, its optimizer and one batch."""

    def __init__(self, width: int, blocks: int, batch: int) -> None:
        torch.manual_seed(0)
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        layers = [nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(blocks)]
        self.model = nn.Sequential(*layers).to(self.device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.x = torch.randn(batch, width, device=self.device)
        self.calls = 1 + 3 * blocks  # module calls a forward makes

    def step(self) -> float:
        """One training step; its seconds (the GPU's work included)."""
        start = time.perf_counter()
        self.model(self.x).square().mean().backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if self.device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start


def inside(sizes: str) -> dict:
    """Paired steps in one recorded window, module ranges on in the first of each pair and off in the second."""
    width, blocks, batch, pairs = SIZES[sizes]
    loop = Loop(width, blocks, batch)
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


def step_call(sizes: str, with_model: bool) -> dict:
    """``s.step()``'s own time long after the window (median over the steps), and the step's."""
    width, blocks, batch, pairs = SIZES[sizes]
    loop = Loop(width, blocks, batch)
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
    p.add_argument("--quick", action="store_true", help="a tiny model, few steps (CI smoke test)")
    p.add_argument("--rounds", type=int, default=3, help="fresh processes per measurement")
    p.add_argument("--out", type=Path, help="write the result of record here")
    args = p.parse_args(argv)
    sizes = "quick" if args.quick else "full"
    rounds = 1 if args.quick else args.rounds
    isolated = Isolated(preload=("torch", "kprof_callbacks"), timeout=900)
    rows = []
    for k in range(rounds):
        got = isolated(inside, sizes)
        with_model, without = isolated(step_call, sizes, True), isolated(step_call, sizes, False)
        extra_us = with_model["call_us"] - without["call_us"]
        hook_us = isolated(hook_cost)
        estimated = hook_us * got["module_calls"] / 1e3 / without["step_ms"]
        rows.append(dict(got, round=k + 1, outside_us=extra_us, outside=extra_us / 1e3 / without["step_ms"]))
        rows[-1].update(hook_us=hook_us, step_alone_ms=without["step_ms"], estimated_inside=estimated)
        print(f"  round {k + 1}: {rows[-1]}", file=sys.stderr, flush=True)
    result = _record(rows, sizes, isolated.cores)
    print(render(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


def _record(rows: list[dict], sizes: str, cores: list[int]) -> dict:
    width, blocks, batch, pairs = SIZES[sizes]
    cuda = torch.cuda.is_available()
    return {
        **header(
            torch.cuda.get_device_name() if cuda else f"CPU, {len(cores)} pinned cores ({platform.machine()})",
            command("module_overhead.py", None),
        ),
        "model": f"{blocks} blocks of Linear({width}, {width}) + ReLU, batch {batch}, AdamW; {pairs} step pairs",
        "targets": TARGETS,
        "rows": [
            {
                "round": r["round"],
                "step_ms": round(r["step_ms"], 3),
                "module_calls": r["module_calls"],
                "per_call_us": round(r["per_call_us"], 2),
                "inside": [round(x, 4) for x in r["inside"]],
                "hook_us": round(r["hook_us"], 2),
                "estimated_inside": round(r["estimated_inside"], 4),
                "outside_us": round(r["outside_us"], 2),
                "outside": round(r["outside"], 5),
            }
            for r in rows
        ],
    }


def render(result: dict) -> str:
    lines = [
        f"{result['device']}, torch {result['versions']['torch']}; {result['model']}",
        "",
        "| round | step ms | module calls a step | in a window: paired steps (median, range) | hooks µs a call | "
        "in a window: calls x hooks / step | outside: s.step() µs more | outside, of the step |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        mid, lo, hi = r["inside"]
        lines.append(
            f"| {r['round']} | {r['step_ms']:.3f} | {r['module_calls']} | {mid:+.1%} ({lo:+.1%} .. {hi:+.1%}) | "
            f"{r['hook_us']:.2f} | {r['estimated_inside']:+.2%} | {r['outside_us']:+.2f} | {r['outside']:+.3%} |"
        )
    inside = statistics.median(r["inside"][0] for r in result["rows"])
    outside = statistics.median(r["outside"] for r in result["rows"])
    lines += [
        "",
        f"in a window: {inside:+.1%} (target <= {TARGETS['inside']:.0%}); "
        f"outside: {outside:+.3%} (target <= {TARGETS['outside']:.0%})",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
