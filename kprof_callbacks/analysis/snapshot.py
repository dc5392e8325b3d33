"""A CUDA allocator snapshot (``torch.cuda.memory._dump_snapshot``, ``memory_snapshot=True``) summarized: the peak of
its history, the blocks alive then with the Python lines that allocated them, what the allocator reserved, the
out-of-memory events it recorded. Read with `pickles` (plain values only, streamed, no torch), so a snapshot of a
gigabyte is summarized without loading it whole; the summary is a few kilobytes of JSON, which is what the kprof tab
and the reports show.

The history is the allocator's last ``max_entries`` events per device. Allocated memory over it is replayed from
the events (an allocation adds its size until its free is requested), anchored at the end to the blocks the snapshot
lists as in use; a block alive at the peak was allocated in the history (its frames say where), or before it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from array import array
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from .. import shell
from . import pickles

FIELDS = ("action", "addr", "size", "time_us", "frames", "device_free")
ACTIONS = (
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "oom",
)
_ALLOC, _FREE_REQUESTED, _FREE_COMPLETED, _SEG_ALLOC, _SEG_FREE, _SEG_MAP, _SEG_UNMAP, _OOM = range(len(ACTIONS))
_CODE = {name: i for i, name in enumerate(ACTIONS)}
TOP_BLOCKS, TOP_SITES, CURVE_POINTS, FRAMES = 20, 15, 400, 4
GROWTH_AFTER = 0.2  # growing sites: blocks alive at the end allocated after this share of the history
_LIBRARY = ("/site-packages/", "/dist-packages/", "/torch/", "/lib/python", "<frozen", "<string>")
_KEPT: dict[str, tuple[list[int], dict[str, Any]]] = {}  # summaries at hand in this process: [size, mtime]
_KEEP = 16
SUMMARY_SUFFIX = ".summary"  # kprof writes the summary beside a snapshot it saves: <snapshot>.summary (JSON)


_NUMBERS = (("addr", 0), ("size", 0), ("time_us", -1), ("device_free", -1))  # the numeric fields, their default


class _History:
    """One device's history as columns: runs of entries the reader's template read (`pickles.Run`) kept as they
    came, entries read one by one gathered in arrays (no object kept per number); `columns` joins them in order."""

    def __init__(self, list_at: Callable[[int], Any] | None = None) -> None:
        self.parts: list[pickles.Run | dict[str, array]] = []
        self.side: list[Any] = [None]  # the frames of entries read one by one (a handle -k is side[k - 1])
        self.list_at = list_at  # the frames of a run's entry, from where it starts in the file

    def add(self, values: tuple | pickles.Run) -> None:
        if isinstance(values, pickles.Run):
            self.parts.append(values)
            return
        if not self.parts or isinstance(self.parts[-1], pickles.Run):
            self.parts.append({"action": array("b"), **{k: array("q") for k, _ in _NUMBERS}, "frames": array("q")})
        part, got = self.parts[-1], dict(zip(FIELDS, values))
        action = got["action"]
        part["action"].append(_CODE.get(action, -1) if isinstance(action, str) else -1)
        for name, default in _NUMBERS:
            part[name].append(got[name] if isinstance(got[name], int) else default)
        part["frames"].append(-len(self.side) - 1)
        self.side.append(got["frames"])

    def columns(self) -> dict[str, np.ndarray]:
        """action (codes), addr, size, time_us, device_free and frames (handles for `frames`), one row per entry."""
        out: dict[str, list[np.ndarray]] = {name: [] for name in ("action", *dict(_NUMBERS), "frames")}
        for part in self.parts:
            if not isinstance(part, pickles.Run):
                for name, column in part.items():
                    out[name].append(np.frombuffer(column, np.int8 if name == "action" else np.int64))
                continue
            out["action"].append(_column(part, "action", -1, lambda v: _CODE.get(v, -1) if isinstance(v, str) else -1))
            for name, default in _NUMBERS:
                out[name].append(_column(part, name, default, lambda v, d=default: v if isinstance(v, int) else d))
            out["frames"].append(part.starts if "frames" in part.lists else np.full(len(part), -1, np.int64))
        return {
            name: np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
            for name, parts in out.items()
        }

    def frames(self, handle: int) -> Any:
        """The frames of an entry, from its handle in `columns`' ``frames``: as read, or a run's entry's list."""
        return self.side[-handle - 1] if handle < 0 else self.list_at(handle)


