"""Step-time cost of profiling a training loop: no profiler vs raw torch.profiler vs kprof.session.

For a launch-bound MLP (many small kernels) and a compute-bound one, it measures the median step time
- with no profiler,
- long after the profiled window ended (raw torch.profiler and kprof: both objects still alive),
- inside an active window (raw torch.profiler and kprof, same options),
and how long the training thread is blocked by the step that closes a window (raw torch.profiler with
``tensorboard_trace_handler`` vs kprof), with the part of it spent inside torch, and the trace size. Every
measurement runs in a fresh process pinned to the same cores (``_isolated.py``), in interleaved rounds.

A host-bound step's speed differs between fresh processes of the same code by up to 30% on an H100 host (why, we
have not found), far more than the 1% to be measured. So each process first trains with no profiler (its own
baseline), then runs its mode: its *relative* step time is the mode's median over the baseline's. kprof's cost is
the ratio of relative step times within each round (kprof outside vs none, kprof inside vs raw inside), reported
as the median and range over rounds, so a process's own speed and drift between rounds cancel. Drift *within* a
process does not; the "none vs its own baseline" column shows how large it is.

    python benchmarks/overhead.py [--quick] [--rounds N] [--seconds S] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

import kprof_callbacks as kprof

from _isolated import Isolated, change_cell
from _isolated import rounds as budget_rounds
from _record import commit


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
    """Host time of the step() call that closes a window of ``active`` steps, the part of it spent in torch's
    ``_disable_profiler()`` (stopping kineto and collecting its events), and the trace's size."""
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
            stats = prof.profiler._stats
        files = list(out.glob("*.pt.trace.json"))
    else:
        with kprof.session(out.parent, run=out.name, **sched) as s:
            _, hooks = loop.run(active + 3, s.step)
            stats = s._recorder.prof.profiler._stats
        files = s.trace_files
    return {
        "blocked_ms": hooks[active] * 1e3,
        "disable_ms": stats.profiler_disable_call_duration_us / 1e3,
        "trace_mb": sum(f.stat().st_size for f in files) / 2**20,
    }


def _activities():
    acts = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return acts


MODES = ("none", "raw-outside", "kprof-outside", "raw-inside", "kprof-inside")
MODELS = {  # sizes -> model -> (width, depth, batch, steps)
    "cuda": {"launch-bound": (256, 24, 64, 60), "compute-bound": (8192, 4, 1024, 25)},
    "cpu": {"launch-bound": (256, 24, 64, 60), "compute-bound": (2048, 2, 512, 25)},
    "quick": {"launch-bound": (64, 4, 16, 20), "compute-bound": (256, 2, 64, 20)},
}
# A compute-bound step is the GPU's: its modes agree within 0.3% in every process, so one round tells all and the
# time budget goes to the launch-bound model's rounds, whose host-bound steps are noisy.
ONE_ROUND = {"compute-bound"}


