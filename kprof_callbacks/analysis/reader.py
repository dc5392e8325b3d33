"""Decode torch.profiler trace files into columns: fast, and holding one chunk's objects at a time, not the file's.

msgspec decodes straight into typed Structs that declare only the fields the analysis uses; everything else in the
file (flows, kernel launch parameters, metadata) is skipped by the decoder without building Python objects. The
decoded events become numpy columns (`Columns`) a chunk at a time: torch writes each event of ``traceEvents`` as a
block of its own (``  {`` ... ``  }``), so the file is cut between blocks into `Piece`s of about ``CHUNK_BYTES``,
each decoded alone (also in a worker process: a piece names a byte range of the file, not its bytes). A file laid
out otherwise, or one that a cut makes undecodable, is decoded whole, which also words the error of a broken file.
Files still being written (`*.partial`) are never read.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import msgspec

from ..layout import rank_of, worker_of
from .eventcolumns import Around, Columns, Event, MemoryNote, TypedEvent, columns, merge

# A piece: ~10 MB of decoded objects at the most, ~0.01 s of work. Small pieces stay in the CPU's caches: with 2 MB
# a 50 MB trace was read 20% faster than with 8 MB (0.33 against 0.42 s on a 2-core machine), 1 MB no faster.
CHUNK_BYTES = 2 << 20
_HEAD_BYTES = 1 << 20  # "traceEvents" must open within this many bytes for the file to be cut into pieces
_ARRAY = b'"traceEvents": ['
_BETWEEN = b"},\n  {"  # two neighbouring events, as torch writes them (a raw newline is never inside a string)
_ARRAY_END = b"\n  ]"


class _Trace(Around):
    traceEvents: list[TypedEvent] | None = None  # noqa: N815


_WHOLE = msgspec.json.Decoder(_Trace | list[TypedEvent])  # a list: legacy autograd-profiler chrome trace
_PIECE = {False: msgspec.json.Decoder(list[Event]), True: msgspec.json.Decoder(list[TypedEvent])}  # by `typed`
_AROUND = msgspec.json.Decoder(Around)


class TraceError(ValueError):
    """A file that cannot be summarized; the message is one line saying why."""


class Uncut(Exception):
    """A piece did not decode on its own: the file is decoded whole instead (which says what is wrong with it)."""


@dataclasses.dataclass(frozen=True)
class Piece:
    """Whole events of a file's ``traceEvents``: bytes [lo, hi) of the file at ``path`` (or ``data``, cut from a
    decompressed file), without the brackets and the commas at its ends; with ``whole``, the whole file."""

    path: Path
    lo: int
    hi: int
    data: bytes | None = None
    whole: bool = False
    typed: bool = False  # keep the operators' input types (the file lists a GPU)
    weight: int = 0  # bytes of the file on disk it stands for (progress): the pieces of a file add up to its size

    @property
    def size(self) -> int:
        return self.hi - self.lo

    def decode(self) -> Columns:
        """The piece's events as columns (Uncut when a cut piece does not decode on its own; TraceError when the
        whole file is not a usable trace)."""
        if self.whole:
            return decode_whole(self.path)
        if self.data is None:
            with self.path.open("rb") as f:
                f.seek(self.lo)
                text = f.read(self.size)
        else:
            text = self.data
        try:
            return columns(_PIECE[self.typed].decode(b"[" + text + b"]"))
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            raise Uncut(str(exc)) from exc


@dataclasses.dataclass
class Plan:
    """How to read one trace file: its pieces (one whole-file piece when it cannot be cut)."""

    path: Path
    size: int  # bytes of the file on disk
    pieces: list[Piece]
    around: Around | None = None  # the keys besides traceEvents, when the file is cut

    def whole(self) -> Piece:
        """The file as one piece, decoded in one go."""
        return Piece(self.path, 0, self.size, whole=True, weight=self.size)


def plan(path: Path) -> Plan:
    """Cut ``path`` into pieces of about CHUNK_BYTES: found by peeking at a few places, never read whole (a gzipped
    file is decompressed first). TraceError when the file cannot be read at all."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            data = _gunzip(path.read_bytes()) if f.read(2) == b"\x1f\x8b" else None
            cut = _cut(f, size) if data is None else _cut(io.BytesIO(data), len(data))
    except OSError as exc:
        raise TraceError(f"cannot read: {exc.strerror or exc}") from exc
    found = Plan(path, size, [])
    if cut is None:
        found.pieces.append(found.whole())
        return found
    found.around, ranges = cut
    cut_bytes = max(1, sum(hi - lo for lo, hi in ranges))
    weights = [size * (hi - lo) // cut_bytes for lo, hi in ranges]
    if weights:
        weights[-1] += size - sum(weights)
    found.pieces += [
        Piece(path, lo, hi, None if data is None else data[lo:hi], weight=w, typed=bool(found.around.deviceProperties))
        for (lo, hi), w in zip(ranges, weights)
    ]
    return found


def _cut(f: BinaryIO, size: int) -> tuple[Around, list[tuple[int, int]]] | None:
    """The byte ranges of whole events in ``f``'s ``traceEvents`` array, and the keys around it; None unless the
    file is laid out as torch writes it."""
    f.seek(0)
    head = f.read(min(size, _HEAD_BYTES))
    at = head.find(_ARRAY)
    if at < 0:
        return None
    first = at + len(_ARRAY)
    f.seek(max(first, size - _HEAD_BYTES))
    tail_at = f.tell()
    tail = f.read()
    end = tail.rfind(_ARRAY_END)
    if end < 0:
        return None
    last = tail_at + end
    after = tail[end + len(_ARRAY_END) :].strip()
    try:
        around = _AROUND.decode(head[:at] + b'"traceEvents": []}')
        if after != b"}":
            if not after.startswith(b","):
                return None
            around.update(_AROUND.decode(b"{" + after[1:]))
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None
    ranges, lo = [], first
    while last - lo > CHUNK_BYTES:
        cut = _find(f, _BETWEEN, lo + CHUNK_BYTES, last)
        if cut < 0:
            break
        ranges.append((lo, cut + 1))
        lo = cut + 2
    if last > lo:
        ranges.append((lo, last))
    return around, ranges


def _find(f: BinaryIO, needle: bytes, start: int, stop: int, window: int = 1 << 20) -> int:
    """The first offset of ``needle`` in ``f`` within [start, stop), or -1."""
    while start < stop:
        f.seek(start)
        block = f.read(min(window, stop - start) + len(needle) - 1)
        found = block.find(needle)
        if found >= 0 and start + found + len(needle) <= stop:
            return start + found
        start += window
    return -1


def _gunzip(data: bytes) -> bytes:
    try:
        return gzip.decompress(data)
    except (EOFError, OSError, zlib.error) as exc:
        raise TraceError(f"truncated or corrupt gzip data ({exc})") from exc


def decode_whole(path: Path) -> Columns:
    """Decode the file in one go; TraceError with a one-line reason if it is not a usable trace."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"cannot read: {exc.strerror or exc}") from exc
    if data[:2] == b"\x1f\x8b":
        data = _gunzip(data)
    if not data or data.isspace():
        raise TraceError("empty file")
    try:
        doc = _WHOLE.decode(data)
    except msgspec.ValidationError as exc:  # valid JSON, not the trace schema (a DecodeError subclass: first)
        raise TraceError(f"not a torch.profiler trace ({exc})") from exc
    except msgspec.DecodeError as exc:
        raise TraceError(f"truncated or corrupt JSON ({exc})") from exc
    except UnicodeDecodeError:
        raise TraceError(_not_utf8(data)) from None
    events = doc if isinstance(doc, list) else doc.traceEvents
    if events is None:
        raise TraceError("not a torch.profiler trace (no 'traceEvents')")
    decoded = columns(events)
    decoded.around = (
        None if isinstance(doc, list) else Around(doc.distributedInfo, doc.deviceProperties, doc.kprof_memory)
    )
    return decoded


def _not_utf8(data: bytes) -> str:
    """Where the file stops being UTF-8 (the decoder's own offset counts from the start of one string)."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not UTF-8: byte {data[exc.start]:#04x} at offset {exc.start} (a name written unescaped?)"
    return "not UTF-8"


@dataclasses.dataclass
class TraceFile:
    """A decoded trace: its events as columns plus who wrote it (worker name, rank when distributed)."""

    path: Path
    worker: str
    rank: int | None
    world_size: int | None
    columns: Columns
    device: str = ""  # the GPU's name where the trace lists GPUs of one kind (deviceProperties)
    memory_note: MemoryNote | None = None  # the session's note on the optimizers' tensors (kprof_memory)


def trace_file(path: Path, parts: list[Columns], around: Around | None = None) -> TraceFile:
    """The decoded pieces of ``path``, in order, as a TraceFile; TraceError when they hold no timed event."""
    merged = merge(parts) if parts else columns([])
    if merged.instant.all():
        raise TraceError("no timed events in the trace (profiler recorded nothing)")
    around = around or merged.around or Around()
    info, worker = around.distributedInfo, worker_of(path)
    rank = info.rank if info is not None and info.rank is not None else rank_of(worker)
    gpus = {d.name for d in around.deviceProperties or []}
    device = gpus.pop() if len(gpus) == 1 else ""
    return TraceFile(path, worker, rank, info.world_size if info else None, merged, device, around.kprof_memory)


def read_trace(path: Path, progress: Callable[[int], None] | None = None) -> TraceFile:
    """Decode one trace file, a piece at a time (``progress`` gets the file bytes of each piece done); raise
    TraceError with a one-line reason if it is not usable."""
    found = plan(path)
    parts = []
    try:
        for piece in found.pieces:
            parts.append(piece.decode())
            if progress is not None:
                progress(piece.weight)
    except Uncut:
        parts = [found.whole().decode()]
    return trace_file(path, parts, found.around)