def _column(run: pickles.Run, name: str, default: int, convert: Callable[[Any], int]) -> np.ndarray:
    """A run's column as numbers: as read, ``convert`` of each distinct value, or ``default`` where absent."""
    column = run.columns.get(name)
    if column is None:
        return np.full(len(run), default, np.int64)
    if isinstance(column, pickles.Coded):
        return np.array([convert(v) for v in column.values], np.int64)[column.index]
    return column


def site_of(frames: Iterable[Any]) -> str:
    """The innermost frame of the program's own code (not torch's or a library's) as ``file:line in name``, else
    the innermost frame, else ""."""
    frames = [f for f in frames if isinstance(f, dict)]
    own = [f for f in frames if str(f.get("filename", "")).endswith(".py") and not _library(f)]
    f = (own or frames or [None])[0]
    return "" if f is None else f"{Path(str(f.get('filename', ''))).name}:{f.get('line')} in {f.get('name')}"


def _library(frame: dict) -> bool:
    return any(part in str(frame.get("filename", "")) for part in _LIBRARY)


def _frame_lines(frames: Iterable[Any]) -> list[str]:
    return [f"{f.get('filename')}:{f.get('line')} in {f.get('name')}" for f in frames if isinstance(f, dict)][:FRAMES]


def _ends(action: np.ndarray, addr: np.ndarray) -> np.ndarray:
    """Per event: for an allocation, the index of the event that frees it (the next free, or reuse, at its address;
    n: not in the history); for a free that ends no allocation of the history (a block from before it), -1; else
    -2 (a free that ends one, the completion of a requested free, other actions)."""
    n = action.size
    out = np.full(n, -2, np.int64)
    rows = np.flatnonzero(np.isin(action, (_ALLOC, _FREE_REQUESTED, _FREE_COMPLETED)))
    order = rows[np.lexsort((rows, addr[rows]))]
    kind = action[order]
    same = addr[order][1:] == addr[order][:-1]
    after, before = np.r_[same, False], np.r_[False, same]
    next_row, prev_kind = np.r_[order[1:], -1], np.r_[-1, kind[:-1]]
    alloc = kind == _ALLOC
    out[order[alloc]] = np.where(after, next_row, n)[alloc]
    ends_one = before & (prev_kind == _ALLOC)
    completes = before & (kind == _FREE_COMPLETED) & (prev_kind == _FREE_REQUESTED)
    out[order[~alloc & ~ends_one & ~completes]] = -1
    return out


