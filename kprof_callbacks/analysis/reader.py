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
from collections.abc import Callable, Iterable
from itertools import compress
from operator import attrgetter
from pathlib import Path
from typing import Annotated, BinaryIO

import msgspec
import numpy as np

from ..layout import rank_of, worker_of
from .flops import MATMULS

# A piece: ~10 MB of decoded objects at the most, ~0.01 s of work. Small pieces stay in the CPU's caches: with 2 MB
# a 50 MB trace was read 20% faster than with 8 MB (0.33 against 0.42 s on a 2-core machine), 1 MB no faster.
CHUNK_BYTES = 2 << 20
_HEAD_BYTES = 1 << 20  # "traceEvents" must open within this many bytes for the file to be cut into pieces
_ARRAY = b'"traceEvents": ['
_BETWEEN = b"},\n  {"  # two neighbouring events, as torch writes them (a raw newline is never inside a string)
_ARRAY_END = b"\n  ]"

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
    # NCCL kernels: the process group the collective runs in (kineto copies them from c10d's record_param_comms)
    group_name: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Process Group Name")
    group_desc: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Process Group Description")
    group_ranks: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Process Group Ranks")
    group_size: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Group size")
    total_reserved: Int64 = msgspec.field(default=0, name="Total Reserved")  # `[memory]`: held by the allocator
    seq: Int64 = msgspec.field(default=-1, name="Sequence number")  # autograd: a forward op and its backward node
    fwd_tid: Int64 = msgspec.field(default=-1, name="Fwd thread id")  # backward nodes: their forward's thread (0: none)


class _TypedArgs(Args, frozen=True, gc=False):
    """With the operators' input types, which only a GPU trace needs (its matrix products' dtype): keeping them costs
    5-10% of the decoding, so a trace that lists no GPU is decoded without them."""

    input_type: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input type")


_NO_ARGS, _NO_TYPED_ARGS = Args(), _TypedArgs()


class Event(msgspec.Struct, frozen=True, gc=False):
    """One Chrome-trace event: `X` complete events, `i` instants (`[memory]`), `M` metadata."""

    ph: str = ""
    name: str = ""
    cat: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: Micros = 0.0
    dur: Micros = 0.0  # negative: a broken clock, not a duration; clipped to 0 and counted (Columns.clipped)
    args: Args = _NO_ARGS


class _TypedEvent(Event, frozen=True, gc=False):
    args: _TypedArgs = _NO_TYPED_ARGS


class _DistributedInfo(msgspec.Struct):
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None


class _Device(msgspec.Struct):
    name: str = ""


class MemoryNote(msgspec.Struct, frozen=True):
    """What a kprof session measured at the first recorded step of a window (the trace's ``kprof_memory`` key): bytes
    of the tensors the optimizers hold on the profiled device, which the trace's memory events cannot tell apart."""

    device: str = ""
    parameters: Int64 = 0
    gradients: Int64 = 0
    optimizer_state: Int64 = 0


class _Around(msgspec.Struct):
    """The keys before and after ``traceEvents``, decoded on their own when the file is cut into pieces."""

    distributedInfo: _DistributedInfo | None = None  # noqa: N815 (the file's keys)
    deviceProperties: list[_Device] | None = None  # noqa: N815
    kprof_memory: MemoryNote | None = None

    def update(self, other: _Around) -> None:
        """Take ``other``'s keys where this one lacks them."""
        self.distributedInfo = self.distributedInfo or other.distributedInfo
        self.deviceProperties = self.deviceProperties or other.deviceProperties
        self.kprof_memory = self.kprof_memory or other.kprof_memory


class _Trace(_Around):
    traceEvents: list[_TypedEvent] | None = None  # noqa: N815


_WHOLE = msgspec.json.Decoder(_Trace | list[_TypedEvent])  # a list: legacy autograd-profiler chrome trace
_PIECE = {False: msgspec.json.Decoder(list[Event]), True: msgspec.json.Decoder(list[_TypedEvent])}  # by `typed`
_AROUND = msgspec.json.Decoder(_Around)


class TraceError(ValueError):
    """A file that cannot be summarized; the message is one line saying why."""


class Uncut(Exception):
    """A piece did not decode on its own: the file is decoded whole instead (which says what is wrong with it)."""


