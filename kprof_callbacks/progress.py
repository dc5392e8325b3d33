"""One progress meter for long work: big summaries (bytes read), ``kprof.compare``'s steps, ``kprof bench``'s rows.

``progress=True`` draws a tqdm bar (on stderr in a terminal, a widget in a notebook) when the work is more than
``min_total`` units; a callable gets ``(done, total)`` after each update instead. tqdm is imported only when a bar
is drawn, and this module imports neither torch nor the analysis, so the reading path stays light.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import TracebackType

ProgressArg = bool | Callable[[int, int], None]


class Progress:
    """Units of work done so far, reported to a callback ``(done, total)`` or as a tqdm bar; thread-safe (results
    may arrive on worker threads). A context manager: the bar closes on exit."""

    def __init__(
        self,
        progress: ProgressArg,
        total: int,
        label: str,
        *,
        unit: str = "it",
        in_bytes: bool = False,
        min_total: int = 0,
    ) -> None:
        self.total, self.done = total, 0
        self._lock = threading.Lock()
        self._callback = progress if callable(progress) else None
        self._bar = None
        if progress is True and total > min_total:
            from tqdm.auto import tqdm

            scale = dict(unit_scale=True, unit_divisor=1024) if in_bytes else {}
            self._bar = tqdm(total=total, desc=label, unit="B" if in_bytes else unit, file=sys.stderr, **scale)

    def add(self, n: int = 1) -> None:
        """``n`` more units done."""
        with self._lock:
            self.done += n
            if self._bar is not None:
                self._bar.update(n)
            if self._callback is not None:
                self._callback(self.done, self.total)

    def write(self, line: str) -> None:
        """Print a line on stderr above the bar (plainly when there is none)."""
        if self._bar is not None:
            self._bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
