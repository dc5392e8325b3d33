"""`kprof summary LOGDIR` and `kprof diff A B`: the analysis in the terminal, as JSON or HTML.

`kprof summary`: the Summary (also folded stacks). Exit status 0 when at least one trace was summarized
(unreadable files are listed under "Problems"), 1 when nothing could be read, 2 for bad arguments (argparse).
`kprof diff`: what changed from A to B, with intervals and verdicts. Exit status 0 when both sides were read,
1 when one could not be (or a step selection does not match the run), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .html import write_html
from .summary import SORT_KEYS, Summary, summarize
from .tracediff import diff


def _confidence(text: str) -> float:
    value = float(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


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



def add_diff_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register the `diff` subcommand on the `kprof` command's subparsers."""
    p = subparsers.add_parser(
        "diff", help="what changed between two runs, trace files or step selections (with CIs and verdicts)",
        description=__doc__ + "\nA and B: a run folder, a trace file, or PATH@steps=SPEC for some steps of a run "
        "(SPEC: numbers and ranges, e.g. log/run@steps=2-4,7).", formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a", help="the baseline: run folder, trace file or PATH@steps=SPEC")
    p.add_argument("b", help="the run compared with it (same forms)")
    p.add_argument("--json", action="store_true", help="print the diff as JSON instead of text")
    p.add_argument("--html", type=Path, metavar="OUT.html", help="also write a self-contained HTML report")
    p.add_argument("--top", type=_positive, default=10, metavar="N", help="rows per table (default 10)")
    p.add_argument("--confidence", type=_confidence, default=0.95,
                   help="interval level; 1 - confidence is the false discovery rate (default 0.95)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.set_defaults(func=run_diff)
    return p


def run_diff(args: argparse.Namespace) -> int:
    """Run `kprof diff`; returns the exit status."""
    try:
        result = diff(args.a, args.b, confidence=args.confidence, seed=args.seed)
    except (FileNotFoundError, ValueError) as exc:
        print(f"kprof diff: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result.to_dict(), indent=1) if args.json else result.render(top=args.top))
    if args.html:
        result.to_html(args.html, top=max(args.top, 30))
        print(f"HTML report: {args.html}", file=sys.stderr)
    return 0