class _Interner(dict):
    """Value -> dense int id, in order of first appearance."""

    def __missing__(self, key: object) -> int:
        self[key] = value = len(self)
        return value


@dataclasses.dataclass
class Columns:
    """A trace's `X` and `i` events in file order, one array per field; strings are ids into the tables.

    Times are integer ns (the trace stores microseconds with three decimals), so nesting tests are exact.
    ``ext``/``dims`` hold the current spelling of their field when any event of the piece has it, else the older
    one (``new_ext``/``new_dims`` say which), as older torch versions wrote them.
    """

    instant: np.ndarray  # bool: an `i` event (else `X`)
    name: np.ndarray  # int32 -> names
    cat: np.ndarray  # int32 -> cats
    lane: np.ndarray  # int32 -> lanes
    start: np.ndarray  # int64 ns
    end: np.ndarray
    ext: np.ndarray  # int64 external id, -1 if none
    corr: np.ndarray  # int64 correlation id, -1 if none
    dims: np.ndarray  # int32 -> dims_table; 0 (b"") where input shapes were not recorded
    # int32 -> types_table: input types of matrix products (flops.MATMULS) and log_softmax; 0 elsewhere
    types: np.ndarray
    copy_bytes: np.ndarray  # int64 size of a copy or set
    mem_bytes: np.ndarray  # int64: `[memory]` instants' allocation (+) or free (-)
    mem_device: np.ndarray  # int64 c10::DeviceType
    mem_total: np.ndarray  # int64 total allocated after the event
    mem_addr: np.ndarray  # int64 address of the block, which pairs an allocation with its free
    mem_reserved: np.ndarray  # int64 total reserved by the allocator after the event (0 where not written)
    seq: np.ndarray  # int64 autograd sequence number of an operator, -1 if none
    collective: np.ndarray  # int32 -> names: the c10d collective a GPU kernel runs (NCCL's), -1 where none is said
    group: np.ndarray  # int32 -> names: its process group (`group_text`), -1 where none is said
    fwd_tid: np.ndarray  # int64 the forward thread (torch's own numbering) of autograd nodes' ranges, -1 elsewhere
    names: list[str]
    cats: list[str]
    lanes: list[tuple[int | str, int | str]]  # (pid, tid): a host thread or a (device, stream)
    dims_table: list[bytes]  # raw JSON of each distinct input-shape list
    types_table: list[bytes]  # raw JSON of each distinct input-type list
    thread_labels: list[tuple[int | str, str]]  # (tid, label) of each `thread_name` metadata event, in order
    new_ext: bool
    new_dims: bool
    around: _Around | None = None  # the file's keys besides traceEvents, when a whole file was decoded
    clipped: int = 0  # events whose duration was negative, clipped to 0 (the capture check reports them)

    def __len__(self) -> int:
        return int(self.start.size)


_KIND = attrgetter("ph", "name", "cat", "pid", "tid")  # what an event shares with many others
_FIELDS = {f: attrgetter(f) for f in ("ts", "dur", "args")}
_ARGS = {
    f: attrgetter(f)
    for f in (
        "external_id",
        "external_id_old",
        "correlation",
        "input_dims",
        "input_dims_old",
        "input_type",
        "mem_bytes",
        "mem_device_type",
        "total_allocated",
        "addr",
        "total_reserved",
        "copy_bytes",
        "collective",
        "seq",
        "fwd_tid",
    )
}
_PLAIN_ARGS = {"corr": "correlation", "copy_bytes": "copy_bytes"}  # Columns field -> the Args field it copies
# `[memory]` instants' Columns fields -> the Args field each copies
_MEMORY_ARGS = {
    "mem_bytes": "mem_bytes",
    "mem_device": "mem_device_type",
    "mem_total": "total_allocated",
    "mem_addr": "addr",
    "mem_reserved": "total_reserved",
}
_ARRAY_FIELDS = [f.name for f in dataclasses.fields(Columns) if f.type == "np.ndarray"]
_ID_TABLES = {"name": "names", "cat": "cats", "lane": "lanes", "types": "types_table"}  # id column -> its table
_PH_CODE = {"X": 0, "i": 1, "M": 2}
_OPERATOR_CATEGORIES = ("cpu_op", "operator", "")  # "": pre-kineto traces, which name no category
LOG_SOFTMAX = frozenset({"aten::_log_softmax", "aten::log_softmax"})  # a loss over logits: their dtype is read too
AUTOGRAD_NODE = "autograd::engine::evaluate_function: "  # an autograd node's range: its forward's thread is read
_TYPED = frozenset(MATMULS) | LOG_SOFTMAX


