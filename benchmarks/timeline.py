"""How fast the kprof tab serves one step of a big trace to its timeline, cold and warm, and how many bytes.

Profiles a deep MLP on CPU with shapes and Python stacks recorded (`with_stack=True`: the heaviest per-step
traces) for a few steps, so each step holds tens of thousands of events, until the trace reaches the target
size. Then, on that file, the work the `/timeline` route does:
  - cold: decode the file and index it (TraceSlices.read), cut the median step, encode it as JSON and gzip it
    (TensorBoard gzips at level 3): the first request for a file;
  - warm: cut, encode and gzip from the cached index: every later step of that file;
and the bytes sent for the step (JSON, gzipped) next to the trace's own bytes per step. Median of 3.

    .venv/bin/python benchmarks/timeline.py --mb 50
    .venv/bin/python benchmarks/timeline.py --quick      # CI smoke: a ~2 MB trace
"""

from __future__ import annotations

import argparse
import gzip
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import torch
from torch import nn

from kprof_callbacks.analysis.slices import TraceSlices, median_step

from summary import profile_training

STEPS = 3


def write_trace(path: Path, depth: int) -> None:
    """Profile STEPS training steps of a `depth`-layer MLP (shapes and stacks recorded) into `path`."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(32, 32), nn.ReLU()) for _ in range(depth)])
    x = torch.randn(8, 32)
    profile_training(
        model,
        lambda: model(x).square().mean(),
        STEPS,
        lambda prof: prof.export_chrome_trace(str(path)),
        with_stack=True,
    )


def _serve(slices: TraceSlices, step: int) -> tuple[bytes, bytes, int]:
    """What the route sends for one step: its JSON, gzipped as TensorBoard does, and the event count."""
    piece = slices.step(step)
    body = msgspec.json.encode(piece.to_dict())
    return body, gzip.compress(body, compresslevel=3), len(piece)


def measure(path: Path) -> dict:
    """Cold and warm serving times of the median step of `path`, and its sizes."""
    cold, warm = [], []
    for _ in range(3):
        t0 = time.perf_counter()
        slices = TraceSlices.read(path)
        step = median_step([(w.step, w.wall_us) for w in slices.steps()])
        body, packed, events = _serve(slices, step)
        cold.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        _serve(slices, step)
        warm.append(time.perf_counter() - t0)
    trace_bytes = path.stat().st_size
    return {
        "trace_mb": trace_bytes / 2**20,
        "steps": len(slices.steps()),
        "events": events,
        "step_trace_mb": trace_bytes / len(slices.steps()) / 2**20,
        "json_mb": len(body) / 2**20,
        "gzip_mb": len(packed) / 2**20,
        "cold_s": statistics.median(cold),
        "warm_s": statistics.median(warm),
        "load": os.getloadavg()[0],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=50, help="target trace size in MB (default 50)")
    parser.add_argument("--quick", action="store_true", help="a ~2 MB trace (CI smoke test)")
    args = parser.parse_args()
    target = 2.0 if args.quick else args.mb
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        sizes = {}
        for depth in (8, 64):  # the size grows linearly with depth, from a fixed part
            probe = Path(tmp) / f"probe{depth}.pt.trace.json"
            write_trace(probe, depth)
            sizes[depth] = probe.stat().st_size
        per_layer = (sizes[64] - sizes[8]) / 56
        depth = max(8, round(8 + (target * 2**20 - sizes[8]) / per_layer))
        path = Path(tmp) / "deep.pt.trace.json"
        write_trace(path, depth)
        row = measure(path)
    print(
        f"| trace MB | steps | events in the step | trace MB per step | step JSON MB | gzipped MB | cold s | warm s "
        f"| load avg |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
        f"| {row['trace_mb']:.1f} | {row['steps']} | {row['events']:,} | {row['step_trace_mb']:.1f} | "
        f"{row['json_mb']:.2f} | {row['gzip_mb']:.2f} | {row['cold_s']:.2f} | {row['warm_s']:.3f} | "
        f"{row['load']:.1f} |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
