"""`kprof summary LOGDIR`: the Summary in the terminal, as JSON, HTML or folded stacks.

Exit status 0 when at least one trace was summarized (unreadable files are listed under
"Problems"), 1 when nothing could be read, 2 for bad arguments (argparse).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .html import write_html
from .summary import SORT_KEYS, Summary, summarize


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_summary_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register the `summary` subcommand on the `kprof` command's subparsers."""
    p = subparsers.add_parser("summary", help="summarize torch.profiler traces (a file, a run folder or a logdir)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("logdir", type=Path, help="trace file (.pt.trace.json[.gz]), run folder, or logdir of runs")
    p.add_argument("--json", action="store_true", help="print the tables as JSON instead of text")
    p.add_argument("--html", type=Path, metavar="OUT.html", help="also write a self-contained HTML report")
    p.add_argument("--top", type=_positive, default=10, metavar="N", help="rows per table (default 10)")
    p.add_argument("--sort", choices=SORT_KEYS, default="cuda",
                   help="sort operators by self CUDA time, self CPU time or self memory (default cuda; cpu without GPU events)")
    p.add_argument("--stacks", type=Path, metavar="OUT.folded",
                   help="write flamegraph folded stacks of self CPU time (one file per run when several)")
    p.set_defaults(func=run_summary)
    return p


def _per_run(path: Path, run: str, many: bool) -> Path:
    """`out.folded` -> `out.<run>.folded` when several runs are written."""
    if not many:
        return path
    return path.with_name(f"{path.stem}.{run.replace('/', '_')}{path.suffix}")


def run_summary(args: argparse.Namespace) -> int:
    """Run `kprof summary`; returns the exit status."""
    try:
        result = summarize(args.logdir, progress=sys.stderr.isatty())
    except (FileNotFoundError, ValueError) as exc:
        print(f"kprof summary: {exc}", file=sys.stderr)
        return 1
    runs: dict[str, Summary] = result if isinstance(result, dict) else {result.name: result}
    if args.json:
        doc = {name: s.to_dict() for name, s in runs.items()} if isinstance(result, dict) else result.to_dict()
        print(json.dumps(doc, indent=1))
    else:
        print("\n\n".join(s.render(top=args.top, sort=args.sort) for s in runs.values()))
    if args.html:
        write_html(runs, args.html, top=max(args.top, 20))
        print(f"HTML report: {args.html}", file=sys.stderr)
    if args.stacks:
        for name, s in runs.items():
            out = s.export_stacks(_per_run(args.stacks, name, len(runs) > 1))
            print(f"folded stacks: {out}", file=sys.stderr)
    return 0

