"""The per-step scalars a session writes beside its traces (``kprof/*`` tags, every step, not only profiled ones),
read back from the TensorBoard event files of a run folder: step time, throughput, TFLOP/s, MFU, memory.

An event file is a sequence of records (length, CRC, an ``Event`` protobuf, CRC); the records are read directly,
without TensorBoard's loaders, and a file cut short (a run still writing, or killed) yields what it holds.
"""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

import numpy as np

from .. import layout


@dataclasses.dataclass(frozen=True)
class Series:
    """One tag of one worker: step numbers (``ProfilerStep#N``) and values, in step order."""

    steps: np.ndarray
    values: np.ndarray


def _records(data: bytes):
    pos = 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        start = pos + 12
        if start + length + 4 > len(data):  # cut short while being written
            return
        yield data[start : start + length]
        pos = start + length + 4


def read_series(folder: Path) -> dict[str, dict[str, Series]]:
    """``worker -> tag -> Series`` for every kprof scalar in the event files directly inside ``folder``."""
    files = layout.scalar_files(folder)
    if not files:
        return {}
    from tensorboard.compat.proto.event_pb2 import Event

    out: dict[str, dict[str, Series]] = {}
    for worker, path in files:
        points: dict[str, list[tuple[int, float]]] = {}
        try:
            data = path.read_bytes()
        except OSError:
            continue
        for record in _records(data):
            try:
                event = Event.FromString(record)
            except Exception:  # a damaged record: the rest of the file still counts (protobuf raises its own type)
                continue
            for value in event.summary.value:
                if value.tag.startswith(layout.TAG_PREFIX):
                    points.setdefault(value.tag, []).append((event.step, value.simple_value))
        for tag, pairs in points.items():
            pairs.sort()
            steps, values = zip(*pairs)
            out.setdefault(worker, {})[tag] = Series(np.array(steps, np.int64), np.array(values, np.float64))
    return out
