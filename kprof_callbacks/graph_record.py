"""What inductor knows of each kernel it generates, kept for the analysis: modules, source lines, large tensors.

Inductor writes a compiled graph's kernels into one wrapper function and tells, per kernel call and in call order,
which FX nodes it computes (``torch_compat.record_inductor_kernels``). Each node carries the module stack Dynamo
traced it in (``nn_module_stack``; backward nodes the forward's, ``fwd_nn_module_stack``), the user's stack
(``stack_trace``) and its tensor (``val``). ``GraphRecorder`` keeps, per graph and per kernel call: the kernel's name,
whether it is an extern call (cuBLAS, attention, aten fallbacks), the modules and source lines of its nodes (weighted
by node count), the tensors with a dimension of ``WIDE`` or more (logits of a large vocabulary) and whether it
computes a loss (log_softmax, nll_loss). The session saves the record beside its traces
(``layout.graphs_path``); the analysis matches it to the kernels the trace shows.
"""

from __future__ import annotations

import json
import re
import sysconfig
import weakref
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import torch

from . import torch_compat
from .module_ranges import qualified_name

FORMAT_KEY, VERSION = "kprof_graphs", 1
WIDE = 8192  # a tensor dimension this large is a vocabulary (GPT-2: 50304), not a width
_TENSORS = 4  # large tensors kept per kernel
_LOSS_OPS = ("log_softmax", "nll_loss", "cross_entropy")
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in [^\n]*\n(?P<code>[^\n]*)')
_GETATTR = re.compile(r"getattr\(([^()]*?), ['\"]([^'\"]+)['\"]\)")
_INDEX = re.compile(r"(?:\._modules)?\[['\"]?([^'\"\]]+)['\"]?\]")
_ROOT = re.compile(r"^[LG]\[['\"][^'\"]*['\"]\]")


def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(k)}
    roots.add(str(Path(torch.__file__).parent.parent))
    roots.add(str(Path(__file__).parent))
    return tuple(sorted(roots))


_LIBRARIES = _library_roots()


def is_library_file(path: str) -> bool:
    """Whether ``path`` is library code (the standard library, site-packages, torch, kprof), not the user's."""
    return path.startswith(_LIBRARIES) or "/site-packages/" in path or "/dist-packages/" in path


def module_path(raw: str) -> str:
    """A module stack entry as Dynamo writes it (``L['self'].blocks[3].attn``, ``L['self']._modules['blocks']``,
    ``getattr(L['self'].blocks, '3')``) as a ``named_modules()`` path relative to the compiled root
    (``blocks.3.attn``)."""
    text = _ROOT.sub("", raw.strip())
    while True:
        unwrapped = _GETATTR.sub(r"\1.\2", text)
        if unwrapped == text:
            break
        text = unwrapped
    text = _INDEX.sub(r".\1", _ROOT.sub("", text))
    return qualified_name(text.removeprefix("self"))


