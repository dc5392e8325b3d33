"""Find kprof runs and comparisons under a TensorBoard logdir by listing folders and stat-ing files only.

A run is a folder holding at least one finished trace file; files still being written never make a folder a run.
A comparison is a ``compare.json`` written by ``kprof.compare``. ``layout`` says which file is which. Nothing here
opens a trace, so listing a logdir with a hundred runs stays quick.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .. import layout


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


def run_files(logdir: Path, folder: Path) -> RunFiles | None:
    """The run in ``folder`` (below ``logdir``), or None when it holds no finished trace file (or is gone)."""
    try:
        found = layout.contents(folder)
    except (FileNotFoundError, NotADirectoryError):  # removed since it was listed, or a variant that never ran
        return None
    return _run(logdir, folder, found)


def _run(logdir: Path, folder: Path, found: layout.RunContents) -> RunFiles | None:
    stats = _stat(found.traces)
    if not stats:
        return None
    return RunFiles(layout.run_name(logdir, folder), folder, stats, _stat(found.partial), _stat(found.snapshots))


def scan(logdir: Path) -> tuple[list[RunFiles], list[Path]]:
    """Every run below ``logdir`` and every ``compare.json``, in one walk (parents first, siblings by name)."""
    runs, comparisons = [], []
    for folder, found in layout.walk(logdir):
        run = _run(logdir, folder, found)
        if run is not None:
            runs.append(run)
        if found.comparison is not None:
            comparisons.append(found.comparison)
    return runs, comparisons


def has_data(logdir: Path) -> bool:
    """Whether ``logdir`` holds any run or comparison; stops at the first one found."""
    return any(found.traces or found.comparison for _, found in layout.walk(logdir))


def inside(logdir: Path, name: str) -> Path | None:
    """The folder ``name`` (relative, as ``layout.run_name`` gives it) below the resolved ``logdir``, or None.

    Names that lead out of the logdir (``..``, absolute paths, symlinks pointing elsewhere) give None.
    """
    folder = (logdir / name).resolve()
    if folder != logdir and logdir not in folder.parents:
        return None
    return folder if folder.is_dir() else None
