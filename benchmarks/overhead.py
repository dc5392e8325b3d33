"""Step-time cost of profiling a training loop: no profiler vs raw torch.profiler vs kprof.session.

For a launch-bound MLP (many small kernels) and a compute-bound one, it measures the median step time
- with no profiler,
- long after the profiled window ended (raw torch.profiler and kprof: both objects still alive),
- inside an active window (raw torch.profiler and kprof, same options),
and how long the training thread is blocked by the step that closes a window (raw torch.profiler with
``tensorboard_trace_handler`` vs kprof), with the trace size. Every measurement runs in a fresh process, in
interleaved rounds so clock drift hits all modes alike.

    python benchmarks/overhead.py [--quick] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from torch import nn

import kprof_callbacks as kprof


def mlp(width: int, depth: int) -> nn.Module:
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers)


class Loop:
    """One model + optimizer + fixed batch; ``run`` trains ``steps`` steps and returns per-step seconds."""

    def __init__(self, width: int, depth: int, batch: int, device: str) -> None:
        torch.manual_seed(0)
        self.device = device
        self.model = mlp(width, depth).to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.x = torch.randn(batch, width, device=device)

    def train_step(self) -> None:
        loss = self.model(self.x).square().mean()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def run(self, steps: int, step_hook=lambda: None) -> tuple[list[float], list[float]]:
        """Per-step device time (CUDA events, or perf_counter on CPU) and host time spent in ``step_hook``."""
        cuda = self.device == "cuda"
        marks, hook_s = [], []
        for _ in range(steps):
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            t0 = time.perf_counter()
            self.train_step()
            t1 = time.perf_counter()
            step_hook()
            hook_s.append(time.perf_counter() - t1)
            if cuda:
                end.record()
                torch.cuda.synchronize()
                marks.append(start.elapsed_time(end) / 1e3)
            else:
                marks.append(time.perf_counter() - t0)
        return marks, hook_s


def measure(loop: Loop, mode: str, steps: int, logdir: Path) -> dict:
    """Median step time in the part of the run that ``mode`` is about, plus the blocking of window-closing steps."""
    window = dict(wait=1, warmup=1, active=3, repeat=1)
    if mode == "none":
        times, _ = loop.run(steps)
        return {"median_ms": statistics.median(times[5:]) * 1e3}
    inside = mode.endswith("inside")
    sched = dict(wait=0, warmup=2, active=steps, repeat=1) if inside else window
    measured = slice(3, steps - 1) if inside else slice(10, steps)
    if mode.startswith("raw"):
        prof = torch.profiler.profile(
            activities=_activities(),
            schedule=torch.profiler.schedule(**sched),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(str(logdir / "raw")),
        )
        with prof:
            times, _ = loop.run(steps, prof.step)
    else:
        with kprof.session(logdir, run=f"{mode}-{time.time_ns()}", **sched) as s:
            times, _ = loop.run(steps, s.step)
    return {"median_ms": statistics.median(times[measured]) * 1e3}


def blocking(loop: Loop, tool: str, active: int, logdir: Path) -> dict:
    """Host seconds spent in the step() call that closes a window of ``active`` steps, and the trace's size."""
    out = logdir / f"{tool}-{time.time_ns()}"
    sched = dict(wait=0, warmup=1, active=active, repeat=1)
    if tool == "raw":
        prof = torch.profiler.profile(
            activities=_activities(),
            schedule=torch.profiler.schedule(**sched),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(str(out)),
        )
        with prof:
            _, hooks = loop.run(active + 3, prof.step)
        files = list(out.glob("*.pt.trace.json"))
    else:
        with kprof.session(out.parent, run=out.name, **sched) as s:
            _, hooks = loop.run(active + 3, s.step)
        files = s.trace_files
    return {"blocked_ms": hooks[active] * 1e3, "trace_mb": sum(f.stat().st_size for f in files) / 2**20}


def _activities():
    acts = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return acts


