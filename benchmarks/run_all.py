"""Every kprof benchmark in one run: one markdown report, one JSON file, each target marked met or missed.

Runs, each in its own process (so one's profiler or CUDA state cannot leak into the next):
  overhead.py            step-time cost outside/inside windows; training thread blocked at window end
  lightning_overhead.py  ProfilerCallback vs Lightning's PyTorchProfiler on one LightningModule
  summary.py             kprof.summarize vs key_averages() on the same profiles
  diff.py                kprof.diff of two 50 MB traces
  cold_start.py          kprof --help and kprof summary of a 6 MB run, each in a fresh process
  gpu_traces.py          kprof summary of a real GPU trace (~100 MB), of 1 GB of its events, of 8 rank files
  kernels.py             custom layers vs eager PyTorch and torch.compile, % of copy bandwidth

    kprof bench --check                                   # builds the kernels (~80 s on an H100 host) and checks them
    python benchmarks/run_all.py --out results.json      # then this: ~8 min on an H100
    python benchmarks/run_all.py --gpu-trace gpt.pt.trace.json.gz ...   # gpu_traces.py on a GPT trace of yours
                                                          # (benchmarks/traces.py record makes one)
    python benchmarks/run_all.py --quick                  # smoke test of every script on the CPU, on any machine (CI)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from kprof_callbacks.bench.timing import best_other_ms

from _isolated import change_cell
from _record import commit

HERE = Path(__file__).resolve().parent
# name -> (script, extra arguments for a full run). The step-time benchmarks add rounds while their time budget
# lasts, so the whole run stays within about 8 minutes on an H100 whatever one fresh process costs there.
BENCHMARKS = {
    "overhead": ("overhead.py", ["--seconds", "220"]),
    "lightning": ("lightning_overhead.py", ["--seconds", "60"]),
    "summary": ("summary.py", ["--sizes", "5", "15", "50"]),
    "diff": ("diff.py", ["--sizes", "50"]),
    "cold_start": ("cold_start.py", []),
    "gpu_traces": ("gpu_traces.py", []),
    "kernels": ("kernels.py", ["--largest"]),  # the sizes the targets read; `kprof bench` alone times them all
}


def run(name: str, quick: bool, out_dir: Path, gpu_trace: Path | None = None) -> dict:
    script, extra = BENCHMARKS[name]
    out = out_dir / f"{name}.json"
    if name == "gpu_traces" and gpu_trace is not None:
        extra = [*extra, "--trace", str(gpu_trace)]
    args = [sys.executable, str(HERE / script), "--out", str(out), *(["--quick"] if quick else extra)]
    print(f"\n## {name}: {' '.join(args[1:])}\n", flush=True)
    started = time.perf_counter()
    unbuffered = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if quick and name != "kernels":  # on a GPU machine too: fresh CUDA processes each cost seconds to start; the
        unbuffered["CUDA_VISIBLE_DEVICES"] = ""  # kernels' --quick runs on the CPU anyway, with the builds already made
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=unbuffered) as child:
        for line in child.stdout:  # as it comes: a long benchmark shows its progress, a cut-short run keeps it
            if not line.startswith("USDT:"):  # kineto's trace start/stop probes
                print(line, end="", flush=True)
    result = json.loads(out.read_text()) if out.exists() else {}
    return {"returncode": child.returncode, "seconds": time.perf_counter() - started, "result": result}


Target = tuple[str, str, "bool | None"]  # (target, measured, met: None where no number)


def targets(results: dict) -> list[Target]:
    """(target, measured, met) for every target kprof sets itself; None where the run produced no number."""
    return [
        *_overhead_targets(results.get("overhead", {}).get("result", {})),
        *_summary_targets(results),
        *_read_targets(results),
        *_lightning_targets(results.get("lightning", {}).get("result", {}).get("results", {})),
        *_kernel_targets(results.get("kernels", {}).get("result", {}).get("rows", [])),
    ]


def _overhead_targets(overhead: dict) -> list[Target]:
    """The profiled loop's cost outside and inside windows, and the block at a window's end."""
    rows: list[Target] = []
    for model, row in overhead.get("step", {}).items():
        outside, inside = row["ratios"]["outside"], row["ratios"]["inside"]
        noise = f"; no profiler vs its own baseline: {change_cell(row['ratios']['none'])}"
        rows.append(
            (
                f"{model}: outside windows <= 1% over no profiler",
                change_cell(outside) + noise,
                statistics.median(outside) <= 1.01,
            )
        )
        rows.append(
            (
                f"{model}: inside <= raw torch.profiler + 3%",
                change_cell(inside) + noise,
                statistics.median(inside) <= 1.03,
            )
        )
    for active, row in overhead.get("blocking", {}).items():
        ours, raw = row["kprof"], row["raw"]
        rows.append(
            (
                f"blocked at window end ({active} active steps, {ours['trace_mb']:.1f} MB) <= 100 ms",
                f"{ours['blocked_ms']:.0f} ms, {ours['disable_ms']:.0f} of them in torch's _disable_profiler "
                f"(raw torch.profiler: {raw['blocked_ms']:.0f} ms)",
                ours["blocked_ms"] <= 100,
            )
        )
    return rows


def _summary_targets(results: dict) -> list[Target]:
    """kprof summary and kprof diff of CPU traces: against key_averages, within a second, MB/s with workers."""
    rows: list[Target] = []
    for size in results.get("summary", {}).get("result", {}).get("rows", []):
        speedup, seconds = size.get("speedup"), size.get("summarize_s")
        if speedup is not None:
            rows.append(
                (f"summary of {size['trace_mb']:.0f} MB trace >= 20x key_averages", f"{speedup:.0f}x", speedup >= 20)
            )
        if seconds is not None and size["trace_mb"] >= 40:
            rows.append((f"summary of {size['trace_mb']:.0f} MB trace <= 1 s", f"{seconds:.2f} s", seconds <= 1.0))
        if "summarize_jobs_s" in size and size["trace_mb"] >= 40:
            rate = size["trace_mb"] / size["summarize_jobs_s"]
            alone = size["trace_mb"] / size["summarize_s"]
            rows.append(
                (
                    f"summary of {size['trace_mb']:.0f} MB CPU trace >= 200 MB/s (jobs={size['jobs']})",
                    f"{rate:.0f} MB/s (in one process: {alone:.0f})",
                    rate >= 200,
                )
            )
    for size in results.get("diff", {}).get("result", {}).get("rows", []):
        if size["trace_mb"][0] >= 40:
            rows.append(
                (
                    f"diff of two {size['trace_mb'][0]:.0f} MB traces <= 1.0 s (jobs={size['jobs']})",
                    f"{size['diff_jobs_s']:.2f} s (in one process: {size['diff_s']:.2f} s)",
                    size["diff_jobs_s"] <= 1.0,
                )
            )
    return rows


def _lightning_targets(lightning: dict) -> list[Target]:
    """The Lightning callback's cost after its windows, and at the end of training."""
    if "none" not in lightning or "kprof ProfilerCallback" not in lightning:
        return []
    rows: list[Target] = []
    for name in ("kprof ProfilerCallback", "lightning PyTorchProfiler"):
        ratios = lightning[name]["after_ratio_to_none"]
        rows.append(
            (
                f"Lightning, {name}: steps after the windows <= 1% over none",
                change_cell(ratios),
                statistics.median(ratios) <= 1.01 if name.startswith("kprof") else None,
            )
        )
    teardown = lightning["kprof ProfilerCallback"]["teardown_s"]
    rows.append(("Lightning, kprof: time at the end of training <= 1 s", f"{teardown:.2f} s", teardown <= 1.0))
    return rows


