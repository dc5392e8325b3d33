"""A Summary saved as JSON (`kprof summary --json > base.json`, `Summary.to_dict`) and read back.

The file holds every table and the per-step rows `kprof.diff` tests, so CI can keep a file of kilobytes for the main
branch instead of its traces, and diff a pull request's run against it. It starts with a format key, which tells it
from a trace file (also JSON) by its first bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .summary import Summary

FORMAT_KEY = "kprof_summary"  # the first key of a saved summary (of each run's, in a file of several runs)
VERSION = 1  # bumped when a field the reader needs changes
_HEAD = 4096  # bytes read to tell a saved summary from a trace file


def is_saved(path: Path) -> bool:
    """Whether ``path`` is a file `kprof summary --json` wrote (its first bytes hold the format key)."""
    if not path.is_file() or path.suffix != ".json":
        return False
    with path.open("rb") as f:
        head = f.read(_HEAD)
    return head.lstrip().startswith(b"{") and f'"{FORMAT_KEY}"'.encode() in head


def check_version(data: dict[str, Any]) -> None:
    """ValueError unless ``data`` is one run's saved summary in a format this kprof reads."""
    version = data.get(FORMAT_KEY) if isinstance(data, dict) else None
    if version != VERSION:
        raise ValueError(
            f"not a saved kprof summary of version {VERSION} (found {FORMAT_KEY}={version!r}): save it "
            "again with this kprof's `kprof summary --json`"
        )


def read(path: Path) -> Summary | dict[str, Summary]:
    """The Summary saved in ``path``, or a dict run name -> Summary for a file of several runs (a logdir's)."""
    from .summary import Summary

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if FORMAT_KEY in data:
            return Summary.from_dict(data)
        return {name: Summary.from_dict(run) for name, run in data.items()}
    except (OSError, ValueError, AttributeError, IndexError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: cannot read this saved kprof summary ({type(exc).__name__}: {exc})") from None
