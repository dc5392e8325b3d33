"""`kprof summary` on real GPU traces: a ~100 MB GPT trace, 1 GB of its event mix, and a run of 8 rank files.

The source is a real trace recorded on a GPU (`benchmarks/traces.py record`: GPT-2 small, bf16, shapes and stacks);
without --trace, the H100 trace tracked in tests/fixtures is scaled up instead (a real GPU event mix, but an MLP's).
Rows, each `kprof summary` in a fresh process as a user runs it (imports and worker start-up included):
  - the trace itself (~100 MB): --jobs 1 and --jobs <cores>;
  - 1 GB: the trace's events repeated to 1 GB (`traces.py scale`), --jobs <cores>;
  - 8 ranks: the trace copied as 8 rank files of one run, --jobs <cores>, against the one file's time.
Peak memory is sampled every 10 ms: the process's own RSS, and the sum over the process and its workers of their RSS,
which counts the pages they share (Python, numpy) once per process; every 50 ms, the sum of their PSS (proportional
set size: each shared page split among the processes that map it), the memory the run holds (reading it walks each
process's page tables, a cost the runs measured would share). The kernel's high-water mark of a child would count
the benchmark's own pages, shared with it until exec.
In-process `summarize()` of the trace (median of 3) is given too: the analysis without start-up.

    python benchmarks/gpu_traces.py --trace gpt.pt.trace.json.gz --out gpu_traces.json
    python benchmarks/gpu_traces.py --quick        # CI smoke: small sizes
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from kprof_callbacks.analysis import summarize
from kprof_callbacks.analysis.workers import default_jobs

import traces

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "gpu_small.pt.trace.json.gz"
TARGETS = {"trace_mbps": 200.0, "cold_s": 1.0, "big_mbps": 150.0, "rss_ratio": 2.0, "ranks_ratio": 2.0}


def timed(*args: str) -> dict:
    """`kprof ARGS` in a fresh process: wall seconds, peak RSS of the process, peak RSS and PSS of its tree (with its
    workers)."""
    with tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "kprof_callbacks", *args], stdout=subprocess.DEVNULL, stderr=err)
        peaks, done, watch = [0, 0, 0], threading.Event(), psutil.Process(proc.pid)

        def sample() -> None:
            tick = 0
            while not done.is_set():
                try:
                    tree = [watch, *watch.children(recursive=True)]
                    rss = [p.memory_info().rss for p in tree]
                    pss = sum(p.memory_full_info().pss for p in tree) if tick % 5 == 0 else 0
                    peaks[:] = map(max, peaks, (rss[0], sum(rss), pss))
                except psutil.Error:
                    pass
                tick += 1
                done.wait(0.01)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status = os.waitpid(proc.pid, 0)
        wall = time.perf_counter() - started
        done.set()
        sampler.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"kprof {' '.join(args)} failed: {err.read().decode()[-2000:]}")
    rss, tree_rss, tree_pss = (p / 2**20 for p in peaks)
    return {"wall_s": wall, "rss_mb": rss, "tree_rss_mb": tree_rss, "tree_pss_mb": tree_pss}


def cold(path: Path, jobs: int) -> dict:
    return timed("summary", str(path), "--jobs", str(jobs))


def in_process(path: Path, jobs: int) -> float:
    """Median wall seconds of 3 `summarize()` calls in this process."""
    times = []
    for _ in range(3):
        started = time.perf_counter()
        summarize(path, jobs=jobs)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def plain(source: Path, folder: Path, mb: float | None) -> Path:
    """The source as plain JSON in a run folder of its own (scaled to ``mb`` MB when given)."""
    run = folder / "trace"
    run.mkdir()
    out = run / "host_1.1795000000000000000.pt.trace.json"
    if mb is not None:
        return traces.scale(source, out, mb)
    data = source.read_bytes()
    out.write_bytes(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
    return out


def ranks(trace: Path, folder: Path, n: int) -> Path:
    """A run folder of ``n`` rank files, each a copy of ``trace``."""
    run = folder / "ranks"
    run.mkdir()
    for rank in range(n):
        shutil.copy(trace, run / f"rank{rank}_host_{100 + rank}.1795000000000000000.pt.trace.json")
    return run


def measure(source: Path, scaled_mb: float | None, big_mb: float, n_ranks: int, jobs: int, folder: Path) -> dict:
    trace = plain(source, folder, scaled_mb)
    mb = trace.stat().st_size / 2**20
    rows: dict = {"trace_mb": mb, "jobs": jobs}
    rows["in_process_1_s"], rows["in_process_n_s"] = in_process(trace, 1), in_process(trace, jobs)
    rows["trace_1"], rows["trace_n"] = cold(trace, 1), cold(trace, jobs)
    print(f"  {mb:.0f} MB trace done", file=sys.stderr)
    run = ranks(trace, folder, n_ranks)
    rows["ranks"] = {"files": n_ranks, **cold(run, jobs)}
    print(f"  {n_ranks} ranks done", file=sys.stderr)
    shutil.rmtree(run)
    big = traces.scale(trace, folder / "big.pt.trace.json", big_mb)
    rows["big_mb"] = big.stat().st_size / 2**20
    rows["big"] = cold(big, jobs)
    print(f"  {rows['big_mb']:.0f} MB done", file=sys.stderr)
    return rows


def table(r: dict, label: str) -> str:
    mb, big_mb = r["trace_mb"], r["big_mb"]
    lines = [
        "| what | MB | jobs | wall s | MB/s | peak RSS MB (the process) | peak RSS MB (with its workers) | peak PSS MB "
        "(with its workers) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines.append(
        f"| summarize() in-process, {label} | {mb:.0f} | 1 | {r['in_process_1_s']:.3f} | "
        f"{mb / r['in_process_1_s']:.0f} | | |"
    )
    lines.append(
        f"| summarize() in-process, {label} | {mb:.0f} | {r['jobs']} | {r['in_process_n_s']:.3f} | "
        f"{mb / r['in_process_n_s']:.0f} | | |"
    )
    for what, key, size in (
        (f"kprof summary, {label}", "trace_1", mb),
        (f"kprof summary, {label}", "trace_n", mb),
        (f"kprof summary, {r['ranks']['files']} rank files of it", "ranks", mb * r["ranks"]["files"]),
        (f"kprof summary, its events to {big_mb:.0f} MB", "big", big_mb),
    ):
        row = r[key]
        jobs = 1 if key == "trace_1" else r["jobs"]
        lines.append(
            f"| {what} | {size:.0f} | {jobs} | {row['wall_s']:.2f} | {size / row['wall_s']:.0f} | "
            f"{row['rss_mb']:.0f} | {row['tree_rss_mb']:.0f} | {row['tree_pss_mb']:.0f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--trace",
        type=Path,
        help="a real GPU trace (.json or .json.gz); default: the tracked H100 fixture scaled to --trace-mb",
    )
    parser.add_argument("--trace-mb", type=float, default=100.0, help="size the fixture is scaled to (default 100)")
    parser.add_argument("--big-mb", type=float, default=1000.0, help="the big trace's size (default 1000)")
    parser.add_argument("--ranks", type=int, default=8, help="rank files in the multi-rank run (default 8)")
    parser.add_argument("--jobs", type=int, default=default_jobs(), help="--jobs of kprof summary (default: cores)")
    parser.add_argument("--quick", action="store_true", help="small sizes (CI smoke test)")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    source = args.trace or FIXTURE
    scaled = None if args.trace else (2.0 if args.quick else args.trace_mb)
    label = f"{source.name}" + (f" scaled to {scaled:g} MB" if scaled else "")
    with tempfile.TemporaryDirectory() as tmp:
        rows = measure(
            source, scaled, 6.0 if args.quick else args.big_mb, 3 if args.quick else args.ranks, args.jobs, Path(tmp)
        )
    rows.update(
        source=label,
        targets=TARGETS,
        load_average=os.getloadavg()[0],
        cpus=default_jobs(),
        machine=platform.platform(),
        python=platform.python_version(),
    )
    print(f"\n{label}; {default_jobs()} cores, load average {rows['load_average']:.1f}\n")
    print(table(rows, "the trace"))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