def _column(items: list, getter: attrgetter, dtype: type) -> np.ndarray:
    return np.fromiter(map(getter, items), dtype, len(items))


def _ns(values: np.ndarray) -> np.ndarray:
    return np.rint(values * 1000.0).astype(np.int64)


def _interned(values: Iterable, table: _Interner, count: int) -> np.ndarray:
    return np.fromiter(map(table.__getitem__, values), np.int32, count)


def _interned_raw(raws: Iterable[msgspec.Raw], table: _Interner, count: int) -> np.ndarray:
    """Raw JSON values numbered by their bytes, made by one join and one split: faster than a bytes() call each
    (JSON text holds no NUL byte, the decoder rejects one)."""
    return _interned(b"\0".join(raws).split(b"\0") if count else [], table, count)


def _kind_ids(kinds: _Interner, timed: list[bool], names: _Interner, cats: _Interner, lanes: _Interner) -> np.ndarray:
    """The name, category and lane ids of each kind (-1 for the kinds not ``timed``: not `X` or `i`). Numbered kind by
    kind, in the kinds' order of first appearance, the tables come out as numbering event by event would make them."""
    ids = [(names[n], cats[c], lanes[p, t]) if keep else (-1, -1, -1) for (_, n, c, p, t), keep in zip(kinds, timed)]
    return np.array(ids, np.int32).reshape(len(ids), 3).T


def _collectives(args: list[Args], kernels: np.ndarray, names: _Interner) -> tuple[np.ndarray, np.ndarray]:
    """Per event, the ids in `names` of the c10d collective and the process group its args name (-1 where none):
    only kernels (NCCL's) name them, so the other events are not looked at; nor are the groups of kernels that name no
    collective."""
    collective = np.full(len(args), -1, np.int32)
    group = collective.copy()
    if kernels.any():
        picked = list(compress(args, kernels.tolist()))
        said = [names[c] if c else -1 for c in map(_ARGS["collective"], picked)]
        collective[kernels] = np.array(said, np.int32)
        groups = [group_text(a) if c >= 0 else "" for a, c in zip(picked, said)]  # the collectives' kernels only
        group[kernels] = np.array([names[g] if g else -1 for g in groups], np.int32)
    return collective, group


def _raw_text(raw: msgspec.Raw) -> str:
    """A raw JSON value as plain text: a string's content, anything else as written (a number, a list)."""
    if not raw:
        return ""
    value = msgspec.json.decode(raw)
    return value if isinstance(value, str) else msgspec.json.encode(value).decode()


def group_text(args: Args) -> str:
    """The process group an NCCL kernel's args name, as ``description<TAB>size<TAB>ranks`` ("" where none is said):
    the description (``mesh_shard``, ``default_pg``; the group's name where it has none) tells the levels of a device
    mesh apart, the ranks (``[0, 2]``) which group of that level it is."""
    name, desc = _raw_text(args.group_name), _raw_text(args.group_desc)
    if not (name or desc):
        return ""
    label = desc if desc and desc != "undefined" else f"group {name}"
    return "\t".join((label, _raw_text(args.group_size), _raw_text(args.group_ranks).replace(" ", "")))


def _thread_labels(meta: list[Event]) -> list[tuple[int | str, str]]:
    labels = []
    for e in meta:
        if e.name == "thread_name" and e.args.label:
            label = msgspec.json.decode(e.args.label)
            if isinstance(label, str) and label.strip():
                labels.append((e.tid, label.strip()))
    return labels


