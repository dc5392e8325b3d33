"""`kprof summary LOGDIR` and `kprof diff A B`: the analysis in the terminal, as JSON or HTML (arguments: ../cli.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .html import write_html
from .summary import Summary, summarize
from .tracediff import diff

SUMMARY_HELP = """\
Summarize torch.profiler traces: where the time went, per step, operator, kernel and label, with findings.

Exit status 0 when at least one trace was summarized (unreadable files are listed under
"Problems"), 1 when nothing could be read, 2 for bad arguments.
"""
DIFF_HELP = """\
What changed from A to B, with intervals and verdicts. A and B: a run folder, a trace file, or PATH@steps=SPEC for
some steps of a run (SPEC: numbers and ranges, e.g. log/run@steps=2-4,7).

Exit status 0 when both sides were read, 1 when one could not be (or a step selection does not match the run),
2 for bad arguments.
"""


def _per_run(path: Path, run: str, many: bool) -> Path:
    """`out.folded` -> `out.<run>.folded` when several runs are written."""
    if not many:
        return path
    return path.with_name(f"{path.stem}.{run.replace('/', '_')}{path.suffix}")


def run_summary(
    path: Path, *, as_json: bool = False, html: Path | None = None, top: int = 10, sort: str = "cuda",
    stacks: Path | None = None,
) -> int:
    """Run `kprof summary`; returns the exit status."""
    try:
        result = summarize(path, progress=sys.stderr.isatty())
    except (FileNotFoundError, ValueError) as exc:
        print(f"kprof summary: {exc}", file=sys.stderr)
        return 1
    runs: dict[str, Summary] = result if isinstance(result, dict) else {result.name: result}
    if as_json:
        doc = {name: s.to_dict() for name, s in runs.items()} if isinstance(result, dict) else result.to_dict()
        print(json.dumps(doc, indent=1))
    else:
        print("\n\n".join(s.render(top=top, sort=sort) for s in runs.values()))
    if html:
        write_html(runs, html, top=top, sort=sort)
        print(f"HTML report: {html}", file=sys.stderr)
    if stacks:
        for name, s in runs.items():
            out = s.export_stacks(_per_run(stacks, name, len(runs) > 1))
            print(f"folded stacks: {out}", file=sys.stderr)
    return 0


def run_diff(
    a: str, b: str, *, as_json: bool = False, html: Path | None = None, top: int = 10, confidence: float = 0.95,
) -> int:
    """Run `kprof diff`; returns the exit status."""
    try:
        result = diff(a, b, confidence=confidence)
    except (FileNotFoundError, ValueError) as exc:
        print(f"kprof diff: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result.to_dict(), indent=1) if as_json else result.render(top=top))
    if html:
        result.to_html(html, top=max(top, 30))
        print(f"HTML report: {html}", file=sys.stderr)
    return 0
