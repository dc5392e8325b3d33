"""Time `kprof.summarize` against torch's `prof.key_averages()` on the same profiles.

Each row profiles a small MLP training loop on CPU (record_shapes=True) for enough steps
to reach the target trace size, then times, on that one profile:
  - key_averages: the first `prof.key_averages()` call (what a trace handler pays),
  - summarize: `summarize(trace file)` reading the exported file from disk (median of 3,
    wall and CPU seconds, after the profiler's own objects are collected), in this process
    and with `jobs=` the cores (worker processes, as `kprof summary` reads; wall only).
Wall times depend on what else runs on the machine: the load average is printed with them.

    .venv/bin/python benchmarks/summary.py --sizes 5 15 50 --out benchmarks/out/summary.json
    .venv/bin/python benchmarks/summary.py --quick        # CI smoke: one ~1 MB trace
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import numpy as np
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from kprof_callbacks.analysis import summarize
from kprof_callbacks.analysis.workers import default_jobs

from _record import commit


def profile_training(
    model: nn.Module, loss: Callable[[], torch.Tensor], n_steps: int, on_ready, with_stack: bool = False
) -> None:
    """Profile `n_steps` SGD steps of `model` (`loss()` is the forward; one active window after one warm-up step,
    shapes recorded, forward and backward labelled) and hand the profile to `on_ready`."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=True,
        with_stack=with_stack,
        on_trace_ready=on_ready,
        schedule=schedule(wait=0, warmup=1, active=n_steps, repeat=1),
    ) as prof:
        for _ in range(n_steps + 1):
            with record_function("forward"):
                value = loss()
            with record_function("backward"):
                value.backward()
            opt.step()
            opt.zero_grad()
            prof.step()


def train_steps(n_steps: int, on_ready, width: int = 128) -> None:
    """Profile `n_steps` steps of a small MLP (one active window) and hand the profile to `on_ready`."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, 128), nn.ReLU(), nn.Linear(128, 10))
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    profile_training(model, lambda: nn.functional.cross_entropy(model(x), y), n_steps, on_ready)


def measure(n_steps: int, folder: Path) -> dict:
    """Profile, time key_averages() and summarize() on the same profile; one result row."""
    path = folder / f"mlp_{n_steps}.pt.trace.json"
    row: dict = {"steps": n_steps}

    def on_ready(prof) -> None:
        t0 = time.perf_counter()
        averages = prof.key_averages()
        row["key_averages_s"] = time.perf_counter() - t0
        row["ops"] = len(averages)
        prof.export_chrome_trace(str(path))

    train_steps(n_steps, on_ready)
    gc.collect()  # the profiler's event objects, so that they do not slow the collector during summarize
    wall, cpu = [], []
    for _ in range(3):
        t0, c0 = time.perf_counter(), time.process_time()
        summary = summarize(path)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    row["summarize_s"], row["summarize_cpu_s"] = statistics.median(wall), statistics.median(cpu)
    row["jobs"] = default_jobs()
    row["summarize_jobs_s"] = statistics.median(_wall(lambda: summarize(path, jobs=row["jobs"])) for _ in range(3))
    row["load_average"] = os.getloadavg()[0]
    row["trace_mb"] = path.stat().st_size / 2**20
    row["events"] = sum(1 for _ in _events(path))
    row["summary_steps"] = len(summary.steps)
    row["speedup"] = row["key_averages_s"] / row["summarize_s"]
    path.unlink()
    return row


def _wall(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _events(path: Path):
    class Trace(msgspec.Struct):
        traceEvents: list[msgspec.Raw]  # noqa: N815

    return msgspec.json.decode(path.read_bytes(), type=Trace).traceEvents


def bytes_per_step(folder: Path) -> float:
    sizes = {}
    for n in (10, 30):
        path = folder / f"calibrate_{n}.json"
        train_steps(n, lambda prof, p=path: prof.export_chrome_trace(str(p)))
        sizes[n] = path.stat().st_size
        path.unlink()
    return (sizes[30] - sizes[10]) / 20


def size_parser(doc: str, default: list[float]) -> argparse.ArgumentParser:
    """The options of the trace-size benchmarks: --sizes, --quick, --out."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=float, nargs="+", default=default, help="target trace sizes in MB")
    parser.add_argument("--quick", action="store_true", help="~1 MB traces (CI smoke test)")
    parser.add_argument("--out", type=Path, help="write the results and versions as JSON here")
    return parser


def rows_by_size(args: argparse.Namespace, measure) -> list[dict]:
    """`measure(n_steps, folder)` for the number of MLP steps that makes each target size (one thread)."""
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        per_step = bytes_per_step(folder)
        for mb in [1.0] if args.quick else args.sizes:
            rows.append(measure(max(2, round(mb * 2**20 / per_step)), folder))
            print(f"  {mb:g} MB done", file=sys.stderr)
    return rows


def write_results(path: Path, rows: list[dict]) -> None:
    """The rows with the commit, the date, the machine and the versions, as JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "commit": commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count()},
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "msgspec": msgspec.__version__,
            "numpy": np.__version__,
        },
        "rows": rows,
    }
    path.write_text(json.dumps(doc, indent=1))


def main() -> int:
    args = size_parser(__doc__, [5, 15, 50]).parse_args()
    rows = rows_by_size(args, measure)
    print(
        "| trace MB | events | steps | key_averages() s | summarize() s | summarize() CPU s | speedup | "
        "summarize(jobs=N) s | MB/s, jobs 1 / N | load avg |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['trace_mb']:.1f} | {r['events']:,} | {r['steps']} | {r['key_averages_s']:.2f} | "
            f"{r['summarize_s']:.3f} | {r['summarize_cpu_s']:.3f} | {r['speedup']:.0f}x | "
            f"{r['summarize_jobs_s']:.3f} (N={r['jobs']}) | {r['trace_mb'] / r['summarize_s']:.0f} / "
            f"{r['trace_mb'] / r['summarize_jobs_s']:.0f} | {r['load_average']:.1f} |"
        )
    if args.out:
        write_results(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
