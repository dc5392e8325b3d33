"""How long the `kprof` command takes to start: `kprof --help`, and `kprof summary` of the demo's ~6 MB run.

Each is run in a fresh process, as a user types it (`python -m kprof_callbacks`, which is what the `kprof` script
runs), several times; the table gives the median and the range. `python -c "import torch"` is timed beside them:
the reading path must not pay for it. Wall times depend on the machine's load, printed with them.

    python benchmarks/cold_start.py [--runs 7] [--out cold_start.json]
    python benchmarks/cold_start.py --quick        # CI smoke: 1 run of each, the demo's run made in 24 steps
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
from pathlib import Path

from gpu_traces import timed

TARGETS = {"help": 0.3, "summary": 1.0}


def demo_run(folder: Path, steps: int = 60) -> Path:
    """The run `kprof demo` writes (60 steps: two traces, ~6 MB; the two windows end by step 24)."""
    done = subprocess.run(
        [sys.executable, "-m", "kprof_callbacks", "demo", "--logdir", str(folder), "--steps", str(steps)],
        capture_output=True,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    if done.returncode != 0:
        raise RuntimeError(f"kprof demo failed: {done.stderr[-2000:]}")
    (run,) = folder.iterdir()
    return run


def import_torch() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7, help="fresh processes per command (default 7)")
    parser.add_argument("--quick", action="store_true", help="1 run of each, the demo in 24 steps (CI smoke test)")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    runs = 1 if args.quick else args.runs
    with tempfile.TemporaryDirectory() as tmp:
        run = demo_run(Path(tmp), 24 if args.quick else 60)
        mb = sum(f.stat().st_size for f in run.glob("*.pt.trace.json*")) / 2**20
        times = {
            "help": [timed("--help")["wall_s"] for _ in range(runs)],
            "summary": [timed("summary", str(run))["wall_s"] for _ in range(runs)],
            "import torch": [import_torch() for _ in range(runs)],
        }
    load = os.getloadavg()[0]
    print(f"{runs} fresh processes each; load average {load:.1f}\n")
    print("| command | median s | min-max s | target |\n|---|---:|---:|---|")
    for what, label in (
        ("help", "kprof --help"),
        ("summary", f"kprof summary RUN ({mb:.1f} MB, the demo's)"),
        ("import torch", 'python -c "import torch" (for scale)'),
    ):
        values = times[what]
        target = f"<= {TARGETS[what]} s" if what in TARGETS else ""
        print(f"| {label} | {statistics.median(values):.2f} | {min(values):.2f}-{max(values):.2f} | {target} |")
    if args.out:
        args.out.write_text(
            json.dumps(
                {"runs": runs, "trace_mb": mb, "load_average": load, "seconds": times, "targets": TARGETS}, indent=1
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