def one(sizes: str, model: str, mode: str | None = None, tool: str | None = None, active: int = 0) -> dict:
    """One measurement (a step-time ``mode``, or the window-end block of ``tool``), in a fresh process."""
    width, depth, batch, steps = MODELS[sizes][model]
    loop = Loop(width, depth, batch, "cuda" if sizes == "cuda" else "cpu")
    loop.run(10)  # warm up allocator, cuBLAS handles, autotuning
    with tempfile.TemporaryDirectory() as tmp:
        if tool is not None:
            return blocking(loop, tool, active, Path(tmp))
        baseline, _ = loop.run(steps)  # this process's own speed with no profiler
        result = measure(loop, mode, steps, Path(tmp))
        baseline_ms = statistics.median(baseline[5:]) * 1e3
        return {**result, "baseline_ms": baseline_ms, "relative": result["median_ms"] / baseline_ms}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes, one round (CI smoke test)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds, each measurement in a fresh process")
    p.add_argument(
        "--seconds", type=float, help="start no round that would end past this budget (one round always runs)"
    )
    p.add_argument("--out", type=Path, default=None, help="write results as JSON here")
    args = p.parse_args(argv)
    started = time.monotonic()
    sizes = "quick" if args.quick else "cuda" if torch.cuda.is_available() else "cpu"
    rounds, active_sizes = (1, (3,)) if args.quick else (args.rounds, (3, 30))
    # torch.optim imports torch._dynamo at an optimizer's first use: 1.5-2 s in every fresh process, imported once here
    isolated = Isolated(preload=("torch", "torch._dynamo", "kprof_callbacks"))
    results = {
        "commit": commit(),
        "device": torch.cuda.get_device_name() if sizes == "cuda" else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": time.strftime("%Y-%m-%d"),
        "command": " ".join(sys.argv),
        "cores": isolated.cores,
        "blocking": {},
    }
    for active in active_sizes:
        results["blocking"][active] = {
            tool: isolated(one, sizes, "launch-bound", tool=tool, active=active) for tool in ("raw", "kprof")
        }
        print(
            f"  blocked at the end of {active} active steps: {results['blocking'][active]}", file=sys.stderr, flush=True
        )
    per_mode = {name: {m: [] for m in MODES} for name in MODELS[sizes]}

    def one_round(done: int, names: list[str]) -> None:
        for name in names:
            for mode in MODES:
                called = time.monotonic()
                r = isolated(one, sizes, name, mode=mode)
                per_mode[name][mode].append(r)
                print(
                    f"  round {done} {name} {mode}: {r['median_ms']:.3f} ms, its baseline {r['baseline_ms']:.3f} ms "
                    f"(x{r['relative']:.3f}); {time.monotonic() - called:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )

    one_round(1, [name for name in MODELS[sizes] if name in ONE_ROUND])
    left = None if args.seconds is None else args.seconds - (time.monotonic() - started)
    for done in budget_rounds(rounds, left):
        one_round(done, [name for name in MODELS[sizes] if name not in ONE_ROUND])
    results["rounds"] = done
    results["step"] = {name: _step_result(mine) for name, mine in per_mode.items()}
    print(render(results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    return results


def _step_result(rounds: dict[str, list[dict]]) -> dict:
    """One model's rounds by mode: the median step time and change per mode, and the paired ratios the targets use."""
    relative = {m: [r["relative"] for r in runs] for m, runs in rounds.items()}
    return {
        **{m: statistics.median(r["median_ms"] for r in runs) for m, runs in rounds.items()},
        "relative": {m: statistics.median(v) for m, v in relative.items()},
        "rounds": rounds,
        "ratios": {  # paired within each round, each process against its own baseline
            "outside": [k / n for k, n in zip(relative["kprof-outside"], relative["none"])],
            "inside": [k / r for k, r in zip(relative["kprof-inside"], relative["raw-inside"])],
            "none": relative["none"],  # no profiler vs its own baseline: the noise the two ratios above sit in
        },
    }


def render(results: dict) -> str:
    lines = [
        f"device: {results['device']}, torch {results['torch']} (CUDA {results['cuda']}), {results['date']}; "
        "median of interleaved rounds, each mode in a fresh process; "
        "step time (x that process's own no-profiler baseline)",
        "",
    ]
    lines += [
        "| model | rounds | " + " | ".join(MODES) + " | kprof outside vs none | kprof inside vs raw inside | "
        "none vs its own baseline (noise) |",
        "|---" * (len(MODES) + 5) + "|",
    ]
    for name, row in results["step"].items():
        cells = " | ".join(f"{row[m]:.3f} ms (x{row['relative'][m]:.3f})" for m in MODES)
        ratios = row["ratios"]
        lines.append(
            f"| {name} | {len(ratios['none'])} | {cells} | {change_cell(ratios['outside'])} | "
            f"{change_cell(ratios['inside'])} | {change_cell(ratios['none'])} |"
        )
    lines += [
        "",
        "| active steps | raw + tensorboard_trace_handler: blocked (in `_disable_profiler`) | "
        "kprof: blocked (in `_disable_profiler`) | trace MB |",
        "|---|---|---|---|",
    ]
    for active, row in results["blocking"].items():
        raw, ours = row["raw"], row["kprof"]
        lines.append(
            f"| {active} | {raw['blocked_ms']:.1f} ms ({raw['disable_ms']:.1f}) | "
            f"{ours['blocked_ms']:.1f} ms ({ours['disable_ms']:.1f}) | {ours['trace_mb']:.1f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
