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
from typing import Annotated

import msgspec

from ..layout import rank_of, worker_of

_NO_RAW = msgspec.Raw()
# Ids and byte counts become numpy int64 columns: a value outside int64 makes the file unusable, said by the decoder.
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
# Times become int64 nanoseconds: a time beyond ~100 days in microseconds is not a profile (and would overflow).
Micros = Annotated[float, msgspec.Meta(ge=-1e14, le=1e14)]


class Args(msgspec.Struct, frozen=True, gc=False):
    """The `args` fields the analysis reads; spellings of older torch versions kept side by side.

    Missing ids are -1 (not None) so columns can be built without per-event branches.
    """

    external_id: Int64 = msgspec.field(default=-1, name="External id")
    external_id_old: Int64 = msgspec.field(default=-1, name="external id")
    correlation: Int64 = -1
    input_dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    input_dims_old: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input dims")
    mem_bytes: Int64 = msgspec.field(default=0, name="Bytes")
    mem_device_type: Int64 = msgspec.field(default=-1, name="Device Type")
    total_allocated: Int64 = msgspec.field(default=0, name="Total Allocated")
    copy_bytes: Int64 = msgspec.field(default=0, name="bytes")
    label: msgspec.Raw = msgspec.field(default=_NO_RAW, name="name")  # `M` events: thread and process names
    collective: str = msgspec.field(default="", name="Collective name")  # NCCL kernels: the c10d collective they run
    addr: Int64 = msgspec.field(default=0, name="Addr")  # `[memory]` events: the block allocated or freed


_NO_ARGS = Args()


class Event(msgspec.Struct, frozen=True, gc=False):
    """One Chrome-trace event: `X` complete events, `i` instants (`[memory]`)."""

    ph: str = ""
    name: str = ""
    cat: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: Micros = 0.0
    dur: Annotated[float, msgspec.Meta(ge=0.0, le=1e14)] = 0.0  # negative: a broken clock, not a duration
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
    except UnicodeDecodeError as exc:
        raise TraceError(f"not UTF-8: byte {data[exc.start]:#04x} at offset {exc.start} (a name written unescaped?)")
    events = doc if isinstance(doc, list) else doc.traceEvents
    if events is None:
        raise TraceError("not a torch.profiler trace (no 'traceEvents')")
    if not any(e.ph == "X" for e in events):
        raise TraceError("no timed events in the trace (profiler recorded nothing)")
    info = None if isinstance(doc, list) else doc.distributedInfo
    worker = worker_of(path)
    rank = info.rank if info is not None and info.rank is not None else rank_of(worker)
    return TraceFile(path, worker, rank, info.world_size if info else None, events)
