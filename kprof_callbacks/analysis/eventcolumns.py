"""The events of a torch.profiler trace as typed Structs, and the numpy columns (`Columns`) they become.

msgspec decodes into the Structs below, which declare only the fields the analysis uses; `columns` turns one
piece's events into columns (strings numbered into tables), `merge` joins a file's pieces into one `Columns`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from itertools import compress
from operator import attrgetter
from typing import Annotated

import msgspec
import numpy as np

from .flops import MATMULS

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


class TypedEvent(Event, frozen=True, gc=False):
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


class Around(msgspec.Struct):
    """The keys before and after ``traceEvents``, decoded on their own when the file is cut into pieces."""

    distributedInfo: _DistributedInfo | None = None  # noqa: N815 (the file's keys)
    deviceProperties: list[_Device] | None = None  # noqa: N815
    kprof_memory: MemoryNote | None = None

    def update(self, other: Around) -> None:
        """Take ``other``'s keys where this one lacks them."""
        self.distributedInfo = self.distributedInfo or other.distributedInfo
        self.deviceProperties = self.deviceProperties or other.deviceProperties
        self.kprof_memory = self.kprof_memory or other.kprof_memory


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
    around: Around | None = None  # the file's keys besides traceEvents, when a whole file was decoded
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
    if events and isinstance(events[0], TypedEvent):  # the matrix products' dtype sets the peak their FLOPs run at
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
