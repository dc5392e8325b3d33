"""Time `kprof.diff` on two large traces: the same MLP profiled twice, B with a wider first layer.

Each row profiles the MLP of benchmarks/summary.py on CPU (record_shapes=True) to the target trace size twice,
A at hidden width 128 and B at 192 (so aten::addmm and its neighbours take longer in B), then times, median of 3:
  - summarize A, summarize B: `summarize(trace)` of each file alone,
  - diff of Summaries: `diff(summary_a, summary_b)` (alignment, tests, intervals, no reading),
  - kprof.diff: `diff(file_a, file_b)` end to end (reads and summarizes both) in this process, and as
    `kprof diff A B` reads them: both sides together in worker processes (`--jobs`, the cores).
Wall times depend on what else runs on the machine: the load average is printed with them.

    .venv/bin/python benchmarks/diff.py --sizes 50 --out benchmarks/out/diff.json
    .venv/bin/python benchmarks/diff.py --quick        # CI smoke: two ~1 MB traces
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time
from pathlib import Path

from kprof_callbacks.analysis import diff, summarize
from kprof_callbacks.analysis.diff_inputs import load
from kprof_callbacks.analysis.workers import default_jobs

from summary import rows_by_size, size_parser, train_steps, write_results


def _timed(fn) -> tuple[float, float, object]:
    """Median wall and CPU seconds of 3 calls, and the last result."""
    wall, cpu = [], []
    for _ in range(3):
        gc.collect()
        t0, c0 = time.perf_counter(), time.process_time()
        result = fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu), result


def measure(n_steps: int, folder: Path) -> dict:
    """Profile A and B, time the pieces of a diff; one result row."""
    paths = {}
    for side, width in (("a", 128), ("b", 192)):
        paths[side] = folder / f"{side}_{n_steps}.pt.trace.json"
        train_steps(n_steps, lambda prof, p=paths[side]: prof.export_chrome_trace(str(p)), width=width)
    row: dict = {"steps": n_steps, "trace_mb": [paths[s].stat().st_size / 2**20 for s in "ab"]}
    row["summarize_a_s"], _, summary_a = _timed(lambda: summarize(paths["a"]))
    row["summarize_b_s"], _, summary_b = _timed(lambda: summarize(paths["b"]))
    row["diff_summaries_s"], _, _ = _timed(lambda: diff(summary_a, summary_b))
    row["diff_s"], row["diff_cpu_s"], result = _timed(lambda: diff(paths["a"], paths["b"]))
    row["jobs"] = default_jobs()
    row["diff_jobs_s"], _, _ = _timed(lambda: diff(*load(paths["a"], paths["b"], jobs=row["jobs"])))
    row["load_average"] = os.getloadavg()[0]
    row["rows"] = len(result.changes)
    row["significant"] = [f"{c.kind} {c.name} {c.status}" for c in result.significant()]
    row["step_time"] = f"{result.step_time.speedup:.3f}x, {result.step_time.verdict}"
    for p in paths.values():
        p.unlink()
    return row


def main() -> int:
    args = size_parser(__doc__, [50]).parse_args()
    rows = rows_by_size(args, measure)
    print(
        "| trace MB (A, B) | steps | summarize A s | summarize B s | diff of Summaries s | kprof.diff s "
        "| kprof.diff CPU s | jobs=N s | rows | significant | step time B vs A | load avg |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for r in rows:
        print(
            f"| {r['trace_mb'][0]:.1f}, {r['trace_mb'][1]:.1f} | {r['steps']} | {r['summarize_a_s']:.3f} | "
            f"{r['summarize_b_s']:.3f} | {r['diff_summaries_s']:.3f} | {r['diff_s']:.3f} | {r['diff_cpu_s']:.3f} | "
            f"{r['diff_jobs_s']:.3f} (N={r['jobs']}) | {r['rows']} | {len(r['significant'])} | {r['step_time']} | "
            f"{r['load_average']:.1f} |"
        )
    for r in rows:
        print(f"\nsignificant in the {r['trace_mb'][0]:.0f} MB pair: " + "; ".join(r["significant"]))
    if args.out:
        write_results(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
