"""Step-time cost of profiling a Lightning fit: no profiler vs Lightning's PyTorchProfiler vs kprof.ProfilerCallback.

One LightningModule (a launch-bound MLP: width 256, depth 24, batch 64, AdamW; the batch already on the device),
one schedule (wait=1, warmup=1, active=3, repeat=2). Each variant runs in a fresh process, because a profiler leaves
process-wide state behind (kineto leaves CUPTI attached after a CUDA trace unless TEARDOWN_CUPTI=1, which
kprof sets unless the user did); the processes are forked from one that has the imports done, pinned to the same
cores (``_isolated.py``), in interleaved rounds. Per variant:
- median step time inside the first window (batches 1-4: warm-up + recorded) and long after it (the last half);
  the change vs none compares each process's time long after the windows with its own speed, measured by a fit
  with no profiler in the same process first (fresh processes of the same code differ by up to 30% on an H100
  host), paired within each round,
- teardown: the training thread's time from the last batch to ``fit()`` returning (Lightning: its summary table;
  kprof: waiting for trace writes + the summary),
- trace files written (repeat=2 should give two) and, on a GPU, how many GPU kernels they hold.
A step is timed between consecutive ``on_train_batch_end`` calls, with a device sync there (CUDA events on GPU).
The sync is for measurement only: it keeps one step's GPU tail out of the next step's time.

    python benchmarks/lightning_overhead.py [--quick] [--steps N] [--rounds N] [--seconds S] [--variants ...] [--out F]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _isolated import Isolated, change_cell
from _isolated import rounds as budget_rounds
from _record import commit

SCHEDULE = dict(wait=1, warmup=1, active=3, repeat=2)
WINDOW = range(1, 5)  # batches of the first window in both profilers: warm-up at 1, recorded 2-4
# name -> (profiler, options, extra environment). The last rows only explain where the cost comes from.
VARIANTS = {
    "none": ("none", {}, {}),
    "lightning PyTorchProfiler": ("lightning", {}, {}),
    "kprof ProfilerCallback": ("kprof", {}, {}),
    "lightning, record_module_names=False": ("lightning", {"record_module_names": False}, {}),
    "lightning, TEARDOWN_CUPTI=1": ("lightning", {}, {"TEARDOWN_CUPTI": "1"}),
    "lightning, record_module_names=False, TEARDOWN_CUPTI=1": (
        "lightning",
        {"record_module_names": False},
        {"TEARDOWN_CUPTI": "1"},
    ),
    "kprof, TEARDOWN_CUPTI=0 (kineto's default)": ("kprof", {}, {"TEARDOWN_CUPTI": "0"}),
}
CUDA_ONLY = {name for name, (_, _, env) in VARIANTS.items() if "TEARDOWN_CUPTI" in env}


def run_variant(name: str, steps: int, logdir: Path) -> dict:
    """Train ``steps`` batches with the variant's profiler in this process; step times and teardown seconds."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    batch = torch.randn(64, 256, device=device)
    data = torch.utils.data.DataLoader([batch] * steps, batch_size=None)
    clock = _step_clock(device)
    _trainer(name, steps, logdir, device, clock).fit(_mlp(), data)
    teardown = time.perf_counter() - clock.last_end
    traces = sorted(logdir.rglob("*.pt.trace.json*"))
    return {
        # times[i] is batch i + 1 (batch 0 has no previous end)
        "window_ms": statistics.median(clock.times[i - 1] for i in WINDOW) * 1e3,
        "after_ms": statistics.median(clock.times[len(clock.times) // 2 :]) * 1e3,
        "slowest_in_batches_1_10_ms": max(clock.times[:10]) * 1e3,  # a stall at a window boundary shows here
        "teardown_s": teardown,
        "trace_files": len(traces),
        "gpu_kernels": [_kernels(p) for p in traces] if device == "cuda" else None,
    }


def _trainer(name: str, steps: int, logdir: Path, device: str, clock):
    """A Trainer with the variant's profiler (Lightning's, kprof's callback or none) and the step clock."""
    import lightning as L
    import torch
    from lightning.pytorch.profilers import PyTorchProfiler

    import kprof_callbacks as kprof

    kind, options, _ = VARIANTS[name]
    callbacks: list = [clock]
    profiler = None
    if kind == "lightning":
        schedule = torch.profiler.schedule(**SCHEDULE)
        profiler = PyTorchProfiler(dirpath=logdir, filename="lightning", schedule=schedule, **options)
    elif kind == "kprof":
        callbacks.append(kprof.ProfilerCallback(logdir=logdir, run="kprof", **SCHEDULE, **options))
    return L.Trainer(
        accelerator=device,
        devices=1,
        max_steps=steps,
        logger=False,
        profiler=profiler,
        callbacks=callbacks,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=logdir,
    )


def _mlp():
    """The launch-bound model: 24 Linear(256) + ReLU blocks, AdamW."""
    import lightning as L
    import torch
    from torch import nn

    class MLP(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(*(m for _ in range(24) for m in (nn.Linear(256, 256), nn.ReLU())))

        def training_step(self, batch, batch_idx):
            return self.net(batch).square().mean()

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    return MLP()


def _step_clock(device: str):
    """A callback that keeps the seconds between consecutive batch ends, each measured after a sync."""
    import lightning as L
    import torch

    class StepClock(L.Callback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.last_end = 0.0
            self._event = None

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if device == "cuda":
                event = torch.cuda.Event(enable_timing=True)
                event.record()
                event.synchronize()
                if self._event is not None:
                    self.times.append(self._event.elapsed_time(event) / 1e3)
                self._event = event
            else:
                now = time.perf_counter()
                if self.last_end:
                    self.times.append(now - self.last_end)
            self.last_end = time.perf_counter()

    return StepClock()


def _kernels(path: Path) -> int:
    return sum(e.get("cat") == "kernel" for e in json.loads(path.read_text())["traceEvents"])


def environment() -> dict:
    import lightning
    import torch

    cuda = torch.cuda.is_available()
    return {
        "commit": commit(),
        "device": torch.cuda.get_device_name() if cuda else platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "lightning": lightning.__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def table(results: dict, env: dict, steps: int, rounds: int) -> str:
    lines = [
        f"Lightning fit, launch-bound MLP (256x24, batch 64, AdamW), schedule {SCHEDULE}, {steps} batches, "
        f"{env['device']}, torch {env['torch']}, lightning {env['lightning']}; median round of {rounds}, "
        "after vs none: each process against its own no-profiler fit, median and range of the per-round change",
        "",
        "| variant | in window (ms) | long after (ms) | same process, no profiler (ms) | after vs none "
        "| slowest of batches 1-10 (ms) | teardown (s) | trace files | GPU kernels per file |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, r in results.items():
        kernels = "-" if r["gpu_kernels"] is None else ", ".join(map(str, r["gpu_kernels"])) or "0"
        lines.append(
            f"| {name} | {r['window_ms']:.2f} | {r['after_ms']:.2f} | {r['baseline_after_ms']:.2f} | "
            f"{change_cell(r['after_ratio_to_none'])} | "
            f"{r['slowest_in_batches_1_10_ms']:.1f} | {r['teardown_s']:.2f} | {r['trace_files']} | {kernels} |"
        )
    return "\n".join(lines)


def one(name: str, steps: int) -> dict:
    """The variant in this fresh process, after a fit with no profiler that gives the process's own speed."""
    with tempfile.TemporaryDirectory() as logdir:
        baseline = run_variant("none", steps // 2, Path(logdir) / "baseline")
        result = run_variant(name, steps, Path(logdir) / "variant")
    return {**result, "baseline_after_ms": baseline["after_ms"], "relative": result["after_ms"] / baseline["after_ms"]}


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="20 batches, one round, the three compared variants: a CPU smoke run"
    )
    parser.add_argument("--steps", type=int, help="batches per variant (default 300, 20 with --quick)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds, each variant in a fresh process")
    parser.add_argument(
        "--seconds", type=float, help="start no round that would end past this budget (one round always runs)"
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=list(VARIANTS),
        help="the variants to run (default: all, with --quick the first three; 'none' is needed, the others are "
        "compared with it)",
    )
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    args.variants = args.variants or list(VARIANTS)[: 3 if args.quick else None]  # the rows after explain costs
    if "none" not in args.variants:
        parser.error("--variants must include 'none': the others are compared with it")
    args.steps = args.steps or (20 if args.quick else 300)
    args.rounds = 1 if args.quick else args.rounds
    if args.steps < 20:
        parser.error("--steps must be >= 20 (the window plus a stretch long after it)")
    return args


def main() -> None:
    args = _arguments()
    steps, rounds = args.steps, args.rounds
    import torch

    env = environment()
    isolated = Isolated(preload=("torch", "lightning", "kprof_callbacks"))
    names = [n for n in args.variants if torch.cuda.is_available() or n not in CUDA_ONLY]
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for done in budget_rounds(rounds, args.seconds):
        for name in names:
            runs[name].append(isolated(one, name, steps, env=VARIANTS[name][2]))
            print(f"round {done} {name}: {runs[name][-1]}", file=sys.stderr, flush=True)
    results = {}
    for name, mine in runs.items():
        # the median round (by the time long after the windows) stands for the variant; the change vs none is
        # paired within each round, so drift between rounds cancels
        results[name] = {
            **sorted(mine, key=lambda r: r["after_ms"])[len(mine) // 2],
            "after_ratio_to_none": [r["relative"] / n["relative"] for r, n in zip(mine, runs["none"])],
        }
    print(table(results, env, steps, done))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {
                    "environment": env,
                    "steps": steps,
                    "rounds": done,
                    "schedule": SCHEDULE,
                    "cores": isolated.cores,
                    "runs": runs,
                    "results": results,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
