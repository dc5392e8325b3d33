"""kprof's TFLOP/s and MFU against a hand-counted matmul loop, and the memory-growth finding on a known leak.

Each step runs ``--matmuls`` products of two ``--size`` x ``--size`` matrices (2 n^3 FLOPs each) under bf16 and
tells the session its FLOPs; the table sets kprof's median TFLOP/s and MFU (from the session's scalars) beside the
same loop timed with CUDA events, and the FLOPs kprof counted from the trace's shapes (``with_flops=True``). A
second loop keeps 4 MB on the GPU every step: the Summary must name a growth of 4 MB per step.

    python benchmarks/mfu.py [--size 8192] [--matmuls 8] [--steps 40]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

import torch

import kprof_callbacks as kprof
from kprof_callbacks import layout


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=8192)
    p.add_argument("--matmuls", type=int, default=8)
    p.add_argument("--steps", type=int, default=40)
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/mfu.py needs a CUDA device")
    n, k = args.size, args.matmuls
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    flops = 2.0 * n**3 * k
    logdir = tempfile.mkdtemp()
    with kprof.session(logdir, run="mfu", wait=args.steps // 2, warmup=1, active=3, with_flops=True) as s:
        for _ in range(args.steps):
            for _ in range(k):
                a @ b
            s.step(flops=flops)
    summary = s.summary()
    (series,) = summary.series.values()
    times = []
    for _ in range(10):  # the same loop, timed by hand with CUDA events
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(k):
            a @ b
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    by_hand = flops / statistics.median(times) / 1e12
    kprof_tflops = statistics.median(series[layout.TFLOPS_TAG].values[2:].tolist())  # past the first steps' warm-up
    mfu = series.get(layout.MFU_TAG)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, peak (dense bf16): {s.peak_tflops}")
    peak = s.peak_tflops
    kprof_mfu = f"{statistics.median(mfu.values[2:].tolist()):.1%}" if mfu is not None else "-"
    print("| measure | TFLOP/s | MFU |\n|---|---|---|")
    print(
        f"| by hand (CUDA events, {k} x {n}^3 bf16 matmuls) | {by_hand:.1f} | "
        f"{f'{by_hand / peak:.1%}' if peak else '-'} |"
    )
    print(f"| kprof (s.step(flops=...)) | {kprof_tflops:.1f} | {kprof_mfu} |")
    for d in summary.diagnostics:
        if d.kind in ("mfu", "matmul_flops"):
            print(f"- {d.message}")

    kept = []
    with kprof.session(logdir, run="leak", wait=100, memory_every=2) as s:
        for _ in range(150):
            kept.append(torch.empty(2**20, device="cuda"))  # 4 MB a step
            s.step()
    print("leak:", [d.message for d in s.summary().diagnostics if d.kind == "memory_growth"])


if __name__ == "__main__":
    main()
