"""The record of `make test-gpu` runs: each run's device, commit and counts, part by part, read from its output.

    ./scripts/test_gpu.sh -rfE -p no:cacheprovider --durations=25 2>&1 | tee run1.log    # on each fresh GPU machine
    python benchmarks/gpu_suite.py --out benchmarks/results/test_suite-h100.json \\
        --versions torch=2.11.0+cu130 cuda=13.0 python=3.12.3 \\
        --run run1.log "NVIDIA H100 80GB HBM3, 4-GPU host, 64 cores" COMMIT WALL_SECONDS --run run2.log ...

test_gpu.sh runs pytest in parts (the parallel tests, the tests marked serial beside them, in one or two lanes);
each part ends in pytest's summary line, from which its counts and seconds come. A run is green when no part failed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from pathlib import Path

# test_gpu.sh's lines between its parts, and the part each begins
_PARTS = (("---- the tests marked serial", "serial"), ("---- the second lane", "serial, second lane"))
_SUMMARY = re.compile(r"^=+ (?P<counts>.*) in (?P<seconds>[\d.]+)s")
_COUNT = re.compile(r"(\d+) (passed|failed|skipped|deselected|errors?)")
_WORKERS = re.compile(r"created: (\d+)/\d+ workers")


def parts(log: str) -> list[dict]:
    """Each pytest part of one test_gpu.sh output: its name, counts and seconds. A part ends at pytest's summary
    line; one that started (a marker or pytest's banner) and has none, cut off or killed, counts as failed."""
    found, text, name, started = [], "", "parallel", False
    for line in log.splitlines():
        began = next((part for marker, part in _PARTS if line.startswith(marker)), None)
        if began:
            name, started = began, True
        started = started or "test session starts" in line
        text += line + "\n"
        summary = _SUMMARY.match(line)
        if summary:
            found.append(_part(name, text, summary))
            text, name, started = "", "serial", False  # on a small host the serial part follows unannounced
    if started:
        found.append(_part(name, text, None))
    return found


def _part(name: str, text: str, summary: re.Match | None) -> dict:
    workers = _WORKERS.search(text)
    counts = {k: 0 for k in ("passed", "failed", "skipped", "deselected")}
    for n, kind in _COUNT.findall(summary["counts"] if summary else ""):
        counts["failed" if kind.startswith("error") else kind] += int(n)
    counts["failed"] += summary is None
    seconds = float(summary["seconds"]) if summary else None
    return {"part": f"{name} ({workers[1]} workers)" if workers else name, "seconds": seconds, **counts}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", nargs=4, action="append", required=True, metavar=("LOG", "DEVICE", "COMMIT", "WALL"))
    p.add_argument("--versions", nargs="+", required=True, metavar="NAME=VERSION", help="the GPU machine's packages")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    rows = []
    for k, (log, device, commit, wall) in enumerate(args.run, 1):
        for part in parts(Path(log).read_text(errors="replace")):
            rows.append({"run": k, "device": device, "commit": commit[:7], "wall_s": float(wall), **part})
    green = [k for k in range(1, len(args.run) + 1) if not any(r["failed"] for r in rows if r["run"] == k)]
    doc = {
        "commit": args.run[-1][2],
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": "; ".join(dict.fromkeys(r["device"] for r in rows)),
        "versions": dict(v.split("=", 1) for v in args.versions),
        "command": "./scripts/test_gpu.sh -rfE -p no:cacheprovider --durations=25 (make test-gpu), once on each "
        "freshly started machine",
        "green_runs": green,
        "rows": rows,
    }
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{len(green)} of {len(args.run)} runs green: {green}")
    return 0 if len(green) == len(args.run) else 1


if __name__ == "__main__":
    sys.exit(main())
