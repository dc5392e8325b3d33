"""The two sides of `kprof.diff`: parse `PATH@steps=SPEC`, summarize each run once (or read its saved summary),
pick the selected steps."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

from ..progress import ProgressArg
from . import fmt, perstep, saved
from .perstep import PerStep
from .summary import Summary, read_saved, runs_of, summarize_runs

SELECTION = re.compile(r"^(?P<path>.*)@steps=(?P<spec>[^@/]*)$")
MAX_STEPS = 100_000  # in one selection: more than any trace holds; a typo such as 2-2000000000 fails at once


def parse_steps(spec: str) -> list[int]:
    """`2-4,7` -> [2, 3, 4, 7]: step numbers and inclusive ranges, comma-separated."""
    steps: set[int] = set()
    for part in spec.replace(" ", "").split(","):
        match = re.fullmatch(r"([0-9]+)(?:-([0-9]+))?", part)  # ASCII digits: int() takes any script's
        if not match:
            raise ValueError(f"bad step selection {spec!r}: use numbers and ranges such as 2-4,7")
        lo, hi = int(match[1]), int(match[2] or match[1])
        if hi < lo:
            raise ValueError(f"bad step range {part!r} in {spec!r}: the end is before the start")
        if len(steps) + hi - lo >= MAX_STEPS:
            raise ValueError(f"bad step selection {spec[:80]!r}: more than {MAX_STEPS:,} steps")
        steps.update(range(lo, hi + 1))
    return sorted(steps)


@dataclasses.dataclass
class Input:
    """One side: what was given, the path, the selected step numbers (None: all) and its Summary."""

    source: str
    path: Path | None
    steps: list[int] | None
    summary: Summary | None = None


Source = str | os.PathLike | Summary | Input  # an Input: a Summary and its picked steps (the kprof tab's sides)


def _parse(x: Source, label: str) -> Input:
    """Check one side's argument and split off its step selection (no file is read here)."""
    if isinstance(x, Input):
        return x
    if isinstance(x, Summary):
        return Input(x.name, None, None, x)
    if not isinstance(x, (str, os.PathLike)):
        raise TypeError(
            f"{label} must be a run folder, trace file, saved summary, 'PATH@steps=2-4' or a Summary, "
            f"got {type(x).__name__}"
        )
    text = os.fspath(x)
    path, steps = split(text) if isinstance(x, str) else (Path(text), None)
    if not path.exists():
        raise FileNotFoundError(f"{label}: no such trace file, run folder or saved summary: {path}")
    return Input(text, path, steps)


def split(text: str) -> tuple[Path, list[int] | None]:
    """``PATH@steps=SPEC`` -> (PATH, its step numbers); a plain path -> (path, None). ValueError for a bad SPEC."""
    match = SELECTION.match(text)
    return (Path(match["path"]), parse_steps(match["spec"])) if match else (Path(text), None)


def load(a: Source, b: Source, *, jobs: int = 1, progress: ProgressArg = False) -> list[Input]:
    """Check both sides (before reading anything), then summarize each distinct path once (two selections of one
    run share one Summary), both sides' files together (``jobs``, ``progress``: as for `summarize`); a saved summary
    (`kprof summary --json`) is read back instead."""
    sides = [_parse(a, "a"), _parse(b, "b")]
    paths = {side.path.resolve(): side.path for side in sides if side.summary is None}
    files = {key: path for key, path in paths.items() if saved.is_saved(path)}
    traces = {key: path for key, path in paths.items() if key not in files}
    runs = []
    for path in traces.values():
        many, found = runs_of(path)
        if many:
            raise _several(path, list(found))
        runs += found.items()
    done: dict[Path, Summary | ValueError] = {key: _one_run(path) for key, path in files.items()}
    done.update(zip(traces, summarize_runs(runs, progress=progress, jobs=jobs)))
    for side in sides:
        if side.summary is None:
            result = done[side.path.resolve()]
            if isinstance(result, ValueError):
                raise result
            side.summary = result
    return sides


def _several(path: Path, names: list[str]) -> ValueError:
    return ValueError(
        f"{path} holds {len(names)} runs ({', '.join(names[:5])}): "
        "diff one run folder, trace file or saved summary against another"
    )


def _one_run(path: Path) -> Summary:
    """The one run's Summary saved in ``path`` (`kprof summary --json`)."""
    found = read_saved(path)
    if isinstance(found, dict):
        if len(found) != 1:
            raise _several(path, list(found))
        (found,) = found.values()
    return found


def _columns(side: Input, label: str) -> list[int]:
    """Columns of the side's per-step table that its selection picks (all steps without one)."""
    table = side.summary.per_step
    numbers = [s.step for s in table.steps]
    if side.steps is None:
        return list(range(len(numbers)))
    missing = sorted(set(side.steps) - set(numbers))
    if missing:
        raise ValueError(
            f"{label}: step{'s' * (len(missing) > 1)} {fmt.ranges(missing)} not in {side.summary.name} "
            f"(profiled steps: {fmt.ranges(n for n in numbers if n >= 0) or 'none numbered'})"
        )
    wanted = set(side.steps)
    return [i for i, n in enumerate(numbers) if n in wanted]


def select(sides: list[Input]) -> tuple[PerStep, PerStep]:
    """The two sides' per-step tables over their selected steps, with one set of rows."""
    cols = [_columns(side, label) for side, label in zip(sides, "ab")]
    if sides[0].summary is sides[1].summary and sides[0].steps is not None and sides[1].steps is not None:
        overlap = set(sides[0].steps) & set(sides[1].steps)
        if overlap:
            raise ValueError(f"the step selections overlap (steps {fmt.ranges(overlap)}): a step can be on one side")
    both = perstep.merge([side.summary.per_step.take(c) for side, c in zip(sides, cols)])
    return both.take(range(len(cols[0]))), both.take(range(len(cols[0]), len(both.steps)))
