"""Per-step scalars (step time, throughput): one formula, two sinks.

``EventFile`` writes them as TensorBoard scalars beside the traces, on the trace writer's thread; the Lightning
callback hands the same ``step_metrics`` to the trainer's other loggers. Step N is ``ProfilerStep#N``: both count
the session's steps from 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path

from . import layout


def step_metrics(seconds: float, samples: int | None) -> dict[str, float]:
    """The scalars of one step that took ``seconds`` and processed ``samples`` (None: unknown)."""
    metrics = {layout.STEP_TIME_TAG: seconds * 1e3}
    if samples and seconds > 0:
        metrics[layout.THROUGHPUT_TAG] = samples / seconds
    return metrics


class EventFile:
    """Scalars as a TensorBoard event file beside the traces, one file per session.

    Records are written with tensorboard's RecordWriter from the caller's thread (the trace writer's). A
    SummaryWriter would add a thread of its own that outlives the session and dies with a traceback when the disk
    fills up.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._records = None

    def writer(self, rows: Iterable[tuple[int, dict[str, float]]]) -> Callable[[], None]:
        """A call that writes ``(step, metrics)`` rows (to hand to the trace writer's thread)."""
        rows = list(rows)

        def write() -> None:
            from tensorboard.compat.proto.event_pb2 import Event
            from tensorboard.compat.proto.summary_pb2 import Summary
            from tensorboard.summary.writer.record_writer import RecordWriter

            if self._records is None:
                self._records = RecordWriter(open(self.path, "wb"))
                self._records.write(Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
            for step, metrics in rows:
                values = [Summary.Value(tag=tag, simple_value=value) for tag, value in metrics.items()]
                event = Event(wall_time=time.time(), step=step, summary=Summary(value=values))
                self._records.write(event.SerializeToString())
            self._records.flush()

        write.__qualname__ = "writing step-time scalars"
        return write

    def close(self) -> None:
        """Close the event file (on the writer thread, after the last rows)."""
        if self._records is not None:
            self._records.close()
            self._records = None
