"""A decoded trace sorted into host events, device events, memory records and steps, as numpy columns.

Categories are matched case-insensitively with the names of older torch versions (`Operator`, `Runtime`, `Kernel`,
...), as torch-tb-profiler does. Everything works on the reader's columns: the per-category and per-name decisions
are made once per distinct category or name, and applied with numpy masks; no per-event Python code runs here.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from ..layout import MODULE_PREFIX
from .eventcolumns import Columns
from .reader import TraceError, TraceFile

# host event kinds
OP, ANNOTATION, PYTHON, RUNTIME = 0, 1, 2, 3
# device event kinds
KERNEL, MEMCPY, MEMSET, COMM = 0, 1, 2, 3
DEVICE_KINDS = ("kernel", "memcpy", "memset", "nccl")
_DEVICE_CODE = 10  # category codes: host kind, _DEVICE_CODE + device kind, _OTHER, _NO_CATEGORY
_OTHER, _NO_CATEGORY = -1, -2

_HOST = {
    "cpu_op": OP,
    "operator": OP,
    "user_annotation": ANNOTATION,
    "python_function": PYTHON,
    "python": PYTHON,
    "cuda_runtime": RUNTIME,
    "runtime": RUNTIME,
    "cuda_driver": RUNTIME,
}
_DEVICE = {"kernel": KERNEL, "gpu_memcpy": MEMCPY, "memcpy": MEMCPY, "gpu_memset": MEMSET, "memset": MEMSET}
# torch's key_averages drops these utility ops entirely (torch/autograd/profiler_util.py _filter_name)
_HIDDEN = (
    "profiler::_record_function_enter",
    "profiler::_record_function_enter_new",
    "profiler::_record_function_exit",
    "aten::is_leaf",
    "aten::output_nr",
    "aten::_version",
)
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
CPU_MEMORY = (0, 12, 13)  # c10::DeviceType CPU, MKLDNN, IDEEP: key_averages' "CPU Mem"
CUDA_MEMORY = (1, 6)  # CUDA, HIP: key_averages' "CUDA Mem"


def is_collective_name(name: str) -> bool:
    """Host events of collectives: c10d ops (`c10d::allreduce_`), their `gloo:`/`nccl:` ranges, `record_param_comms`."""
    return name.startswith(("c10d::", "gloo:", "nccl:")) or name == "record_param_comms"


def is_step_name(name: str) -> bool:
    """`ProfilerStep#N`, the range torch.profiler opens around each step."""
    return _STEP.match(name) is not None


def is_nccl_kernel(name: str) -> bool:
    """NCCL kernels: `ncclKernel_...` (older NCCL) and `ncclDevKernel_...`."""
    return name.startswith("nccl")


def match(candidates: np.ndarray, keys: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """For each query id, the candidate index whose key equals it (-1 if none; ids < 0 never match)."""
    if candidates.size == 0 or queries.size == 0:
        return np.full(queries.size, -1, np.int64)
    candidates = candidates[np.argsort(keys[candidates], kind="stable")]
    sorted_keys = keys[candidates]
    pos = np.minimum(np.searchsorted(sorted_keys, queries), candidates.size - 1)
    return np.where((sorted_keys[pos] == queries) & (queries >= 0), candidates[pos], -1)


def _category_code(cat: str) -> int:
    """A category's code: host kind, _DEVICE_CODE + device kind, _OTHER (ignored) or _NO_CATEGORY."""
    low = cat.lower()
    if not cat:
        return _NO_CATEGORY
    return _HOST.get(low, _DEVICE_CODE + _DEVICE[low] if low in _DEVICE else _OTHER)


