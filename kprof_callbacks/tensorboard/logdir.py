"""Find kprof runs and comparisons under a TensorBoard logdir by listing folders and stat-ing files only.

A run is a folder holding at least one finished trace file; files still being written never make a folder a run.
A comparison is a ``compare.json`` written by ``kprof.compare`` (``read_comparison`` checks one). ``layout`` says
which file is which. Nothing here opens a trace, so listing a logdir with a hundred runs stays quick.

The tab serves what is below the logdir and nothing else: every file is resolved, and a link that leads out of the
logdir is refused (listed by name, never read), as are names with NUL bytes or longer than the file system allows.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

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
    partial: tuple[str, ...]  # ``<final>.partial`` names, one per capture being written
    snapshots: tuple[FileStat, ...]
    outside: tuple[str, ...]  # names of files that link out of the logdir: never read

    @property
    def fingerprint(self) -> tuple[tuple, ...]:
        return self.traces, self.partial, self.snapshots, self.outside

    def contents(self) -> layout.RunContents:
        """The files a summary of this run reads (links out of the logdir left out)."""
        return layout.RunContents(
            traces=[self.folder / f.name for f in self.traces],
            partial=[self.folder / name for name in self.partial],
            snapshots=[self.folder / f.name for f in self.snapshots],
            comparison=None,
        )

    def to_dict(self) -> dict:
        return {
            "run": self.name,
            "traces": [dataclasses.asdict(f) for f in self.traces],
            "partial": list(self.partial),
            "bytes": sum(f.bytes for f in self.traces),
            "modified": max(f.mtime_ns for f in self.traces) / 1e9,
        }


class BadName(ValueError):
    """A run, folder or file name the tab cannot look up (a NUL byte, too long); the message says which."""


_MAX_PATH, _MAX_COMPONENT = 4096, 255  # bytes: Linux's PATH_MAX and NAME_MAX


def check_name(name: str, what: str) -> None:
    """Raise BadName unless ``name`` can be a path below the logdir (no NUL byte, not longer than Linux allows)."""
    if "\0" in name:
        raise BadName(f"{what} {name[:80]!r} contains a NUL byte")
    encoded = name.encode(errors="surrogateescape")
    if len(encoded) > _MAX_PATH or any(len(part) > _MAX_COMPONENT for part in encoded.split(b"/")):
        raise BadName(
            f"{what} is too long ({len(encoded)} bytes; at most {_MAX_PATH} in all and {_MAX_COMPONENT} "
            "per folder or file name)"
        )


def is_below(logdir: Path, path: Path) -> bool:
    """Whether ``path``, with every link resolved, is ``logdir`` (resolved) or lies below it; False for a link that
    cannot be resolved (a loop)."""
    try:
        real = path.resolve()
    except (OSError, RuntimeError):  # pathlib raises RuntimeError for a symlink loop
        return False
    return real == logdir or logdir in real.parents


def _stat(logdir: Path, paths: list[Path], outside: list[str]) -> tuple[FileStat, ...]:
    """Stats of the ``paths`` that stay below ``logdir``; the names of the others go to ``outside``."""
    out = []
    for p in paths:
        if not is_below(logdir, p):
            outside.append(p.name)
            continue
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
    outside: list[str] = []
    traces, snapshots = _stat(logdir, found.traces, outside), _stat(logdir, found.snapshots, outside)
    if not traces:
        return None
    partial = tuple(p.name for p in found.partial)
    return RunFiles(layout.run_name(logdir, folder), folder, traces, partial, snapshots, tuple(outside))


def scan(logdir: Path) -> tuple[list[RunFiles], list[Path]]:
    """Every run below ``logdir`` and every ``compare.json``, in one walk (parents first, siblings by name)."""
    runs, comparisons = [], []
    for folder, found in layout.walk(logdir):
        run = _run(logdir, folder, found)
        if run is not None:
            runs.append(run)
        if found.comparison is not None and is_below(logdir, found.comparison):
            comparisons.append(found.comparison)
    return runs, comparisons


def has_data(logdir: Path) -> bool:
    """Whether ``logdir`` holds any run or comparison; stops at the first one found."""
    return any(found.traces or found.comparison for _, found in layout.walk(logdir))


def inside(logdir: Path, name: str) -> Path | None:
    """The folder ``name`` (relative, as ``layout.run_name`` gives it) below the resolved ``logdir``, or None.

    Names that lead out of the logdir (``..``, absolute paths, symlinks pointing elsewhere) give None; a name that
    cannot be a path (a NUL byte, too long) raises BadName.
    """
    check_name(name, "folder name")
    folder = logdir / name
    if not is_below(logdir, folder):
        return None
    folder = folder.resolve()
    return folder if folder.is_dir() else None


def read_comparison(path: Path) -> dict[str, Any]:
    """A `compare.json`, checked to have what the page reads (variants with names); ValueError says what is wrong."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path.name} is not readable JSON: {exc}") from exc
    variants = data.get("variants") if isinstance(data, dict) else None
    if not isinstance(variants, list) or not all(
        isinstance(v, dict) and isinstance(v.get("name"), str) for v in variants
    ):
        raise ValueError(f"{path.name} is not a kprof.compare result: it needs a list of variants, each with a name")
    for v in variants:
        trace_dir = v.get("trace_dir")
        if trace_dir is not None and not isinstance(trace_dir, str):
            raise ValueError(f"{path.name}: variant {v['name']!r} has a trace_dir that is not a string")
        if trace_dir:
            check_name(Path(trace_dir).name, f"{path.name}: the trace_dir of variant {v['name']!r}")
    return data
