"""A Summary saved as JSON (`kprof summary --json > base.json`, `Summary.to_dict`): how it is told from a trace and
checked as it is read back (`summary.read_saved`).

The file holds every table and the per-step rows `kprof.diff` tests, so CI can keep a file of kilobytes for the main
branch instead of its traces, and diff a pull request's run against it. It starts with a format key, which tells it
from a trace file (also JSON) by its first bytes: the key opens the file's object, or the object of its first run.
Whatever its name, and in UTF-8 (with a BOM or without) or UTF-16 (PowerShell's ``>``). The numbers a verdict rests
on are checked as it is read: a step time that is not a finite number >= 0 fails it, never passes a gate.
"""

from __future__ import annotations

import codecs
import dataclasses
import math
import numbers
import re
from pathlib import Path
from typing import Any

from .tables import StepStats

FORMAT_KEY = "kprof_summary"  # the first key of a saved summary (of each run's, in a file of several runs)
VERSION = 1  # bumped when a field the reader needs changes
_HEAD = 4096  # bytes read to tell a saved summary from a trace file
# The format key as the first key of the top object, or of the object that is the first value (a file of runs);
# never a name somewhere in a trace's events.
_OPENS = re.compile(rf'\s*\{{\s*(?:"(?:[^"\\]|\\.)*"\s*:\s*\{{\s*)?"{FORMAT_KEY}"\s*:')
_BOMS = ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))
_TIMES = [f.name for f in dataclasses.fields(StepStats) if f.name.endswith("_us") or f.name == "peak_memory"]


def is_saved(path: Path) -> bool:
    """Whether ``path`` is a file `kprof summary --json` wrote (its JSON opens with the format key)."""
    if not path.is_file():
        return False
    with path.open("rb") as f:
        head = f.read(_HEAD)
    return _OPENS.match(head.decode(encoding(head), errors="ignore")) is not None


def encoding(head: bytes) -> str:
    return next((name for bom, name in _BOMS if head.startswith(bom)), "utf-8")


def check(data: dict[str, Any]) -> None:
    """ValueError unless ``data`` is one run's saved summary in a format this kprof reads, its step times finite
    numbers >= 0 and its per-step rows pointing at its steps."""
    version = data.get(FORMAT_KEY) if isinstance(data, dict) else None
    if version != VERSION:
        raise ValueError(
            f"not a saved kprof summary of version {VERSION} (found {FORMAT_KEY}={version!r}): save it "
            "again with this kprof's `kprof summary --json`"
        )
    for i, step in enumerate(data["steps"]):
        for name in _TIMES:
            _number(f"steps[{i}].{name}", step[name])
    table, n = data["per_step"], len(data["steps"])
    for i, index in enumerate(table["steps"]):
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n:
            raise ValueError(f"per_step.steps[{i}] must be the index of one of the {n} steps, got {index!r}")
    for column in ("time_us", "calls"):
        for i, row in enumerate(table[column]):
            for j, value in enumerate(row):
                _number(f"per_step.{column}[{i}][{j}]", value)


def _number(where: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{where} must be a finite number >= 0, got {value!r}")
