"""`kprof summary LOGDIR` and `kprof diff A B`: the analysis in the terminal, as JSON, Markdown or HTML (arguments:
../cli.py).

The analysis is imported when a command runs, not with this module, so ``kprof --help`` stays quick.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .. import exits

if TYPE_CHECKING:
    from .summary import Summary

SUMMARY_HELP = """\
Summarize torch.profiler traces: where the time went, per step, operator, kernel and label, with findings.
LOGDIR may also be a summary saved with --json (read back as it was saved).

Exit status 0 when at least one trace was summarized (unreadable files are listed under
"Problems"), 1 when nothing could be read or a report could not be written, 2 for bad arguments.
Big runs are read by --jobs worker processes, with a progress bar on stderr (a terminal) for runs over 100 MB.
--json keeps the per-step rows kprof diff tests: the file can be side A of a diff (kprof summary --json > base.json).
"""
DIFF_HELP = """\
What changed from A to B, with intervals and verdicts. A and B: a run folder, a trace file, a summary saved with
kprof summary --json, or PATH@steps=SPEC for some steps of a run (SPEC: numbers and ranges, e.g. log/run@steps=2-4,7).

--fail-if-slower PCT gates on the step time: exit status 3 when B's typical step is significantly slower than A's
and the whole confidence interval of the slowdown lies above PCT percent; the report then says what grew. Exit
status 4 instead ("inconclusive: the machine changed") when B also ran on a busier or throttled machine and every
part of its step slowed alike.

Exit status 0 when both sides were read (and no regression), 1 when one could not be (or a step selection does not
match the run, or a side has too few steps for --fail-if-slower, or the report could not be written), 2 for bad
arguments (a malformed step selection included), 3 for a regression, 4 when the machine changed (either wins over a
report that could not be written).
"""


def _per_run(path: Path, run: str, many: bool) -> Path:
    """`out.folded` -> `out.<run>.folded` when several runs are written."""
    if not many:
        return path
    return path.with_name(f"{path.stem}.{run.replace('/', '_')}{path.suffix}")


def _bad_output(path: Path | None, option: str) -> str | None:
    """Why ``path`` cannot take a report (said before any trace is read), or None."""
    if path is None:
        return None
    if path.is_dir():
        return f"{option} {path}: is a folder; name the file to write, e.g. {path / 'report.html'}"
    if not path.parent.is_dir():
        return f"{option} {path}: there is no folder {path.parent}"
    return None


def _written(out: Path, write: Callable[[Path], object], command: str, what: str) -> bool:
    """Write a report through a temporary name, so a failed write (a full disk) leaves no half file; False after
    saying why in one line."""
    tmp = out.with_name(out.name + ".partial")
    try:
        write(tmp)
        tmp.replace(out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        print(f"kprof {command}: could not write {out}: {exc.strerror or exc}", file=sys.stderr)
        return False
    print(f"{what}: {out}", file=sys.stderr)
    return True


def run_summary(
    path: Path,
    *,
    as_json: bool = False,
    markdown: bool = False,
    html: Path | None = None,
    top: int = 10,
    sort: str = "cuda",
    stacks: Path | None = None,
    jobs: int = 1,
) -> int:
    """Run `kprof summary`; returns the exit status."""
    from .html import write_html
    from .summary import summarize
    from .workers import keep_freed_memory

    keep_freed_memory()

    bad = _bad_output(html, "--html") or _bad_output(stacks, "--stacks")
    if bad:
        print(f"kprof summary: {bad}", file=sys.stderr)
        return exits.BAD_ARGUMENTS
    try:
        result = summarize(path, progress=sys.stderr.isatty(), jobs=jobs)
    except (FileNotFoundError, ValueError) as exc:
        print(f"kprof summary: {exc}", file=sys.stderr)
        return exits.FAILED
    runs: dict[str, Summary] = result if isinstance(result, dict) else {result.name: result}
    if as_json:
        doc = {name: s.to_dict() for name, s in runs.items()} if isinstance(result, dict) else result.to_dict()
        print(json.dumps(doc, indent=1))
    elif markdown:
        print("\n\n".join(s.to_markdown(top=top, sort=sort) for s in runs.values()))
    else:
        print("\n\n".join(s.render(top=top, sort=sort) for s in runs.values()))
    ok = True
    if html:
        ok = _written(html, lambda out: write_html(runs, out, top=top, sort=sort), "summary", "HTML report")
    if stacks:
        for name, s in runs.items():
            ok &= _written(_per_run(stacks, name, len(runs) > 1), s.export_stacks, "summary", "folded stacks")
    return exits.OK if ok else exits.FAILED


def run_diff(
    a: str,
    b: str,
    *,
    as_json: bool = False,
    markdown: bool = False,
    html: Path | None = None,
    top: int = 10,
    confidence: float = 0.95,
    jobs: int = 1,
    fail_if_slower: float | None = None,
) -> int:
    """Run `kprof diff`; returns the exit status."""
    from .diff_inputs import load, split
    from .diff_report import gate
    from .tracediff import diff
    from .workers import keep_freed_memory

    keep_freed_memory()

    bad = _bad_output(html, "--html")
    try:
        for side in (a, b):
            split(side)  # a malformed step selection is a bad argument, said before any trace is read
    except ValueError as exc:
        bad = bad or str(exc)
    if bad:
        print(f"kprof diff: {bad}", file=sys.stderr)
        return exits.BAD_ARGUMENTS
    try:
        result = diff(*load(a, b, jobs=jobs, progress=sys.stderr.isatty()), confidence=confidence)
    except (FileNotFoundError, ValueError) as exc:
        print(f"kprof diff: {exc}", file=sys.stderr)
        return exits.FAILED
    status, no_verdict = None, None
    if fail_if_slower is not None:
        try:
            status = result.gate_status(fail_if_slower)
        except ValueError as exc:  # too few steps: the report says so too
            no_verdict = str(exc)
    if as_json:
        doc = result.to_dict()
        if fail_if_slower is not None:
            doc["gate"] = {
                "fail_if_slower_pct": fail_if_slower,
                "regressed": None if status is None else result.regressed(fail_if_slower),
                "inconclusive": status == exits.INCONCLUSIVE,
                "report": gate(result, fail_if_slower),
            }
        print(json.dumps(doc, indent=1))
    elif markdown:
        print(result.to_markdown(top=top, fail_if_slower=fail_if_slower))
    else:
        print(result.render(top=top, fail_if_slower=fail_if_slower))
    written = not html or _written(html, lambda out: result.to_html(out, top=max(top, 30)), "diff", "HTML report")
    if status in (exits.REGRESSION, exits.INCONCLUSIVE):
        return status
    if no_verdict:
        print(f"kprof diff: --fail-if-slower: {no_verdict}", file=sys.stderr)
    return exits.OK if written and not no_verdict else exits.FAILED