# Each mode runs in a fresh process: once CUPTI has attached to a process (the first CUDA trace), it can keep
# taxing every kernel launch there, so measuring "none" after a profiled mode in the same process is not "none".
MODES = ("none", "raw-outside", "kprof-outside", "kprof-outside-cupti-kept", "raw-inside", "kprof-inside")
ENV = {"kprof-outside-cupti-kept": {"TEARDOWN_CUPTI": "0"}}  # kineto's default, which kprof overrides


def child(args: argparse.Namespace) -> dict:
    """One measurement in this (fresh) process; the parent reads the JSON it prints."""
    loop = Loop(*MODELS[args.device][args.model], args.device)
    loop.run(10)  # warm up allocator, cuBLAS handles, autotuning
    with tempfile.TemporaryDirectory() as tmp:
        if args.blocking:
            return blocking(loop, args.blocking, args.active, Path(tmp))
        return measure(loop, args.mode.replace("-cupti-kept", ""), args.steps, Path(tmp))


def spawn(**kw) -> dict:
    argv = [sys.executable, __file__, "--child"] + [f"--{k}={v}" for k, v in kw.items() if k != "env"]
    env = {**os.environ, **kw.get("env", {})}
    done = subprocess.run(argv, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


MODELS = {  # (width, depth, batch)
    "cuda": {"launch-bound": (256, 24, 64), "compute-bound": (8192, 4, 2048)},
    "cpu": {"launch-bound": (256, 24, 64), "compute-bound": (2048, 2, 512)},
    "quick": {"launch-bound": (64, 4, 16), "compute-bound": (256, 2, 64)},
}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes, one round (CI smoke test)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds, each mode in a fresh process")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--out", type=Path, default=None, help="write results as JSON here")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    p.add_argument("--blocking", help=argparse.SUPPRESS)
    p.add_argument("--active", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        if args.device == "quick":
            args.device = "cpu"
            MODELS["cpu"] = MODELS["quick"]
        print(json.dumps(child(args)))
        return {}
    sizes = "quick" if args.quick else args.device
    if args.quick:
        args.rounds, args.steps, active_sizes = 1, 20, (3,)
    else:
        active_sizes = (3, 30)
    results = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "torch": torch.__version__,
               "cuda": torch.version.cuda, "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
               "rounds": args.rounds, "step": {}, "blocking": {}}
    for name in MODELS[sizes]:
        per_mode = {m: [] for m in MODES}
        for _ in range(args.rounds):
            for mode in MODES:
                r = spawn(device=sizes, model=name, mode=mode, steps=args.steps, env=ENV.get(mode, {}))
                per_mode[mode].append(r["median_ms"])
                print(f"  {name} {mode}: {r['median_ms']:.3f} ms", file=sys.stderr, flush=True)
        results["step"][name] = {m: statistics.median(v) for m, v in per_mode.items()}
        results["step"][name]["rounds"] = per_mode
    for active in active_sizes:
        results["blocking"][active] = {
            tool: spawn(device=sizes, model="launch-bound", blocking=tool, active=active) for tool in ("raw", "kprof")
        }
    print(render(results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    return results


def render(results: dict) -> str:
    lines = [f"device: {results['device']}, torch {results['torch']} (CUDA {results['cuda']}), {results['date']}; "
             f"median of {results['rounds']} interleaved rounds, each mode in a fresh process", ""]
    lines += ["| model | " + " | ".join(MODES) + " | kprof outside vs none | kprof inside vs raw inside |",
              "|---" * (len(MODES) + 3) + "|"]
    for name, row in results["step"].items():
        cells = " | ".join(f"{row[m]:.3f} ms" for m in MODES)
        out = (row["kprof-outside"] / row["none"] - 1) * 100
        ins = (row["kprof-inside"] / row["raw-inside"] - 1) * 100
        lines.append(f"| {name} | {cells} | {out:+.1f}% | {ins:+.1f}% |")
    lines += ["", "| active steps | raw + tensorboard_trace_handler: blocked | kprof: blocked | trace MB |", "|---|---|---|---|"]
    for active, row in results["blocking"].items():
        lines.append(f"| {active} | {row['raw']['blocked_ms']:.1f} ms | {row['kprof']['blocked_ms']:.1f} ms | "
                     f"{row['kprof']['trace_mb']:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