def unique_ids(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(ids, return_inverse=True)`` for integer ids: counted rather than sorted when they are non-negative
    and no more than a few times as many values are possible as there are ids (names, kinds, steps)."""
    top = int(ids.max()) if ids.size else 0
    if ids.size == 0 or ids.min() < 0 or top >= 4 * ids.size + 1024:
        return np.unique(ids, return_inverse=True)
    present = np.zeros(top + 1, bool)
    present[ids] = True
    return np.flatnonzero(present).astype(ids.dtype), (np.cumsum(present) - 1)[ids]


def _dense(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``ids`` renumbered 0, 1, ... in order of first appearance, and the original id of each new one."""
    unique, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(order.size, np.int32)
    rank[order] = np.arange(order.size, dtype=np.int32)
    return rank[inverse.reshape(-1)], unique[order]


@dataclasses.dataclass
class Host:
    """Host (CPU thread) complete events, one row per event."""

    name: np.ndarray  # int32 ids into Events.names
    kind: np.ndarray  # int8: OP, ANNOTATION, PYTHON, RUNTIME
    thread: np.ndarray  # int32 id of (pid, tid)
    start: np.ndarray  # int64 ns
    end: np.ndarray
    ext: np.ndarray  # int64 external id (links kernels to the op that launched them), -1 if none
    corr: np.ndarray  # int64 correlation id of runtime calls, -1 if none
    shape: np.ndarray  # int32 ids into Events.shapes, -1 if not recorded
    types: np.ndarray  # int32 ids into Events.types (input types of matrix products), -1 elsewhere
    seq: np.ndarray  # int64 autograd sequence number (a forward op and the backward node it made share it), -1 if none
    fwd_tid: np.ndarray  # int64 an autograd node's forward thread, in torch's own numbering (> 0); -1 elsewhere


@dataclasses.dataclass
class Device:
    """GPU activities (kernels, copies, sets) on streams."""

    name: np.ndarray
    kind: np.ndarray  # int8: KERNEL, MEMCPY, MEMSET, COMM
    stream: np.ndarray  # int32 id of (device, stream)
    start: np.ndarray
    end: np.ndarray
    ext: np.ndarray
    corr: np.ndarray
    nbytes: np.ndarray  # copy/set size, 0 if unknown
    collective: np.ndarray  # int32 id into Events.names of the c10d collective an NCCL kernel runs, -1 if not said
    group: np.ndarray  # int32 id into Events.names of its process group (`eventcolumns.group_text`), -1 if not said


@dataclasses.dataclass
class Memory:
    """`[memory]` instant events recorded with profile_memory=True."""

    time: np.ndarray
    nbytes: np.ndarray  # allocation (+) or free (-)
    device: np.ndarray  # c10::DeviceType of the memory
    allocated: np.ndarray  # total allocated on that device after the event
    addr: np.ndarray  # address of the block, which pairs an allocation with its free
    reserved: np.ndarray  # total reserved by the allocator on that device after the event (0 where not written)
    thread: np.ndarray  # int32 Host.thread of the allocating thread, -1 where it ran no host event


@dataclasses.dataclass
class Events:
    """Everything the analysis needs from one trace file."""

    source: TraceFile
    names: list[str]
    shapes: list[str]
    types: list[str]
    host: Host
    device: Device
    memory: Memory
    steps: np.ndarray  # (n, 3) int64: step number, host start, host end; sorted by start
    threads: list[tuple[int | str, int | str]]  # (pid, tid) of each Host.thread id
    streams: list[tuple[int | str, int | str]]  # (device, stream) of each Device.stream id
    stopped_between_steps: bool = False  # an empty last range was dropped: the window was cut after a whole step


def _codes(c: Columns) -> np.ndarray:
    """Per event: its category code, _OTHER for what the analysis ignores (instants, hidden ops, other categories)."""
    by_cat = np.array([_category_code(cat) for cat in c.cats] or [_OTHER], np.int8)
    code = np.where(c.instant, np.int8(_OTHER), by_cat[c.cat])
    untyped = np.flatnonzero(code == _NO_CATEGORY)  # pre-kineto autograd-profiler traces
    if untyped.size:
        on_gpu = np.array([isinstance(pid, str) and "CUDA" in pid for pid, _ in c.lanes], bool)
        code[untyped] = np.where(on_gpu[c.lane[untyped]], _DEVICE_CODE + KERNEL, OP)
    code[np.isin(c.name, [k for k, n in enumerate(c.names) if n in _HIDDEN])] = _OTHER
    # the module view's ranges are labels, whatever category torch's fast ranges give them
    code[np.isin(c.name, [k for k, n in enumerate(c.names) if n.startswith(MODULE_PREFIX)]) & (code >= 0)] = ANNOTATION
    nccl = [k for k, n in enumerate(c.names) if is_nccl_kernel(n)]
    code[(code == _DEVICE_CODE + KERNEL) & np.isin(c.name, nccl)] = _DEVICE_CODE + COMM
    return code


def _recorded(raw: np.ndarray, table: list[bytes]) -> tuple[np.ndarray, list[str]]:
    """Ids of host events' recorded JSON values (input shapes, types; -1 where not recorded) and the value of each id,
    in order of appearance."""
    out = np.full(raw.size, -1, np.int32)
    recorded = raw > 0
    out[recorded], ids = _dense(raw[recorded])
    return out, [table[k].decode() for k in ids.tolist()]


def launch_times(tl: Events) -> np.ndarray:
    """When the host launched each device event (its runtime call's start; else its own start)."""
    host, dev = tl.host, tl.device
    runtime = match(np.flatnonzero((host.kind == RUNTIME) & (host.corr >= 0)), host.corr, dev.corr)
    launch = dev.start.copy()
    launch[runtime >= 0] = host.start[runtime[runtime >= 0]]
    return launch


def _without_empty_last_step(tl: Events, is_step: np.ndarray) -> Events:
    """``tl`` less its last step when no step ran in it: the range torch opens at the last step() and closes when a
    window is cut short (the loop ended) holds no operator and no label and launches no GPU work (only the
    profiler's own stop: a device synchronize, its Python frames), and its few microseconds are no step time."""
    if not tl.steps.shape[0]:
        return tl
    lo, hi = tl.steps[-1, 1], tl.steps[-1, 2]
    work = ((tl.host.kind == OP) | (tl.host.kind == ANNOTATION)) & ~is_step
    starts = np.concatenate([tl.host.start[work], launch_times(tl)])
    if np.any((starts >= lo) & (starts <= hi)):
        return tl
    return dataclasses.replace(tl, steps=tl.steps[:-1], stopped_between_steps=True)


def _host_lanes(c: Columns, code: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The lanes of host events ``rows``, a runtime call's moved to the thread of the operators that made it when it
    was written under a pid no operator has and their thread has its tid: kineto writes on runtime calls the pid of
    the process that exports the trace (kprof exports in a forked child) or of another PID namespace."""
    lane = c.lane[rows]
    runtime = code[rows] == RUNTIME
    threads = {c.lanes[k]: k for k in np.unique(lane[~runtime]).tolist()}
    pids, tids = {pid for pid, _ in threads}, {}
    for pid, tid in threads:
        tids.setdefault(tid, []).append(threads[pid, tid])
    moved = {}
    for k in np.unique(lane[runtime]).tolist():
        pid, tid = c.lanes[k]
        if pid not in pids and len(tids.get(tid, ())) == 1:
            moved[k] = tids[tid][0]
    if moved:
        old, new = np.array(list(moved)), np.array(list(moved.values()))
        at = match(np.arange(old.size), old, lane)
        lane = np.where(at >= 0, new[np.maximum(at, 0)], lane)
    return lane


def build(trace: TraceFile) -> Events:
    """Sort a trace's events into host, device and memory columns, and its steps."""
    c = trace.columns
    code = _codes(c)
    host_rows = np.flatnonzero((code >= 0) & (code < _DEVICE_CODE))
    device_rows = np.flatnonzero(code >= _DEVICE_CODE)
    if device_rows.size and not host_rows.size:
        raise TraceError("GPU events but no host events: profile with ProfilerActivity.CPU too")
    threads, thread_ids = _dense(_host_lanes(c, code, host_rows))
    streams, stream_ids = _dense(c.lane[device_rows])
    shape, shape_table = _recorded(c.dims[host_rows], c.dims_table)
    types, type_table = _recorded(c.types[host_rows], c.types_table)
    host = _host(c, code, host_rows, threads, shape, types)
    steps, is_step = _steps(c.names, host)
    events = Events(
        trace,
        c.names,
        shape_table,
        type_table,
        host,
        _device(c, code, device_rows, streams),
        _memory(c, thread_ids),
        steps,
        [c.lanes[k] for k in thread_ids.tolist()],
        [c.lanes[k] for k in stream_ids.tolist()],
    )
    return _without_empty_last_step(events, is_step)


def _host(
    c: Columns, code: np.ndarray, rows: np.ndarray, threads: np.ndarray, shape: np.ndarray, types: np.ndarray
) -> Host:
    """The host events at ``rows`` of ``c``, on their dense ``threads``, with their recorded ``shape`` and ``types``."""
    return Host(
        c.name[rows],
        code[rows],
        threads,
        c.start[rows],
        c.end[rows],
        c.ext[rows],
        c.corr[rows],
        shape,
        types,
        c.seq[rows],
        c.fwd_tid[rows],
    )


def _device(c: Columns, code: np.ndarray, rows: np.ndarray, streams: np.ndarray) -> Device:
    """The device events at ``rows`` of ``c``, on their dense ``streams``."""
    return Device(
        c.name[rows],
        code[rows] - _DEVICE_CODE,
        streams,
        c.start[rows],
        c.end[rows],
        c.ext[rows],
        c.corr[rows],
        c.copy_bytes[rows],
        c.collective[rows],
        c.group[rows],
    )


def _memory(c: Columns, thread_ids: np.ndarray) -> Memory:
    """The `[memory]` instants of ``c``, each on its dense host thread (-1 where none of ``thread_ids``)."""
    memory_id = c.names.index("[memory]") if "[memory]" in c.names else -1
    rows = np.flatnonzero((c.name == memory_id) & c.instant)
    return Memory(
        c.start[rows],
        c.mem_bytes[rows],
        c.mem_device[rows],
        c.mem_total[rows],
        c.mem_addr[rows],
        c.mem_reserved[rows],
        match(np.arange(thread_ids.size), thread_ids, c.lane[rows]).astype(np.int32),
    )


def _steps(names: list[str], host: Host) -> tuple[np.ndarray, np.ndarray]:
    """The ``ProfilerStep#N`` ranges among the host events as (number, start, end) rows by start, and which host
    events they are."""
    step_number = {k: int(m[1]) for k, n in enumerate(names) if (m := _STEP.match(n))}
    if any(number >= 2**62 for number in step_number.values()):
        raise TraceError(f"a step number out of range: {max(step_number.values())}")
    is_step = np.isin(host.name, list(step_number))
    steps = np.stack(
        [
            np.array([step_number[k] for k in host.name[is_step].tolist()], np.int64),
            host.start[is_step],
            host.end[is_step],
        ],
        axis=1,
    ).reshape(-1, 3)
    return steps[np.argsort(steps[:, 1], kind="stable")], is_step