def columns(events: list[Event]) -> Columns:
    """The `X` and `i` events of ``events`` as columns (and the thread names their `M` events give)."""
    # one lookup (and one hash of its strings) per event for ph, name, cat and lane: they are numbered per kind
    kinds = _Interner()
    kind = _interned(map(_KIND, events), kinds, len(events))
    kind_ph = np.array([_PH_CODE.get(k[0], 3) for k in kinds], np.int8)
    ph = kind_ph[kind]
    meta = [events[i] for i in np.flatnonzero(ph == 2).tolist()]
    timed = ph <= 1
    if not timed.all():
        events, ph, kind = list(compress(events, timed.tolist())), ph[timed], kind[timed]
    tables = _new_tables()
    ids = _kind_ids(kinds, (kind_ph <= 1).tolist(), tables["names"], tables["cats"], tables["lanes"])
    found = dict(zip(("name", "cat", "lane"), (column[kind] for column in ids)), instant=ph == 1)
    args = list(map(_FIELDS["args"], events))  # fetched once: most columns come from the args
    start = _ns(_column(events, _FIELDS["ts"], np.float64))
    dur = _column(events, _FIELDS["dur"], np.float64)
    found.update(start=start, end=start + _ns(np.maximum(dur, 0.0)))
    found.update({field: _column(args, _ARGS[arg], np.int64) for field, arg in _PLAIN_ARGS.items()})
    found["ext"], new_ext = _external_ids(args)
    # input shapes: recorded on operators only, so only their events are looked at
    ops = np.isin(found["cat"], _ids_of(tables["cats"], lambda c: c.lower() in _OPERATOR_CATEGORIES))
    found["dims"], new_dims = _input_dims(args, ops, tables["dims_table"])
    found.update(_autograd(args, ops, found["name"], tables["names"]))
    found.update(_memory(args, found["instant"]))
    found["types"] = _input_types(events, args, ops, found["name"], tables)
    kernels = np.isin(found["cat"], _ids_of(tables["cats"], lambda c: c.lower() == "kernel"))
    found["collective"], found["group"] = _collectives(args, kernels, tables["names"])
    return _assemble(
        found,
        tables,
        clipped=int((dur < 0).sum()),
        thread_labels=_thread_labels(meta),
        new_ext=new_ext,
        new_dims=new_dims,
    )


def _ids_of(table: _Interner, keep: Callable[[str], bool]) -> list[int]:
    """The ids of the values in ``table`` that ``keep`` picks."""
    return [k for k, value in enumerate(table) if keep(value)]


def _external_ids(args: list[Args]) -> tuple[np.ndarray, bool]:
    """The external id of each event, and whether it is the current spelling (else the older one, or none)."""
    ext = _column(args, _ARGS["external_id"], np.int64)
    new_ext = bool((ext >= 0).any())
    return (ext if new_ext else _column(args, _ARGS["external_id_old"], np.int64)), new_ext


def _input_dims(args: list[Args], ops: np.ndarray, dims: _Interner) -> tuple[np.ndarray, bool]:
    """The input shapes' ids in ``dims`` of the operators ``ops`` (0 elsewhere), and whether they are spelled the
    current way (else the older one)."""
    shaped = list(compress(args, ops.tolist()))
    dims_ids = np.zeros(len(args), np.int32)
    dims_ids[ops] = _interned_raw(map(_ARGS["input_dims"], shaped), dims, len(shaped))
    new_dims = len(dims) > 1
    if not new_dims:
        dims_ids[ops] = _interned_raw(map(_ARGS["input_dims_old"], shaped), dims, len(shaped))
    return dims_ids, new_dims


def _autograd(args: list[Args], ops: np.ndarray, name: np.ndarray, names: _Interner) -> dict[str, np.ndarray]:
    """``seq`` of the operators and ``fwd_tid`` of the autograd nodes' ranges (-1 elsewhere)."""
    autograd = {f: np.full(len(args), -1, np.int64) for f in ("seq", "fwd_tid")}
    autograd["seq"][ops] = _column(list(compress(args, ops.tolist())), _ARGS["seq"], np.int64)
    nodes = np.flatnonzero(np.isin(name, _ids_of(names, lambda n: n.startswith(AUTOGRAD_NODE))))
    if nodes.size:  # only autograd nodes' forward thread is read: each column costs ~5% of the decoding
        autograd["fwd_tid"][nodes] = _column([args[i] for i in nodes.tolist()], _ARGS["fwd_tid"], np.int64)
    return autograd