def _read_targets(results: dict) -> list[Target]:
    """Start-up of the CLI, and kprof summary of a real GPU trace, of 1 GB, of 8 rank files."""
    rows: list[Target] = []
    cold = results.get("cold_start", {}).get("result", {})
    for what, label in (("help", "kprof --help"), ("summary", "kprof summary of the demo's 6 MB run")):
        if what in cold.get("seconds", {}):
            median = statistics.median(cold["seconds"][what])
            rows.append((f"{label} <= {cold['targets'][what]} s", f"{median:.2f} s", median <= cold["targets"][what]))
    gpu = results.get("gpu_traces", {}).get("result", {})
    if "trace_n" not in gpu:
        return rows
    mb, jobs, goal = gpu["trace_mb"], gpu["jobs"], gpu["targets"]
    rate = mb / gpu["in_process_n_s"]
    rows.append(
        (
            f"{gpu['source']}: summary >= {goal['trace_mbps']:.0f} MB/s (jobs={jobs})",
            f"{rate:.0f} MB/s (jobs=1: {mb / gpu['in_process_1_s']:.0f})",
            rate >= goal["trace_mbps"],
        )
    )
    wall = gpu["trace_n"]["wall_s"]
    rows.append(
        (f"kprof summary of it from a fresh process <= {goal['cold_s']} s", f"{wall:.2f} s", wall <= goal["cold_s"])
    )
    rows.append(_memory_row(gpu["trace_n"], mb, goal["rss_ratio"]))
    big, big_mb = gpu["big"], gpu["big_mb"]
    rows.append(
        (
            f"kprof summary of {big_mb:.0f} MB of its events >= {goal['big_mbps']:.0f} MB/s",
            f"{big_mb / big['wall_s']:.0f} MB/s",
            big_mb / big["wall_s"] >= goal["big_mbps"],
        )
    )
    rows.append(_memory_row(big, big_mb, goal["rss_ratio"]))
    ratio = gpu["ranks"]["wall_s"] / wall
    rows.append(
        (
            f"{gpu['ranks']['files']} rank files in <= {goal['ranks_ratio']:.0f}x one file's time",
            f"{ratio:.2f}x ({gpu['ranks']['wall_s']:.2f} s)",
            ratio <= goal["ranks_ratio"],
        )
    )
    return rows


