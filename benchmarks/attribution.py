"""Time by module on GPT-2 small, eager, compiled and in CUDA graphs: does the module view hold where it matters?

Each run trains models.GPT (GPT-2 small, bf16 autocast, fused AdamW, batch 8 x 512) under
``kprof.session(model=..., record_shapes=True)`` in a fresh process, summarizes it and checks:
- the module rows (the model forward and backward, the optimizer), without what runs outside modules and what is
  unattributed, add up to the steps' GPU busy time within 5%;
- the loss head is named by its finding in lm_head, with its share of GPU time (about 30% on this model);
- compiled: at least 95% of the compiled graphs' GPU time is attributed to a module by the record;
- the advice fits how the model runs: compile an eager model, ``mode="reduce-overhead"`` for a compiled one,
  neither for one in CUDA graphs (``kprof.session`` reads the mode from the trace);
- a model with a forced graph break (a small GPT whose loss is computed after ``torch._dynamo.graph_break()``) has
  one graph break a step counted.

    python benchmarks/attribution.py --out benchmarks/results/attribution-h100.json    # ~5 min on an H100
    python benchmarks/attribution.py --quick         # a tiny GPT on the CPU, eager and compiled (CI smoke test)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import kprof_callbacks as kprof
from kprof_callbacks import models

from _isolated import Isolated
from _record import command, header

MODES = {"eager": None, "compiled": "default", "reduce-overhead": "reduce-overhead", "graph break": "default"}
QUICK_MODES = ("eager", "compiled", "graph break")
SCHEDULE = {"wait": 3, "warmup": 1, "active": 3}  # the first steps compile, and CUDA graphs are recorded
BUSY_GAP, ATTRIBUTED = 0.05, 0.95
UNPLACED = ("(outside modules)", "(unattributed)")  # module-view rows of time no module or range holds


class Broken(nn.Module):
    """A GPT whose loss is computed after a graph break (two compiled graphs a step)."""

    def __init__(self, cfg: models.GPTConfig) -> None:
        super().__init__()
        self.gpt = models.GPT(cfg)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.gpt(idx)
        torch._dynamo.graph_break()
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def _model(mode: str, quick: bool, device: str) -> nn.Module:
    if mode == "graph break":
        small = (
            models.tiny()
            if quick
            else models.GPTConfig(n_layer=2, n_head=4, n_embd=256, vocab_size=50304, block_size=512)
        )
        return Broken(small).to(device)
    return models.GPT(models.tiny() if quick else models.gpt2_small()).to(device)


def run(mode: str, quick: bool) -> dict:
    """Train ``mode``'s model under kprof.session in this (fresh) process; its summary's figures."""
    device = "cuda" if torch.cuda.is_available() and not quick else "cpu"
    torch.manual_seed(0)
    model = _model(mode, quick, device)
    cfg = model.gpt.cfg if isinstance(model, Broken) else model.cfg
    batches = models.random_batches(cfg, n=4, batch=2 if quick else 8, device=device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
    step_model = model if MODES[mode] is None else torch.compile(model, mode=MODES[mode])
    autocast = torch.autocast(device, torch.bfloat16) if device == "cuda" else contextlib.nullcontext()
    steps = sum(SCHEDULE.values()) + 1
    with tempfile.TemporaryDirectory() as logdir:
        with kprof.session(logdir, run=mode.replace(" ", "-"), model=model, record_shapes=True, **SCHEDULE) as s:
            for k in range(steps):
                idx, targets = batches[k % len(batches)]
                with autocast:
                    loss = step_model(idx, targets)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                s.step(samples=idx.shape[0])
        return figures(s.summary())


def figures(s) -> dict:
    """What the checks read from a Summary."""
    gpu = s.has_gpu
    busy = sum(step.gpu_busy_us for step in s.steps)
    top = sum((r.gpu_us if gpu else r.cpu_us) for r in s.modules if r.depth == 0 and r.name not in UNPLACED)
    total = busy if gpu else sum(step.wall_us for step in s.steps)
    unattributed = sum(r.gpu_us if gpu else r.cpu_us for r in s.modules if r.name == "(unattributed)")
    graphs = s.compiled.get("graphs", {})
    compiled_us = sum(g["gpu_us"] for g in graphs.values())
    head = next((d.message for d in s.diagnostics if d.kind == "loss_head"), "")
    share = re.match(r"The loss head takes (\d+(?:\.\d+)?)%", head)
    return {
        "steps": len(s.steps),
        "step_ms": statistics.median(step.wall_us for step in s.steps) / 1e3,
        "gpu_busy_ms": busy / len(s.steps) / 1e3,
        "modules_ms": top / len(s.steps) / 1e3,
        "modules_vs_busy": top / total - 1 if total else None,
        "unattributed": unattributed / total if total else None,
        "compiled_attributed": sum(g["matched_us"] for g in graphs.values()) / compiled_us if compiled_us else None,
        "loss_head": float(share[1]) / 100 if share else None,
        "loss_head_in": head.partition("; in ")[2].partition("):")[0] if head else "",
        "graphs_per_step": s.compiled.get("graphs_per_step", 0),
        "recompiled": s.compiled.get("recompiled", []),
        "breaks_per_step": s.compiled.get("breaks_per_step", 0),
        "findings": {d.kind: d.message for d in s.diagnostics},
        "top_modules": [(r.name, r.direction, round(r.share, 4)) for r in s.modules if r.depth <= 1],
    }


def checks(mode: str, got: dict, gpu: bool) -> dict[str, bool | None]:
    """Each "done when" of the module view, met or not (None where it does not apply here)."""
    advice = " ".join(got["findings"].values())
    out: dict[str, bool | None] = {
        "modules add up to GPU busy (5%)": abs(got["modules_vs_busy"]) <= BUSY_GAP if gpu else None,
        "loss head named": (got["loss_head"] is not None and "lm_head" in got["loss_head_in"])
        if gpu and mode != "graph break"
        else None,
    }
    if mode in ("compiled", "reduce-overhead"):
        out[">= 95% of compiled GPU time attributed"] = (got["compiled_attributed"] or 0) >= ATTRIBUTED if gpu else None
        out["no recompilation (module hooks come and go)"] = not got["recompiled"]
    if mode == "eager":
        out["advice: compile"] = "fuse ops with torch.compile" in advice if gpu else None
    if mode == "compiled":
        out["advice: reduce-overhead"] = 'mode="reduce-overhead"' in advice if gpu else None
    if mode == "reduce-overhead":
        out["advice: neither"] = "reduce-overhead" not in advice and "fuse ops with torch.compile" not in advice
    if mode == "graph break":
        out["graph break counted"] = got["breaks_per_step"] == 1 and got["graphs_per_step"] == 2
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a tiny GPT on the CPU, eager and compiled")
    p.add_argument("--out", type=Path, help="write the result of record here")
    args = p.parse_args(argv)
    gpu = torch.cuda.is_available() and not args.quick
    isolated = Isolated(preload=("torch", "kprof_callbacks"), timeout=400)
    rows = []
    for mode in QUICK_MODES if args.quick else MODES:
        started = time.monotonic()
        got = isolated(run, mode, args.quick)
        met = checks(mode, got, gpu)
        verdict = ", ".join(f"{k}: {'met' if v else 'MISSED'}" for k, v in met.items() if v is not None) or "-"
        rows.append(dict(mode=mode, seconds=round(time.monotonic() - started, 1), **got, checks=met, verdict=verdict))
        print(f"  {mode}: {rows[-1]['checks']} ({rows[-1]['seconds']} s)", file=sys.stderr, flush=True)
    result = {
        **header(
            torch.cuda.get_device_name() if gpu else f"CPU ({platform.machine()})", command("attribution.py", argv)
        ),
        "model": "tiny GPT" if args.quick else "GPT-2 small, bf16 autocast, fused AdamW, batch 8 x 512",
        "rows": rows,
        "met": all(v for r in rows for v in r["checks"].values() if v is not None),
    }
    print(render(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


def _cell(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def render(result: dict) -> str:
    lines = [
        f"{result['device']}, torch {result['versions']['torch']}; {result['model']}",
        "",
        "| run | step ms | GPU busy ms | modules ms | vs busy | loss head | unattributed | compiled attributed | "
        "graphs / breaks a step | checks |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['mode']} | {r['step_ms']:.1f} | {r['gpu_busy_ms']:.1f} | {r['modules_ms']:.1f} | "
            f"{_cell(r['modules_vs_busy'], '+.1%')} | {_cell(r['loss_head'], '.0%')} {r['loss_head_in']} | "
            f"{_cell(r['unattributed'], '.1%')} | {_cell(r['compiled_attributed'], '.1%')} | "
            f"{r['graphs_per_step']:g} / {r['breaks_per_step']:g} | {r['verdict']} |"
        )
    lines += ["", f"all checks met: {result['met']}"]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
