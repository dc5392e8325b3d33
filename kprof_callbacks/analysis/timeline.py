"""A decoded trace as numpy columns: host events, device events, memory records, steps.

Times are integer nanoseconds (the trace stores microseconds with three decimals), so
nesting tests (`child.end <= parent.end`) are exact, as in torch's own event tree.
Categories are matched case-insensitively with the names of older torch versions
(`Operator`, `Runtime`, `Kernel`, ...), as torch-tb-profiler does. Columns are pulled
out of the decoded events with C-level `map`/`attrgetter` and filtered with numpy masks:
no per-event Python code runs here.
"""

from __future__ import annotations

import dataclasses
import re
from operator import attrgetter

import numpy as np

from .reader import Event, TraceError, TraceFile

# host event kinds
OP, ANNOTATION, PYTHON, RUNTIME = 0, 1, 2, 3
# device event kinds
KERNEL, MEMCPY, MEMSET, COMM = 0, 1, 2, 3
DEVICE_KINDS = ("kernel", "memcpy", "memset", "nccl")
_DEVICE_CODE = 10  # category codes: host kind, _DEVICE_CODE + device kind, _OTHER, _NO_CATEGORY
_OTHER, _NO_CATEGORY = -1, -2

_HOST = {"cpu_op": OP, "operator": OP, "user_annotation": ANNOTATION, "python_function": PYTHON,
         "python": PYTHON, "cuda_runtime": RUNTIME, "runtime": RUNTIME, "cuda_driver": RUNTIME}
_DEVICE = {"kernel": KERNEL, "gpu_memcpy": MEMCPY, "memcpy": MEMCPY, "gpu_memset": MEMSET, "memset": MEMSET}
# torch's key_averages drops these utility ops entirely (torch/autograd/profiler_util.py _filter_name)
_HIDDEN = ("profiler::_record_function_enter", "profiler::_record_function_enter_new",
           "profiler::_record_function_exit", "aten::is_leaf", "aten::output_nr", "aten::_version")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
CPU_MEMORY = (0, 12, 13)  # c10::DeviceType CPU, MKLDNN, IDEEP: key_averages' "CPU Mem"
CUDA_MEMORY = (1, 6)  # CUDA, HIP: key_averages' "CUDA Mem"

_PH, _NAME, _CAT, _PID, _TID, _TS, _DUR = (attrgetter(f) for f in ("ph", "name", "cat", "pid", "tid", "ts", "dur"))
_EXT, _EXT_OLD, _CORR = (attrgetter(f"args.{f}") for f in ("external_id", "external_id_old", "correlation"))
_DIMS, _DIMS_OLD, _COPY_BYTES = (attrgetter(f"args.{f}") for f in ("input_dims", "input_dims_old", "copy_bytes"))
_MEM_BYTES, _MEM_DEVICE, _MEM_TOTAL, _MEM_ADDR = (attrgetter(f"args.{f}") for f in ("mem_bytes", "mem_device_type",
                                                                                    "total_allocated", "addr"))
_COLLECTIVE = attrgetter("args.collective")


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


class _Interner(dict):
    """Value -> dense int id, in order of first appearance."""

    def __missing__(self, key: object) -> int:
        self[key] = value = len(self)
        return value


class _CategoryCodes(dict):
    """Category string -> code (host kind, _DEVICE_CODE + device kind, _OTHER), case-insensitive."""

    def __missing__(self, cat: str) -> int:
        low = cat.lower()
        code = _NO_CATEGORY if not cat else _HOST.get(low, _DEVICE_CODE + _DEVICE[low] if low in _DEVICE else _OTHER)
        self[cat] = code
        return code


def _column(events: list[Event], getter: attrgetter, dtype: type) -> np.ndarray:
    return np.fromiter(map(getter, events), dtype, len(events))


def _times(events: list[Event]) -> tuple[np.ndarray, np.ndarray]:
    """Start and end in integer ns."""
    start = np.rint(_column(events, _TS, np.float64) * 1000.0).astype(np.int64)
    return start, start + np.rint(_column(events, _DUR, np.float64) * 1000.0).astype(np.int64)


def _ids(events: list[Event]) -> tuple[np.ndarray, np.ndarray]:
    """External ids (new or old spelling) and correlation ids, -1 where absent."""
    ext = _column(events, _EXT, np.int64)
    if not (ext >= 0).any():  # torch < 1.9 spelled it "external id"
        ext = _column(events, _EXT_OLD, np.int64)
    return ext, _column(events, _CORR, np.int64)


def _lanes(events: list[Event]) -> tuple[np.ndarray, list[tuple[int | str, int | str]]]:
    """Dense ids of (pid, tid), host threads or device streams, and the (pid, tid) of each id."""
    lanes = _Interner()
    ids = np.fromiter(map(lanes.__getitem__, zip(map(_PID, events), map(_TID, events))), np.int32, len(events))
    return ids, list(lanes)


@dataclasses.dataclass
class Host:
    """Host (CPU thread) complete events, one row per event."""

    name: np.ndarray  # int32 ids into Timeline.names
    kind: np.ndarray  # int8: OP, ANNOTATION, PYTHON, RUNTIME
    thread: np.ndarray  # int32 id of (pid, tid)
    start: np.ndarray  # int64 ns
    end: np.ndarray
    ext: np.ndarray  # int64 external id (links kernels to the op that launched them), -1 if none
    corr: np.ndarray  # int64 correlation id of runtime calls, -1 if none
    shape: np.ndarray  # int32 ids into Timeline.shapes, -1 if not recorded


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
    collective: np.ndarray  # int32 id into Timeline.names of the c10d collective an NCCL kernel runs, -1 if not said


