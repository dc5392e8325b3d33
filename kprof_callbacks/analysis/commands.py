"""`kprof summary LOGDIR` and `kprof diff A B`: the analysis in the terminal, as JSON, Markdown or HTML (arguments:
../cli.py).

The analysis is imported when a command runs, not with this module, so ``kprof --help`` stays quick.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .. import exits

if TYPE_CHECKING:
    from .summary import Summary
    from .tracediff import Diff


def _per_run(path: Path, run: str, many: bool) -> Path:
    """`out.folded` -> `out.<run>.folded` when several runs are written; a `/` in the run's name is written `%2F` (and
    `%` as `%25`), so that two runs never get one file (`x/y` and `x_y`)."""
    if not many:
        return path
    return path.with_name(f"{path.stem}.{run.replace('%', '%25').replace('/', '%2F')}{path.suffix}")


def _capped(jobs: int, command: str) -> int:
    """``--jobs``, at most the cores (said in one line): more processes than cores only share them, each holding
    memory of its own (1,000 on 2 cores started 76 workers, 3.6 GB, and read 4x slower)."""
    from .workers import default_jobs

    cores = default_jobs()
    if jobs <= cores:
        return jobs
    print(f"kprof {command}: --jobs {jobs} is more than the {cores} cores here; reading with {cores}", file=sys.stderr)
    return cores


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
    """Write a report where the shell's ``>`` would: a regular file (new, or a link's target) through a temporary name
    renamed into place, so a failed write (a full disk) leaves no half file; anything else (a FIFO, a device,
    /dev/stdout) is opened and written in place, never replaced. False after saying why in one line."""
    target = _rename_target(out)
    tmp = None if target is None else target.with_name(target.name + ".partial")
    try:
        if tmp is None:
            write(out)
        else:
            write(tmp)
            tmp.replace(target)
    except OSError as exc:
        if tmp is not None:
            with contextlib.suppress(OSError):  # a read-only file system refuses the clean-up too
                tmp.unlink(missing_ok=True)
        print(f"kprof {command}: could not write {out}: {exc.strerror or exc}", file=sys.stderr)
        return False
    print(f"{what}: {out}", file=sys.stderr)
    return True


def _rename_target(out: Path) -> Path | None:
    """The regular file a report to ``out`` replaces: ``out``, or the end of its chain of links; None when the report
    is to be written in place: ``out`` is (or leads to) something other than a regular file, or leads through /proc
    (``/dev/stdout``, ``/dev/fd/N``: whatever the descriptor is open on)."""
    path = Path(os.path.abspath(out))
    for _ in range(40):  # the kernel's own limit on links followed
        if Path(os.path.realpath(path.parent)).parts[1:2] == ("proc",):
            return None
        if not path.is_symlink():
            break
        path = Path(os.path.normpath(path.parent / os.readlink(path)))
    try:
        return path if stat.S_ISREG(path.stat().st_mode) else None
    except FileNotFoundError:
        return path
    except OSError:
        return None


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

    jobs = _capped(jobs, "summary")
    bad = _bad_output(html, "--html") or _bad_output(stacks, "--stacks")
    if bad:
        print(f"kprof summary: {bad}", file=sys.stderr)
        return exits.USAGE
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
    fail_if_more_memory: float | None = None,
) -> int:
    """Run `kprof diff`; returns the exit status."""
    from .diff_inputs import load
    from .tracediff import diff
    from .workers import keep_freed_memory

    keep_freed_memory()

    jobs = _capped(jobs, "diff")
    bad = _bad_diff_arguments(a, b, html)
    if bad:
        print(f"kprof diff: {bad}", file=sys.stderr)
        return exits.USAGE
    try:
        result = diff(*load(a, b, jobs=jobs, progress=sys.stderr.isatty()), confidence=confidence)
    except (FileNotFoundError, ValueError) as exc:
        print(f"kprof diff: {exc}", file=sys.stderr)
        return exits.FAILED
    status, more_memory, no_verdict = _gates(result, fail_if_slower, fail_if_more_memory)
    if as_json:
        print(json.dumps(_diff_json(result, status, more_memory, fail_if_slower, fail_if_more_memory), indent=1))
    elif markdown:
        print(result.to_markdown(top=top, fail_if_slower=fail_if_slower, fail_if_more_memory=fail_if_more_memory))
    else:
        print(result.render(top=top, fail_if_slower=fail_if_slower, fail_if_more_memory=fail_if_more_memory))
    written = not html or _written(html, lambda out: result.to_html(out, top=max(top, 30)), "diff", "HTML report")
    if status == exits.REGRESSION or more_memory:
        return exits.REGRESSION
    if status == exits.INCONCLUSIVE:
        return status
    if no_verdict:
        print(f"kprof diff: {no_verdict}", file=sys.stderr)
    return exits.OK if written and not no_verdict else exits.FAILED


def _bad_diff_arguments(a: str, b: str, html: Path | None) -> str | None:
    """What is wrong with `kprof diff`'s arguments, said before any trace is read (None: nothing)."""
    from .diff_inputs import split

    bad = _bad_output(html, "--html")
    try:
        for side in (a, b):
            split(side)  # a malformed step selection is a bad argument
    except ValueError as exc:
        bad = bad or str(exc)
    return bad


def _gates(
    result: Diff, fail_if_slower: float | None, fail_if_more_memory: float | None
) -> tuple[int | None, bool | None, str | None]:
    """The step-time gate's status, whether B's memory grew past its gate, and why a gate has no verdict (each None
    where its gate was not asked for or has no verdict)."""
    status, no_verdict = None, None
    if fail_if_slower is not None:
        try:
            status = result.gate_status(fail_if_slower)
        except ValueError as exc:  # too few steps: the report says so too
            no_verdict = f"--fail-if-slower: {exc}"
    more_memory = None
    if fail_if_more_memory is not None:
        try:
            more_memory = result.more_memory(fail_if_more_memory)
        except ValueError as exc:  # no memory events: the report says so too
            no_verdict = f"--fail-if-more-memory: {exc}"
    return status, more_memory, no_verdict


def _diff_json(
    result: Diff,
    status: int | None,
    more_memory: bool | None,
    fail_if_slower: float | None,
    fail_if_more_memory: float | None,
) -> dict:
    """The diff as `kprof diff --json` prints it: with the gates' verdicts and reports where they were asked for."""
    from .diff_report import gate
    from .memory_diff import gate as memory_gate

    doc = result.to_dict()
    if fail_if_slower is not None:
        doc["gate"] = {
            "fail_if_slower_pct": fail_if_slower,
            "regressed": None if status is None else result.regressed(fail_if_slower),
            "inconclusive": status == exits.INCONCLUSIVE,
            "report": gate(result, fail_if_slower),
        }
    if fail_if_more_memory is not None:
        doc["memory_gate"] = {
            "fail_if_more_memory_pct": fail_if_more_memory,
            "regressed": more_memory,
            "report": memory_gate(result, fail_if_more_memory),
        }
    return doc
