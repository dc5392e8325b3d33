"""Decode torch.profiler trace files, fast (``layout`` says which files are traces).

msgspec decodes straight into typed Structs that declare only the fields the analysis
uses; everything else in the file (flows, kernel launch parameters, metadata) is skipped
by the decoder without building Python objects. Files still being written (`*.partial`)
are never read.
"""

from __future__ import annotations

import dataclasses
import gzip
import zlib
from pathlib import Path

import msgspec

from ..layout import rank_of, worker_of

_NO_RAW = msgspec.Raw()


class Args(msgspec.Struct, frozen=True, gc=False):
    """The `args` fields the analysis reads; spellings of older torch versions kept side by side.

    Missing ids are -1 (not None) so columns can be built without per-event branches.
    """

    external_id: int = msgspec.field(default=-1, name="External id")
    external_id_old: int = msgspec.field(default=-1, name="external id")
    correlation: int = -1
    input_dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    input_dims_old: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input dims")
    mem_bytes: int = msgspec.field(default=0, name="Bytes")
    mem_device_type: int = msgspec.field(default=-1, name="Device Type")
    total_allocated: int = msgspec.field(default=0, name="Total Allocated")
    copy_bytes: int = msgspec.field(default=0, name="bytes")


_NO_ARGS = Args()


class Event(msgspec.Struct, frozen=True, gc=False):
    """One Chrome-trace event: `X` complete events, `i` instants (`[memory]`)."""

    ph: str = ""
    name: str = ""
    cat: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = 0.0
    dur: float = 0.0
    args: Args = _NO_ARGS


class _DistributedInfo(msgspec.Struct):
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None


class _Trace(msgspec.Struct):
    traceEvents: list[Event] | None = None  # noqa: N815 (the file's key)
    distributedInfo: _DistributedInfo | None = None  # noqa: N815


_DECODER = msgspec.json.Decoder(_Trace | list[Event])  # a list: legacy autograd-profiler chrome trace


class TraceError(ValueError):
    """A file that cannot be summarized; the message is one line saying why."""


@dataclasses.dataclass
class TraceFile:
    """A decoded trace: its events plus who wrote it (worker name, rank when distributed)."""

    path: Path
    worker: str
    rank: int | None
    world_size: int | None
    events: list[Event]


def read_trace(path: Path) -> TraceFile:
    """Decode one trace file; raise TraceError with a one-line reason if it is not a usable trace."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"cannot read: {exc.strerror or exc}") from exc
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (EOFError, OSError, zlib.error) as exc:
            raise TraceError(f"truncated or corrupt gzip data ({exc})") from exc
    if not data or data.isspace():
        raise TraceError("empty file")
    try:
        doc = _DECODER.decode(data)
    except msgspec.ValidationError as exc:  # valid JSON, not the trace schema (a DecodeError subclass: first)
        raise TraceError(f"not a torch.profiler trace ({exc})") from exc
    except msgspec.DecodeError as exc:
        raise TraceError(f"truncated or corrupt JSON ({exc})") from exc
    events = doc if isinstance(doc, list) else doc.traceEvents
    if events is None:
        raise TraceError("not a torch.profiler trace (no 'traceEvents')")
    if not any(e.ph == "X" for e in events):
        raise TraceError("no timed events in the trace (profiler recorded nothing)")
    info = None if isinstance(doc, list) else doc.distributedInfo
    worker = worker_of(path)
    rank = info.rank if info is not None and info.rank is not None else rank_of(worker)
    return TraceFile(path, worker, rank, info.world_size if info else None, events)