def _memory(args: list[Args], instant: np.ndarray) -> dict[str, np.ndarray]:
    """The `[memory]` instants' columns (0 on the other events)."""
    mem = {field: np.zeros(len(args), np.int64) for field in _MEMORY_ARGS}
    if instant.any():
        rows = np.flatnonzero(instant)
        picked = list(compress(args, instant.tolist()))
        for field, column in mem.items():
            column[rows] = _column(picked, _ARGS[_MEMORY_ARGS[field]], np.int64)
    return mem


def _input_types(
    events: list[Event], args: list[Args], ops: np.ndarray, name: np.ndarray, tables: dict[str, _Interner]
) -> np.ndarray:
    """The input types' ids in ``tables["types_table"]`` of the matrix products and log_softmax (0 elsewhere), read
    only from a trace decoded with them (one that lists a GPU)."""
    type_ids = np.zeros(len(events), np.int32)
    if events and isinstance(events[0], _TypedEvent):  # the matrix products' dtype sets the peak their FLOPs run at
        products = np.flatnonzero(ops & np.isin(name, _ids_of(tables["names"], lambda n: n in _TYPED)))
        raws = (args[i].input_type for i in products.tolist())
        type_ids[products] = _interned_raw(raws, tables["types_table"], products.size)
    return type_ids


def _new_tables() -> dict[str, _Interner]:
    """Empty string tables of a `Columns`, by field name (the raw JSON ones number b"" as 0: nothing recorded)."""
    return {
        "names": _Interner(),
        "cats": _Interner(),
        "lanes": _Interner(),
        "dims_table": _Interner({b"": 0}),
        "types_table": _Interner({b"": 0}),
    }


def _assemble(arrays: dict[str, np.ndarray], tables: dict[str, _Interner], **rest: object) -> Columns:
    """The `Columns` of these array columns (by field name), string tables and other fields."""
    return Columns(**arrays, **{field: list(table) for field, table in tables.items()}, **rest)


def _remap(ids: np.ndarray, local: list, table: _Interner) -> np.ndarray:
    """Ids into ``local`` as ids into the merged ``table``."""
    return np.fromiter(map(table.__getitem__, local), np.int32, len(local))[ids] if local else ids


def merge(parts: list[Columns]) -> Columns:
    """One file's pieces, in order, as one `Columns`."""
    if len(parts) == 1:
        return parts[0]
    tables = _new_tables()
    new_ext, new_dims = any(p.new_ext for p in parts), any(p.new_dims for p in parts)
    merged = {"ext": np.concatenate([p.ext if p.new_ext == new_ext else np.full(len(p), -1, np.int64) for p in parts])}
    for field in ("collective", "group"):  # -1: none said
        ids = [getattr(p, field) for p in parts]
        merged[field] = np.concatenate(
            [np.where(i >= 0, _remap(np.maximum(i, 0), p.names, tables["names"]), -1) for i, p in zip(ids, parts)]
        )
    merged["dims"] = np.concatenate(
        [
            _remap(p.dims, p.dims_table, tables["dims_table"]) if p.new_dims == new_dims else np.zeros(len(p), np.int32)
            for p in parts
        ]
    )
    for field in _ARRAY_FIELDS:
        if field not in merged:
            arrays = [getattr(p, field) for p in parts]
            if field in _ID_TABLES:
                table = _ID_TABLES[field]
                arrays = [_remap(a, getattr(p, table), tables[table]) for a, p in zip(arrays, parts)]
            merged[field] = np.concatenate(arrays)
    return _assemble(
        merged,
        tables,
        clipped=sum(p.clipped for p in parts),
        thread_labels=[t for p in parts for t in p.thread_labels],
        new_ext=new_ext,
        new_dims=new_dims,
        around=next((p.around for p in parts if p.around), None),
    )


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
    around: _Around | None = None  # the keys besides traceEvents, when the file is cut

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


def _cut(f: BinaryIO, size: int) -> tuple[_Around, list[tuple[int, int]]] | None:
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
        None if isinstance(doc, list) else _Around(doc.distributedInfo, doc.deviceProperties, doc.kprof_memory)
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


def trace_file(path: Path, parts: list[Columns], around: _Around | None = None) -> TraceFile:
    """The decoded pieces of ``path``, in order, as a TraceFile; TraceError when they hold no timed event."""
    merged = merge(parts) if parts else columns([])
    if merged.instant.all():
        raise TraceError("no timed events in the trace (profiler recorded nothing)")
    around = around or merged.around or _Around()
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