# The kernels' targets, forward + backward at each op's largest size: share of copy bandwidth by (op, dtype) (None:
# any dtype), and speedups over eager / torch.compile; every row must also beat the best of eager, torch.compile and
# Liger-Kernel.
COPY_SHARE = {
    ("square", None): 0.9,
    ("add", None): 0.9,
    ("gelu", None): 0.9,
    ("gelu-tanh", None): 0.9,
    ("layer_norm", "bfloat16"): 0.8,
    ("rms_norm", "bfloat16"): 0.8,
}
SPEEDUP = {
    "swiglu": ("compile_ms", 1.05),
    "linear_gelu": ("eager_ms", 1.1),
    "bias_gelu": ("eager_ms", 1.5),
    "bias_gelu-tanh": ("eager_ms", 1.5),
}


def _kernel_targets(rows: list[dict]) -> list[Target]:
    """The kernel targets, measured on each op's forward + backward at its largest size."""
    largest: dict[tuple, dict] = {}
    for row in rows:
        key = (row["op"], row["dtype"])
        if row["pass"] != "fwd+bwd":
            continue
        if key not in largest or math.prod(row["shape"]) > math.prod(largest[key]["shape"]):
            largest[key] = row
    out = []
    for (op, dtype), row in sorted(largest.items()):
        where = f"{op} {dtype} fwd+bwd {'x'.join(map(str, row['shape']))}"
        share = COPY_SHARE.get((op, dtype), COPY_SHARE.get((op, None)))
        if share is not None and row.get("gbps"):
            got = row["gbps"] / row["copy_gbps"]
            out.append((f"{where}: >= {share:.0%} of copy bandwidth", f"{got:.0%}", got >= share))
        if op in SPEEDUP and not math.isnan(row.get(SPEEDUP[op][0], math.nan)):
            key, target = SPEEDUP[op]
            got = row[key] / row["ms"]
            out.append((f"{where}: >= {target}x {key.removesuffix('_ms')}", f"{got:.2f}x", got >= target))
        best = best_other_ms(row)
        out.append(
            (
                f"{where}: >= 1.0x the best of eager, torch.compile and Liger",
                f"{best / row['ms']:.2f}x",
                best >= row["ms"],
            )
        )
    return out


def _memory_row(run: dict, mb: float, ratio: float) -> tuple[str, str, bool]:
    """Peak memory of a `kprof summary` and its workers against ``ratio`` times the file: their PSS (shared pages
    split among them); their RSS, which counts Python and numpy once per worker, is given beside it."""
    pss, rss = run["tree_pss_mb"], run["tree_rss_mb"]
    return (
        f"... peak memory (PSS, workers included) <= {ratio:.0f}x the file",
        f"{pss / mb:.2f}x ({pss:.0f} MB; RSS summed: {rss:.0f} MB)",
        pss / mb <= ratio,
    )


def render_targets(rows: list[Target]) -> str:
    lines = ["| target | measured | |", "|---|---|---|"]
    lines += [f"| {t} | {m} | {'met' if ok else 'MISSED' if ok is False else '-'} |" for t, m, ok in rows]
    return "\n".join(lines)


def uncompiled() -> list[str]:
    """The packages the fresh processes of the benchmarks import whose bytecode a fresh process would have to compile
    (none beside the source, none written): their start-up times would count it."""
    import msgspec
    import numpy

    import kprof_callbacks

    if not sys.flags.dont_write_bytecode:
        return []
    modules = (numpy, msgspec, kprof_callbacks)
    return [m.__name__ for m in modules if not Path(importlib.util.cache_from_source(m.__file__)).exists()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, CPU friendly (CI smoke test)")
    parser.add_argument("--only", nargs="+", choices=list(BENCHMARKS), default=list(BENCHMARKS))
    parser.add_argument("--out", type=Path, help="write everything as JSON here")
    parser.add_argument(
        "--gpu-trace",
        type=Path,
        help="the real GPU trace gpu_traces.py reads (default: the tracked H100 fixture, scaled up)",
    )
    args = parser.parse_args(argv)
    results = {
        "commit": commit(),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": time.strftime("%Y-%m-%d"),
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
    }
    results["compiled_from_source"] = uncompiled()
    if results["compiled_from_source"]:
        print(
            f"warning: no bytecode for {', '.join(results['compiled_from_source'])} and none written "
            "(PYTHONDONTWRITEBYTECODE): every fresh process compiles them, ~0.15 s that an installed package never "
            "pays. Run `python -m compileall` on them first."
        )
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only:
            results[name] = run(name, args.quick, Path(tmp), args.gpu_trace)
            if args.out:  # after each benchmark, so a run cut short still leaves what it measured
                args.out.write_text(json.dumps(results, indent=2))
    took = {name: round(results[name]["seconds"]) for name in args.only}
    print(f"\nseconds: {took}, total {sum(took.values())}")
    results["targets"] = [{"target": t, "measured": m, "met": ok} for t, m, ok in targets(results)]
    print(f"\n## targets ({results['device']}, torch {results['torch']}, {results['date']})\n")
    print(render_targets(targets(results)))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    failed = [name for name in args.only if results[name]["returncode"] != 0]
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
