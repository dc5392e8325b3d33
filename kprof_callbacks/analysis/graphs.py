"""The record of compiled kernels a session saved (``graph_record.py``), and the kernels of a trace matched to it.

A compiled graph runs as one ``## Call CompiledFxGraph <key> ##`` range (its CUDA graph replayed by a
``cudaGraphLaunch`` in it, under ``mode="reduce-overhead"``): the GPU kernels launched in one such call are one
*instance*. An instance is matched to the recorded graph whose Triton kernels it shares most (a Triton kernel's name
names one kernel of its graph, which the graph may call more than once; other graphs can have a kernel of that name);
then each of its Triton kernels to the next recorded call of that name, and the kernels between two of them (cuBLAS,
attention, aten fallbacks: *extern* calls, whose GPU kernels have other names) in order to the extern calls the record
has between the same two. What matches nothing stays unattributed.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
from collections.abc import Sequence
from pathlib import Path

import msgspec
import numpy as np

FORMAT_KEY, VERSION = "kprof_graphs", 1  # as graph_record.py writes them (that module imports torch)
TRITON_PREFIX = "triton_"  # inductor's Triton kernels: named in the record as in the trace


class _Kernel(msgspec.Struct):
    name: str
    extern: bool
    modules: list[tuple[int, int]]
    lines: list[tuple[int, int]]
    tensors: list[tuple[list[int], str]] = []
    loss: bool = False


class _Graph(msgspec.Struct):
    compile_id: str
    function: str
    backward: bool
    kernels: list[_Kernel]
    where: str = ""


class _File(msgspec.Struct):
    modules: list[tuple[str, bool]]
    lines: list[tuple[str, str]]
    graphs: list[_Graph]
    note: str | None = None


@dataclasses.dataclass(frozen=True)
class Call:
    """One recorded kernel call: its name, whether extern, its modules and lines as (table index, weight) with
    weights adding up to 1, its tensors with a vocabulary-sized dimension, and whether it computes a loss."""

    name: str
    extern: bool
    modules: tuple[tuple[int, float], ...]
    lines: tuple[tuple[int, float], ...]
    tensors: tuple[tuple[tuple[int, ...], str], ...]
    loss: bool


@dataclasses.dataclass(frozen=True)
class Graph:
    """One recorded graph: Dynamo's compile id (``frame/compilation``), the compiled function, backward or forward,
    its calls in the order its wrapper makes them."""

    compile_id: str
    function: str
    backward: bool
    calls: tuple[Call, ...]

    @property
    def label(self) -> str:
        """``GPT.forward (backward)``: the function and the pass."""
        return f"{self.function or 'compiled code'} ({'backward' if self.backward else 'forward'})"

    @functools.cached_property
    def triton(self) -> frozenset[str]:
        """The names of its Triton kernels (its calls that are not extern)."""
        return frozenset(c.name for c in self.calls if not c.extern)


@dataclasses.dataclass(frozen=True)
class Record:
    """A worker's whole record: its graphs, the module table (name, relative to the compiled root), the line table
    (``file:line``, code) and why nothing could be recorded, where torch gave nothing."""

    graphs: tuple[Graph, ...]
    modules: tuple[tuple[str, bool], ...]
    lines: tuple[tuple[str, str], ...]
    note: str | None = None


_DECODER = msgspec.json.Decoder(_File)


def read(path: Path) -> Record | None:
    """The record in ``path``; None when there is none. A record that cannot be read is one with a note saying so."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return Record((), (), (), f"the record of compiled kernels {path.name} could not be read: {exc}")
    try:
        found = _DECODER.decode(data)
    except msgspec.DecodeError as exc:
        return Record((), (), (), f"the record of compiled kernels {path.name} is not usable: {exc}")
    graphs = tuple(
        Graph(g.compile_id, g.function, g.backward, tuple(_call(k) for k in g.kernels)) for g in found.graphs
    )
    return Record(graphs, tuple(found.modules), tuple(found.lines), found.note)


def _call(k: _Kernel) -> Call:
    def weights(pairs: list[tuple[int, int]]) -> tuple[tuple[int, float], ...]:
        total = sum(w for _, w in pairs)
        return tuple((i, w / total) for i, w in pairs) if total > 0 else ()

    tensors = tuple((tuple(shape), dtype) for shape, dtype in k.tensors)
    return Call(k.name, k.extern, weights(k.modules), weights(k.lines), tensors, k.loss)


def best_graph(record: Record, names: Sequence[str], compile_id: str = "") -> int:
    """The recorded graph an instance that ran kernels ``names`` is: the one sharing most Triton kernel names with
    it, fewest of its own left over, then one of compile id ``compile_id``, then the last recorded; -1 when none
    shares a name."""
    ran = {n for n in names if n.startswith(TRITON_PREFIX)}
    best, key = -1, (0, 0, False, -1)
    for index, graph in enumerate(record.graphs):
        mine = graph.triton
        shared = len(ran & mine)
        score = (shared, -len(mine - ran), graph.compile_id == compile_id, index)
        if shared and score > key:
            best, key = index, score
    return best


def align(calls: Sequence[Call], names: Sequence[str]) -> np.ndarray:
    """For each kernel of an instance (``names``, in launch order), the index of its recorded call, -1 for none.

    A Triton kernel is the first call of its name after the last one matched (so a kernel missing from the trace
    costs no more than itself); the kernels between two matched ones go, in order, to the extern calls recorded
    between their calls, spread evenly when the counts differ (an extern call can launch several kernels). Before
    the first match and after the last, fewer kernels than extern calls are an instance the trace holds only the end
    (its launches came before the trace) or the start of: they go to the calls next to that match."""
    out = np.full(len(names), -1, np.int64)
    by_name: dict[str, list[int]] = {}
    for index, call in enumerate(calls):
        if not call.extern:
            by_name.setdefault(call.name, []).append(index)
    anchors = [(-1, -1)]
    for k, name in enumerate(names):
        candidates = by_name.get(name)
        if candidates is None:
            continue
        at = bisect.bisect_right(candidates, anchors[-1][1])
        if at < len(candidates):
            anchors.append((k, candidates[at]))
            out[k] = candidates[at]
    anchors.append((len(names), len(calls)))
    for (k0, c0), (k1, c1) in zip(anchors, anchors[1:]):
        kernels = [k for k in range(k0 + 1, k1) if out[k] < 0 and names[k] not in by_name]
        externs = [c for c in range(c0 + 1, c1) if calls[c].extern]
        if 0 < len(kernels) < len(externs) and k0 < 0:
            externs = externs[-len(kernels) :]
        elif 0 < len(kernels) < len(externs) and k1 == len(names):
            externs = externs[: len(kernels)]
        if kernels and externs:
            for j, k in enumerate(kernels):
                out[k] = externs[j * len(externs) // len(kernels)]
    return out