class GraphRecorder:
    """Records every kernel inductor generates while it is the sink; ``to_json()`` is the sidecar's content."""

    def __init__(self, names: Iterable[str] = ()) -> None:
        self._names = set(names)
        self._suffixes: dict[str, str | None] = {}
        self._graphs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # inductor graph -> its record
        self.graphs: list[dict] = []
        self.modules: list[list] = []  # [name, relative]: relative to the compiled root when not a name of the model
        self.lines: list[list[str]] = []  # [file:line, code]
        self._module_ids: dict[tuple[str, bool], int] = {}
        self._line_ids: dict[tuple[str, str], int] = {}
        self._stacks: dict[str, tuple[str, str] | None] = {}
        self.note: str | None = None  # why nothing can be recorded, when that is so
        self.changed = False

    def __call__(self, kernel: torch_compat.InductorKernel) -> None:
        graph = self._graphs.get(kernel.graph)
        if graph is None:
            facts = torch_compat.graph_facts(kernel.graph)
            graph = {"compile_id": facts.compile_id, "function": facts.function, "where": facts.where}
            graph.update(backward=facts.backward, kernels=[])
            self._graphs[kernel.graph] = graph
            self.graphs.append(graph)
        modules, lines, tensors, loss = Counter(), Counter(), {}, False
        for node in kernel.origins:
            modules[self._module(node, graph["backward"])] += 1
            line = self._line(node.meta.get("stack_trace"))
            if line is not None:
                lines[line] += 1
            loss = loss or _computes_loss(node)
            if len(tensors) < _TENSORS:
                tensors.update(_wide_tensors(node))
        modules.pop(None, None)
        graph["kernels"].append(
            {
                "name": kernel.name,
                "extern": kernel.extern,
                "modules": sorted([k, w] for k, w in modules.items()),
                "lines": sorted([k, w] for k, w in lines.items()),
                "tensors": [[list(shape), dtype] for shape, dtype in list(tensors)[:_TENSORS]],
                "loss": loss,
            }
        )
        self.changed = True

    def to_json(self) -> bytes:
        """The record as the sidecar file holds it (marks the record saved)."""
        self.changed = False
        data = {FORMAT_KEY: VERSION, "note": self.note, "modules": self.modules, "lines": self.lines}
        return json.dumps(dict(data, graphs=self.graphs), separators=(",", ":")).encode()

    def _module(self, node, backward: bool) -> int | None:
        stack = (node.meta.get("fwd_nn_module_stack") if backward else None) or node.meta.get("nn_module_stack")
        if not stack:
            return None
        entry = list(stack.values())[-1]
        path = module_path(entry[0] if isinstance(entry, tuple) else str(entry))
        return self._intern(self._module_ids, self.modules, self._resolve(path))

    def _resolve(self, path: str) -> tuple[str, bool]:
        """A path relative to the compiled root as the model's name: itself, else the one name that ends with it;
        else kept relative (the analysis joins it to the module range around the compiled call)."""
        if not self._names or path in self._names:
            return path, False
        if path not in self._suffixes:
            found = [n for n in self._names if n.endswith("." + path)]
            self._suffixes[path] = found[0] if len(found) == 1 else None
        full = self._suffixes[path]
        return (full, False) if full is not None else (path, True)

    def _line(self, stack_trace: str | None) -> int | None:
        if not stack_trace:
            return None
        if stack_trace not in self._stacks:
            frames = [m for m in _FRAME.finditer(stack_trace)]
            user = [m for m in frames if not is_library_file(m["file"])] or frames
            last = user[-1] if user else None
            self._stacks[stack_trace] = (
                None if last is None else (f"{last['file']}:{last['line']}", last["code"].strip())
            )
        line = self._stacks[stack_trace]
        if line is None:
            return None
        return self._intern(self._line_ids, self.lines, line)

    @staticmethod
    def _intern(ids: dict, table: list, item: tuple) -> int:
        """The index of ``item`` in ``table``, appended the first time."""
        if item not in ids:
            ids[item] = len(table)
            table.append(list(item))
        return ids[item]


def _computes_loss(node) -> bool:
    ops = (str(node.target), str(node.meta.get("original_aten", "")))
    return any(loss in op for op in ops for loss in _LOSS_OPS)


def _wide_tensors(node) -> dict[tuple[tuple[int, ...], str], None]:
    """(shape, dtype) of the node's tensors and its inputs' with a dimension of WIDE or more (concrete shapes only)."""
    found: dict = {}
    for value in [node.meta.get("val"), *(n.meta.get("val") for n in node.all_input_nodes)]:
        for tensor in value if isinstance(value, (list, tuple)) else (value,):
            dims = tuple(getattr(tensor, "shape", ()))
            if not all(type(d) is int for d in dims):  # symbolic sizes: reading them would add a guard
                continue
            if len(dims) >= 2 and max(dims) >= WIDE:
                found[(dims, str(tensor.dtype).removeprefix("torch."))] = None
    return found
