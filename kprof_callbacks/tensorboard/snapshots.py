"""The run's big CUDA allocator snapshots that the tab has not read yet: each is read in a process of its own (kprof's
streaming reader, `summarize_apart`, which saves the summary beside it; apart, so that reading does not hold the
interpreter lock TensorBoard's request threads need), and meanwhile shown by its end state
(`snapshot_end_state`: the blocks in use at its end and the lines that allocated them, read from the ``segments``
torch writes before the history), marked partial with how much of the history has been read. The run's summary
leaves such a snapshot out until its read ends, then takes it in (its fingerprint names the snapshots left out)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from ..analysis import PROGRESS_BYTES, snapshot_end_state, snapshot_known, summarize_apart
from . import logdir
from .cache import FileCache

log = logging.getLogger(__name__)


class SnapshotReads:
    """The snapshots being read in the background, their progress, and their end states (cached per file)."""

    def __init__(self) -> None:
        self._reads: dict[tuple, dict[str, Any]] = {}  # (path, bytes, mtime) -> {"done", "total", "error"}
        self._guard = threading.Lock()
        self._ends: FileCache[dict[str, Any]] = FileCache(16)

    @staticmethod
    def unread(run: logdir.RunFiles) -> tuple[str, ...]:
        """The names of the run's snapshots over PROGRESS_BYTES whose summary is not at hand (not saved beside them):
        those the run's summary leaves out for now."""
        return tuple(
            f.name for f in run.snapshots if f.bytes > PROGRESS_BYTES and not snapshot_known(run.folder / f.name)
        )

    def partial(self, run: logdir.RunFiles) -> list[dict[str, Any]]:
        """For each unread snapshot: its end state with ``reading`` ({done, total} bytes of the history read), its
        read started on a thread if it is not under way; ``{"path", "error"}`` where it cannot be read."""
        out, unread = [], self.unread(run)
        for f in run.snapshots:
            if f.name not in unread:
                continue
            path = run.folder / f.name
            key = (str(path), f.bytes, f.mtime_ns)
            with self._guard:
                state = self._reads.get(key)
                if state is None:
                    state = self._reads[key] = {"done": 0, "total": f.bytes, "error": None}
                    threading.Thread(target=self._read, args=(path, state), daemon=True, name=f"kprof {f.name}").start()
            try:
                end = self._ends.get(str(path), key, lambda p=path: _end_state(p))
            except ValueError as exc:  # not a snapshot of plain values: the full read says so too
                state["error"] = state["error"] or f"{type(exc).__name__}: {exc}"
            if state["error"]:
                out.append({"path": str(path), "error": state["error"]})
            else:
                out.append({**end, "reading": {"done": state["done"], "total": state["total"]}})
        return out

    @staticmethod
    def _read(path: Path, state: dict[str, Any]) -> None:
        """Summarize the snapshot apart (saved beside it, or kept by this process), its progress into ``state``."""
        try:
            summarize_apart(path, lambda done: state.__setitem__("done", done))
        except (OSError, ValueError) as exc:
            log.warning("reading the memory snapshot %s failed: %s", path, exc)
            state["error"] = f"{type(exc).__name__}: {exc}"


def _end_state(path: Path) -> dict[str, Any]:
    """`snapshot_end_state`; where the history comes before the segments, a partial summary with no device."""
    found = snapshot_end_state(path)
    return found or {"path": str(path), "bytes": path.stat().st_size, "partial": True, "devices": []}