@dataclasses.dataclass
class Memory:
    """`[memory]` instant events recorded with profile_memory=True."""

    time: np.ndarray
    nbytes: np.ndarray  # allocation (+) or free (-)
    device: np.ndarray  # c10::DeviceType of the memory
    allocated: np.ndarray  # total allocated on that device after the event
    addr: np.ndarray  # address of the block, which pairs an allocation with its free


@dataclasses.dataclass
class Timeline:
    """Everything the analysis needs from one trace file."""

    source: TraceFile
    names: list[str]
    shapes: list[str]
    host: Host
    device: Device
    memory: Memory
    steps: np.ndarray  # (n, 3) int64: step number, host start, host end; sorted by start
    threads: list[tuple[int | str, int | str]]  # (pid, tid) of each Host.thread id
    streams: list[tuple[int | str, int | str]]  # (device, stream) of each Device.stream id


def _shapes(events: list[Event], shapes: _Interner) -> np.ndarray:
    """Input-shape ids per host event (-1 where not recorded); shapes[b""] is id 0."""
    getter = _DIMS if any(map(len, map(_DIMS, events))) else _DIMS_OLD
    return np.fromiter(map(shapes.__getitem__, map(bytes, map(getter, events))), np.int32, len(events)) - 1


def _codes(events: list[Event], name: np.ndarray, names: _Interner) -> np.ndarray:
    """Per event: its category code, _OTHER for what the analysis ignores."""
    categories = _CategoryCodes()
    code = np.fromiter(map(categories.__getitem__, map(_CAT, events)), np.int8, len(events))
    code[~np.fromiter(map("X".__eq__, map(_PH, events)), bool, len(events))] = _OTHER
    for i in np.flatnonzero(code == _NO_CATEGORY).tolist():  # pre-kineto autograd-profiler traces
        pid = events[i].pid
        code[i] = _DEVICE_CODE + KERNEL if isinstance(pid, str) and "CUDA" in pid else OP
    code[np.isin(name, [names[h] for h in _HIDDEN if h in names])] = _OTHER
    nccl = [k for k, n in enumerate(names) if is_nccl_kernel(n)]
    code[(code == _DEVICE_CODE + KERNEL) & np.isin(name, nccl)] = _DEVICE_CODE + COMM
    return code


def build(trace: TraceFile) -> Timeline:
    """Sort a trace's events into columns."""
    events = trace.events
    names, shapes = _Interner(), _Interner({b"": 0})
    name = np.fromiter(map(names.__getitem__, map(_NAME, events)), np.int32, len(events))
    code = _codes(events, name, names)
    memory_id = names.get("[memory]", -1)
    host_rows = np.flatnonzero((code >= 0) & (code < _DEVICE_CODE))
    device_rows = np.flatnonzero(code >= _DEVICE_CODE)
    if device_rows.size and not host_rows.size:
        raise TraceError("GPU events but no host events: profile with ProfilerActivity.CPU too")
    memory_rows = np.flatnonzero((name == memory_id) & (code == _OTHER))
    host, device, memory = ([events[i] for i in rows.tolist()] for rows in (host_rows, device_rows, memory_rows))

    host_ext, host_corr = _ids(host)
    host_start, host_end = _times(host)
    device_ext, device_corr = _ids(device)
    device_start, device_end = _times(device)
    (threads, thread_keys), (streams, stream_keys) = _lanes(host), _lanes(device)
    host_columns = Host(name[host_rows], code[host_rows], threads, host_start, host_end, host_ext, host_corr,
                        _shapes(host, shapes))
    collective = np.fromiter((names[c] if c else -1 for c in map(_COLLECTIVE, device)), np.int32, len(device))
    device_columns = Device(name[device_rows], code[device_rows] - _DEVICE_CODE, streams, device_start, device_end,
                            device_ext, device_corr, _column(device, _COPY_BYTES, np.int64), collective)
    memory_columns = Memory(_times(memory)[0], _column(memory, _MEM_BYTES, np.int64), _column(memory, _MEM_DEVICE, np.int64),
                            _column(memory, _MEM_TOTAL, np.int64), _column(memory, _MEM_ADDR, np.int64))
    table = list(names)
    step_number = {k: int(m[1]) for k, n in enumerate(table) if (m := _STEP.match(n))}
    if any(number >= 2**62 for number in step_number.values()):
        raise TraceError(f"a step number out of range: {max(step_number.values())}")
    is_step = np.isin(host_columns.name, list(step_number))
    steps = np.stack([np.array([step_number[k] for k in host_columns.name[is_step].tolist()], np.int64),
                      host_start[is_step], host_end[is_step]], axis=1).reshape(-1, 3)
    steps = steps[np.argsort(steps[:, 1], kind="stable")]
    shape_table = [b.decode() for b in list(shapes)[1:]]
    return Timeline(trace, table, shape_table, host_columns, device_columns, memory_columns, steps, thread_keys,
                    stream_keys)