def _curve(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> list[list[int]]:
    """[[x, allocated, reserved], ...]: every point when few, else the lowest and the highest of each span."""
    keep = np.arange(x.size)
    if x.size > CURVE_POINTS:
        bounds = np.linspace(0, x.size, CURVE_POINTS // 2 + 1).astype(np.int64)
        picked = {int(np.argmax(y))}
        for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            picked |= {lo + int(np.argmin(y[lo:hi])), lo + int(np.argmax(y[lo:hi]))}
        keep = np.array(sorted(picked))
    return [[int(x[i]), int(y[i]), int(z[i])] for i in keep.tolist()]


def _device(h: _History, end: _Segments, resolve: Callable[[Any], list]) -> dict[str, Any]:
    """One device's summary: the peak of its history and what was alive then."""
    columns = h.columns()
    action, addr, size, time = columns["action"], columns["addr"], columns["size"], columns["time_us"]

    def frames_of(i: int) -> list:
        return resolve(h.frames(int(columns["frames"][i])))

    n = action.size
    ends = _ends(action, addr)
    delta = np.where(action == _ALLOC, size, np.where(ends == -1, -size, 0))
    paired = ends[(action == _ALLOC) & (ends < n)]
    delta[paired] -= size[paired]
    running = np.cumsum(delta)
    allocated = end.allocated - (running[-1] if n else 0) + running
    growth = np.isin(action, (_SEG_ALLOC, _SEG_MAP)).astype(np.int64) - np.isin(action, (_SEG_FREE, _SEG_UNMAP))
    seg_running = np.cumsum(growth * size)
    reserved = end.reserved - (seg_running[-1] if n else 0) + seg_running
    out: dict[str, Any] = {"entries": int(n)}
    if not n:
        return out
    peak = int(np.argmax(allocated))
    idx = np.arange(n)
    alive = np.flatnonzero(((action == _ALLOC) & (idx <= peak) & (ends > peak)) | ((ends == -1) & (idx > peak)))
    alive = alive[np.argsort(-size[alive], kind="stable")]
    timed = bool((time >= 0).all())
    out.update(
        peak=int(allocated[peak]),
        peak_at=peak,
        peak_time_us=int(time[peak]) if time[peak] >= 0 else None,
        reserved_at_peak=int(reserved[peak]),
        x="time_us" if timed else "entry",
        curve=_curve(time if timed else idx, allocated, reserved),
        unseen_at_peak=max(int(allocated[peak]) - int(size[alive].sum()), 0),
        oom=[
            {
                "size": int(size[i]),
                "device_free": int(columns["device_free"][i]),
                "time_us": int(time[i]) if time[i] >= 0 else None,
                "site": site_of(frames_of(i)),
            }
            for i in np.flatnonzero(action == _OOM).tolist()
        ],
        growing=_growing(frames_of, action, ends, size),
        **_alive_detail(frames_of, alive, size, action),
    )
    return out


def _alive_detail(frames_of: Callable[[int], list], alive: np.ndarray, size: np.ndarray, action: np.ndarray) -> dict:
    """The largest blocks alive at the peak and the allocation sites holding the most then."""
    return _holders((int(size[i]), frames_of(i) if action[i] == _ALLOC else None) for i in alive.tolist())


def _holders(held: Iterable[tuple[int, list | None]], prefix: str = "") -> dict[str, list[dict]]:
    """``blocks`` (the largest, largest first) and ``sites`` (the allocation sites holding the most) of blocks given
    as (size, frames; None for one allocated before the history), largest first; keys after ``prefix``."""
    sites: dict[str, list[int]] = {}
    blocks = []
    for size, frames in held:
        site = "(allocated before the history)" if frames is None else site_of(frames)
        entry = sites.setdefault(site, [0, 0])
        entry[0] += size
        entry[1] += 1
        if len(blocks) < TOP_BLOCKS:
            blocks.append({"size": size, "site": site, "frames": _frame_lines(frames or [])})
    ranked = sorted(sites.items(), key=lambda kv: -kv[1][0])[:TOP_SITES]
    return {
        f"{prefix}blocks": blocks,
        f"{prefix}sites": [{"site": s, "bytes": b, "blocks": c} for s, (b, c) in ranked],
    }


def _growing(frames_of: Callable[[int], list], action: np.ndarray, ends: np.ndarray, size: np.ndarray) -> list[dict]:
    """Sites of blocks alive at the end of the history allocated after its first GROWTH_AFTER (leaks)."""
    start = int(action.size * GROWTH_AFTER)
    late = np.flatnonzero((action == _ALLOC) & (ends == action.size) & (np.arange(action.size) >= start))
    held: dict[str, list[int]] = {}
    for i in late.tolist():
        site = site_of(frames_of(i))
        if site:
            entry = held.setdefault(site, [0, 0])
            entry[0] += int(size[i])
            entry[1] += 1
    return [{"site": s, "bytes": b, "blocks": c} for s, (b, c) in sorted(held.items(), key=lambda kv: -kv[1][0])][:5]


class _Segments:
    """One device's segments at the end of the history: bytes in use, bytes reserved, count, largest free block, and
    the blocks in use (size, frames)."""

    def __init__(self) -> None:
        self.allocated = self.reserved = self.count = self.largest_free = 0
        self.held: list[tuple[int, list]] = []

    def add(self, segment: dict) -> None:
        self.count += 1
        self.reserved += int(segment.get("total_size", 0) or 0)
        for block in segment.get("blocks", []):
            if isinstance(block, dict):
                size = int(block.get("size", 0) or 0)
                if block.get("state") == "active_allocated":
                    self.allocated += size
                    frames = block.get("frames")
                    self.held.append((size, frames if isinstance(frames, list) else []))
                elif block.get("state") == "inactive":
                    self.largest_free = max(self.largest_free, size)

    def to_dict(self) -> dict[str, Any]:
        """The device's end state: what the summary's device has whether or not its history was read."""
        held = sorted(self.held, key=lambda b: -b[0])
        return {
            "segments": self.count,
            "largest_free": self.largest_free,
            "allocated_end": self.allocated,
            "reserved_end": self.reserved,
            **_holders(held, "end_"),
        }


def _segments(value: Any) -> dict[int, _Segments]:
    out: dict[int, _Segments] = {}
    segments = value.get("segments", []) if isinstance(value, dict) else []
    for seg in segments if isinstance(segments, list) else []:
        if isinstance(seg, dict):
            out.setdefault(int(seg.get("device", 0) or 0), _Segments()).add(seg)
    return out


def _summary(value: Any, histories: dict[int, _History], resolve: Any) -> dict[str, Any]:
    """The summary of a snapshot whose value (its history streamed out) and histories are given."""
    segments = _segments(value)
    devices = []
    for device in sorted(set(segments) | set(histories)):
        end = segments.get(device, _Segments())
        found = _device(histories.get(device, _History()), end, resolve)
        devices.append({"device": device, **end.to_dict(), **found})
    return {"devices": devices}


def summarize(path: Path, progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """The summary of the snapshot at ``path``: the one saved beside it (or kept by this process where it could not
    be saved) when that is of this file, else read (streamed, ``progress`` told the bytes read so far) and saved
    beside it, so that the next reader finds it. ValueError (a `pickles.PickleError`) for a file that is not a
    snapshot of plain values."""
    stat = path.stat()
    saved = _saved(path, stat)
    if saved is not None:
        return saved
    histories: dict[int, _History] = {}

    def add(device: int, values: tuple | pickles.Run) -> None:
        if device not in histories:
            histories[device] = _History(lambda start: reader.list_at(start, "frames"))
        histories[device].add(values)
        if progress is not None and isinstance(values, pickles.Run):
            progress(int(values.starts[-1]))

    reader: pickles.Reader
    value, reader = pickles.read(path, add, FIELDS)
    summary = {"path": str(path), "bytes": stat.st_size, **_summary(value, histories, reader.resolve)}
    try:
        save_beside(summary, path, stat)
    except OSError:  # a folder it may not write to: kept by this process instead
        keep(path, [stat.st_size, stat.st_mtime_ns], summary)
    return summary


def keep(path: Path, of: list[int], summary: dict[str, Any]) -> None:
    """Keep ``summary`` in this process for `summarize` to answer with while the snapshot at ``path`` is the file of
    ``of`` ([size, mtime in ns]): where it could not be saved beside it, was read by another process, or was read
    from beside it once."""
    _KEPT[str(path)] = (of, summary)
    while len(_KEPT) > _KEEP:
        _KEPT.pop(next(iter(_KEPT)))


def snapshot_known(path: Path) -> bool:
    """Whether `summarize` answers for the snapshot at ``path`` without reading it (its summary saved or kept)."""
    return _saved(path, path.stat()) is not None


def snapshot_end_state(path: Path) -> dict[str, Any] | None:
    """The snapshot at ``path`` at its end (per device: memory in use and reserved, the blocks in use and the lines
    that allocated them), from its ``segments`` alone, which torch writes before the history: a summary marked
    ``partial`` (no history, no peak), read in a fraction of the time. None where the history comes first."""
    head = pickles.read_head(path)
    if not isinstance(head, dict) or not isinstance(head.get("segments"), list):
        return None
    devices = [{"device": device, **end.to_dict()} for device, end in sorted(_segments(head).items())]
    return {"path": str(path), "bytes": path.stat().st_size, "partial": True, "devices": devices}


def summarize_value(value: dict[str, Any], path: Path) -> dict[str, Any]:
    """The summary of a snapshot held in memory (``torch.cuda.memory._snapshot()``) that is saved at ``path``."""
    histories: dict[int, _History] = {}
    for device, trace in enumerate(value.get("device_traces", [])):
        history = histories.setdefault(device, _History())
        for entry in trace:
            history.add(tuple(entry.get(f) for f in FIELDS))
    return {"path": str(path), "bytes": path.stat().st_size, **_summary(value, histories, lambda f: f or [])}


def save_beside(summary: dict[str, Any], path: Path, stat: os.stat_result | None = None) -> Path:
    """Write ``summary`` beside the snapshot at ``path`` with the snapshot's size and time (``stat``, taken before
    it was read; default: now), so that a changed snapshot is read again; the file it wrote. OSError where it cannot
    be written (nothing is left behind)."""
    stat = stat or path.stat()
    out = path.with_name(path.name + SUMMARY_SUFFIX)
    tmp = out.with_name(f"{out.name}.{os.getpid()}-{threading.get_ident()}.tmp")  # writers never share one
    try:
        tmp.write_text(json.dumps({**summary, "of": [stat.st_size, stat.st_mtime_ns]}), encoding="utf-8")
        os.replace(tmp, out)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    return out


def _saved(path: Path, stat: os.stat_result) -> dict[str, Any] | None:
    """The summary this process kept, or kprof saved beside the snapshot (then kept), if it is of the file as it is
    now."""
    kept = _KEPT.get(str(path))
    if kept is not None and kept[0] == [stat.st_size, stat.st_mtime_ns]:
        return kept[1]
    try:
        data = json.loads(path.with_name(path.name + SUMMARY_SUFFIX).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    of = [stat.st_size, stat.st_mtime_ns]
    if not isinstance(data, dict) or data.pop("of", None) != of:
        return None
    keep(path, of, data)  # the tab asks on every request: the next answer is a lookup, not a parse
    return data


def summaries(paths: list[Path]) -> list[dict[str, Any]]:
    """The summary of each snapshot that can be read; one that cannot becomes ``{"path", "error"}``."""
    out = []
    for path in paths:
        try:
            out.append(summarize(path))
        except (OSError, ValueError) as exc:
            out.append({"path": str(path), "error": f"{type(exc).__name__}: {exc}"})
    return out


def summarize_apart(path: Path, progress: Callable[[int], None]) -> dict[str, Any]:
    """`summarize` of the snapshot at ``path`` in a fresh interpreter (`main`), so that this process's threads
    keep answering meanwhile; ``progress`` is told the bytes read as it goes. The summary, also kept by this process
    (`keep`); ValueError with the reader's reason where it fails."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    command = [*shell.module_command(__name__), str(path)]
    found, said = None, []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as proc:
        for line in proc.stdout or ():
            if line.strip().isdigit():
                progress(int(line))
            elif line.startswith("{"):
                found = json.loads(line)
            else:
                said.append(line.strip())
    if proc.returncode != 0 or found is None:
        raise ValueError(next((s for s in reversed(said) if s), f"the reader exited with {proc.returncode}"))
    keep(path, found["of"], found["summary"])
    return found["summary"]


def main(argv: list[str] | None = None) -> int:
    """``python -m kprof_callbacks.analysis.snapshot PATH``: `summarize` PATH in this process (the kprof tab runs
    it apart, so that its own threads keep answering), a line with the bytes read so far as it goes, then one line
    of JSON: ``{"of": [size, mtime in ns], "summary": ...}``. A file it cannot read: the reason on stderr, exit 1."""
    path = Path((sys.argv[1:] if argv is None else argv)[0])
    try:
        stat = path.stat()
        summary = summarize(path, lambda done: print(done, flush=True))
    except (OSError, ValueError) as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"of": [stat.st_size, stat.st_mtime_ns], "summary": summary}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
