"""Find kprof runs and comparisons under a TensorBoard logdir by listing folders and stat-ing files only.

A run is a folder holding at least one finished trace file (`*.pt.trace.json[.gz]`); files still being
written (`*.partial`) never make a folder a run. A comparison is a `compare.json` written by `kprof.compare`.
Nothing here opens a trace, so listing a logdir with a hundred runs stays quick.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

from ..analysis.reader import run_contents

COMPARE_FILE = "compare.json"


@dataclasses.dataclass(frozen=True)
class FileStat:
    """A file of a run as the cache sees it: a new capture or a rewrite changes size or mtime."""

    name: str
    bytes: int
    mtime_ns: int


@dataclasses.dataclass(frozen=True)
class RunFiles:
    """The files of one run folder: finished traces, temp files still being written, memory snapshots."""

    name: str  # path relative to the logdir, '/'-separated ('.' for the logdir itself)
    folder: Path
    traces: tuple[FileStat, ...]
    partial: tuple[FileStat, ...]
    snapshots: tuple[FileStat, ...]

    @property
    def fingerprint(self) -> tuple[tuple[FileStat, ...], ...]:
        return self.traces, self.partial, self.snapshots

    def to_dict(self) -> dict:
        return {
            "run": self.name,
            "traces": [dataclasses.asdict(f) for f in self.traces],
            "partial": [f.name for f in self.partial],
            "bytes": sum(f.bytes for f in self.traces),
            "modified": max(f.mtime_ns for f in self.traces) / 1e9,
        }


def _stat(paths: list[Path]) -> tuple[FileStat, ...]:
    out = []
    for p in paths:
        try:
            st = p.stat()
        except FileNotFoundError:  # renamed or removed since the folder was listed
            continue
        out.append(FileStat(p.name, st.st_size, st.st_mtime_ns))
    return tuple(out)


def _folders(logdir: Path) -> Iterator[tuple[Path, list[str]]]:
    for dirpath, dirnames, filenames in os.walk(logdir):
        dirnames.sort()
        yield Path(dirpath), filenames


def run_name(logdir: Path, folder: Path) -> str:
    """`folder`'s name as the tab and TensorBoard's run list show it: its path relative to `logdir`."""
    return folder.relative_to(logdir).as_posix()


def run_files(logdir: Path, folder: Path) -> RunFiles | None:
    """The run in `folder` (below `logdir`), or None when it holds no finished trace file (or is gone)."""
    try:
        traces, partial, snapshots = run_contents(folder, any_json=False)
    except (FileNotFoundError, NotADirectoryError):  # removed since it was listed, or a variant that never ran
        return None
    stats = _stat(traces)
    if not stats:
        return None
    return RunFiles(run_name(logdir, folder), folder, stats, _stat(partial), _stat(snapshots))


def scan(logdir: Path) -> tuple[list[RunFiles], list[Path]]:
    """Every run below `logdir` and every `compare.json`, in one walk (parents first, siblings by name)."""
    runs, comparisons = [], []
    for folder, files in _folders(logdir):
        run = run_files(logdir, folder)
        if run is not None:
            runs.append(run)
        if COMPARE_FILE in files:
            comparisons.append(folder / COMPARE_FILE)
    return runs, comparisons


def has_data(logdir: Path) -> bool:
    """Whether `logdir` holds any run or comparison; stops at the first one found."""
    for folder, files in _folders(logdir):
        if COMPARE_FILE in files or run_files(logdir, folder) is not None:
            return True
    return False


def inside(logdir: Path, name: str) -> Path | None:
    """The folder `name` (relative, as `run_name` gives it) below the resolved `logdir`, or None.

    Names that lead out of the logdir (`..`, absolute paths, symlinks pointing elsewhere) give None.
    """
    folder = (logdir / name).resolve()
    if folder != logdir and logdir not in folder.parents:
        return None
    return folder if folder.is_dir() else None
