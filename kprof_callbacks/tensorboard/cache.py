"""Results computed from files, kept until the files change (names, sizes, mtimes), so a reload is instant.

The tab keeps two: run summaries (keyed by run, fingerprinted by all its files) and decoded traces for the
timeline (keyed by file). A new capture, a rewritten file or a temp file renamed into place changes the
fingerprint and the result is computed again on its next request; otherwise the stored one is served.
Concurrent requests for the same key wait for one computation instead of each starting their own.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class FileCache(Generic[V]):
    """Values by key, each stored with the fingerprint of the files it came from; least recently used dropped
    beyond ``max_entries``."""

    def __init__(self, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self._max_entries = max_entries
        self._entries: OrderedDict[Hashable, tuple[Hashable, V]] = OrderedDict()
        self._locks: dict[Hashable, list] = {}  # key -> [its lock, requests holding or waiting for it]
        self._guard = threading.Lock()

    def has(self, key: Hashable, fingerprint: Hashable) -> bool:
        """Whether the value stored for ``key`` is for ``fingerprint`` (``get`` would not compute)."""
        with self._guard:
            entry = self._entries.get(key)
            return entry is not None and entry[0] == fingerprint

    def get(
        self, key: Hashable, fingerprint: Hashable, compute: Callable[[], V], keep: Callable[[V], bool] | None = None
    ) -> V:
        """The value for ``key``, from ``compute()`` only when ``fingerprint`` differs from the stored one; a value
        ``keep`` refuses is returned but not stored (the next request computes it again)."""
        with self._guard:
            held = self._locks.setdefault(key, [threading.Lock(), 0])
            held[1] += 1
        try:
            with held[0]:
                with self._guard:
                    entry = self._entries.get(key)
                    if entry is not None and entry[0] == fingerprint:
                        self._entries.move_to_end(key)
                        return entry[1]
                value = compute()
                if keep is not None and not keep(value):
                    return value
                with self._guard:
                    self._entries[key] = (fingerprint, value)
                    self._entries.move_to_end(key)
                    while len(self._entries) > self._max_entries:
                        self._entries.popitem(last=False)
                return value
        finally:
            with self._guard:
                held[1] -= 1
                if not held[1]:  # a lock lives while requests need it: failing keys leave nothing behind
                    del self._locks[key]
