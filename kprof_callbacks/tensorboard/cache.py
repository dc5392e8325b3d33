"""Summaries of runs, kept until the run's files change (name, size, mtime), so a reload is instant.

A new capture, a rewritten file or a temp file renamed into place changes the fingerprint and the run is
summarized again on its next request; otherwise the stored result is served. Concurrent requests for the
same run wait for one summarize call instead of each starting their own.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

from .logdir import RunFiles

Summarizer = Callable[[RunFiles], dict[str, Any]]


class SummaryCache:
    """Per-run results of `summarize`, least recently used dropped beyond `max_runs`."""

    def __init__(self, summarize: Summarizer, max_runs: int = 64) -> None:
        if max_runs < 1:
            raise ValueError(f"max_runs must be >= 1, got {max_runs}")
        self._summarize = summarize
        self._max_runs = max_runs
        self._entries: OrderedDict[str, tuple[Hashable, dict[str, Any]]] = OrderedDict()
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def get(self, run: RunFiles) -> dict[str, Any]:
        """The result for `run`'s current files, computing it only when they changed since the last call.

        The result carries `summarized_at` (epoch seconds) and `seconds` (time summarize took), so a client
        can tell a fresh result from a stored one.
        """
        with self._guard:
            lock = self._locks.setdefault(run.name, threading.Lock())
        with lock:
            with self._guard:
                entry = self._entries.get(run.name)
                if entry is not None and entry[0] == run.fingerprint:
                    self._entries.move_to_end(run.name)
                    return entry[1]
            start = time.perf_counter()
            result = self._summarize(run)
            result.update(summarized_at=time.time(), seconds=time.perf_counter() - start)
            with self._guard:
                self._entries[run.name] = (run.fingerprint, result)
                self._entries.move_to_end(run.name)
                while len(self._entries) > self._max_runs:
                    evicted, _ = self._entries.popitem(last=False)
                    self._locks.pop(evicted, None)
            return result
