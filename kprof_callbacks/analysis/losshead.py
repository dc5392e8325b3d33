"""The loss head: the work on a [tokens, vocabulary] logits tensor (the output projection, a copy to fp32,
log_softmax, the loss and their backward), found from recorded input shapes (eager) or from the record of compiled
kernels (their tensors with a vocabulary-sized dimension).

The logits are what a loss over a log_softmax reads: its input's last dimension is the vocabulary (``WIDE`` or
more) and the other dimensions multiply to the tokens. Every operator with an input of tokens x vocabulary elements
that has the vocabulary as a dimension works on them, as does a matrix product whose output they are; their GPU
time (and their descendants') is the loss head's.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter

import numpy as np

from . import graphs
from .eventcolumns import LOG_SOFTMAX
from .events import Events
from .flops import MATMULS

WIDE = 8192  # a vocabulary: graph_record.WIDE
_BYTES = {"float": 4, "float32": 4, "c10::BFloat16": 2, "bfloat16": 2, "c10::Half": 2, "float16": 2, "double": 8}
_FLOATS = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}  # the record's dtypes that logits can have


@dataclasses.dataclass
class Evidence:
    """GPU time on the logits by (rank, worker, step), the logits seen as (tokens, vocabulary) -> element sizes in
    bytes of the copies made of them (1 x bf16 and 1 x fp32: {2: 1, 4: 1}), and the rows (modules) that time went to."""

    gpu_us: Counter = dataclasses.field(default_factory=Counter)
    logits: dict = dataclasses.field(default_factory=dict)
    rows: Counter = dataclasses.field(default_factory=Counter)

    def add(self, other: Evidence) -> None:
        self.gpu_us.update(other.gpu_us)
        self.rows.update(other.rows)
        for shape, sizes in other.logits.items():
            self.logits.setdefault(shape, Counter()).update(sizes)


def _dims(text: str) -> list:
    try:
        found = json.loads(text)
    except ValueError:
        return []
    return found if isinstance(found, list) else []


def _touches(dims: list, tokens: int, vocab: int) -> bool:
    """Whether some tensor in ``dims`` (a recorded input-shape list) is the [tokens, vocab] logits."""
    return any(
        isinstance(d, list)
        and d
        and all(isinstance(x, int) for x in d)
        and vocab in d
        and math.prod(d) == tokens * vocab
        for d in dims
    )


def _product_out(op: str, dims: list) -> list[int] | None:
    """The output shape of matrix product ``op`` from its recorded input shapes."""
    try:
        a, b = (dims[i] for i in MATMULS[op])
    except (IndexError, KeyError, TypeError):
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b) >= 2 and a[-1] == b[-2]:
        return [*a[:-1], b[-1]]
    return None


def eager_logits(tl: Events) -> tuple[np.ndarray, dict]:
    """Per host event: whether it works on logits; and the logits seen, (tokens, vocab) -> {element bytes: 1}."""
    host, names = tl.host, tl.names
    flagged = np.zeros(host.name.size, bool)
    if not tl.shapes:
        return flagged, {}
    shapes = [_dims(s) for s in tl.shapes]
    logits: dict = {}
    soft = np.flatnonzero(np.isin(host.name, [k for k, n in enumerate(names) if n in LOG_SOFTMAX]) & (host.shape >= 0))
    for i in soft.tolist():
        first = shapes[host.shape[i]][:1]
        if first and isinstance(first[0], list) and len(first[0]) >= 2 and first[0][-1] >= WIDE:
            vocab = first[0][-1]
            size = _BYTES.get(_first_type(tl, i), 4)
            logits.setdefault((math.prod(first[0]) // vocab, vocab), Counter())[size] = 1
    products = np.flatnonzero(np.isin(host.name, [k for k, n in enumerate(names) if n in MATMULS]) & (host.shape >= 0))
    pairs, first = np.unique(np.stack([host.name[products], host.shape[products]]), axis=1, return_index=True)
    outs = [_product_out(names[k], shapes[s]) for k, s in pairs.T.tolist()]
    for (tokens, vocab), sizes in logits.items():
        touching = np.array([_touches(d, tokens, vocab) for d in shapes], bool)
        flagged |= (host.shape >= 0) & touching[np.maximum(host.shape, 0)]
        for (k, s), out, at in zip(pairs.T.tolist(), outs, first.tolist()):
            if out is not None and vocab in out and math.prod(out) == tokens * vocab:
                flagged |= (host.name == k) & (host.shape == s)
                sizes[_BYTES.get(_first_type(tl, int(products[at])), 4)] = 1
    return flagged, logits


def _first_type(tl: Events, event: int) -> str:
    """The recorded dtype of an operator's first input (matrix products and log_softmax record theirs)."""
    code = tl.host.types[event]
    found = _dims(tl.types[code]) if code >= 0 else []
    return found[0] if found and isinstance(found[0], str) else ""


def compiled_logits(record: graphs.Record) -> tuple[set[tuple[int, int]], dict]:
    """The recorded calls (graph, call) that work on logits, and the logits, as ``eager_logits`` gives them.

    The logits are what the loss kernels (log_softmax, nll_loss and their backward) read: of their floating-point
    tensors whose last dimension is a vocabulary, those of the vocabulary most of them have, the one of most tokens.
    Their other tensors are no logits: a tied embedding's weight [vocabulary, width] or its gradient (inductor fuses
    it with the loss's backward), a boolean mask or an int64 index of the targets."""
    counts, most = Counter(), {}
    for shape, dtype in (t for graph in record.graphs for call in graph.calls if call.loss for t in call.tensors):
        if dtype in _FLOATS and len(shape) >= 2 and shape[-1] >= WIDE:
            counts[shape[-1]] += 1
            most[shape[-1]] = max(most.get(shape[-1], 0), math.prod(shape) // shape[-1])
    if not counts:
        return set(), {}
    vocab = max(counts, key=lambda v: (counts[v], v))
    tokens, sizes, found = most[vocab], Counter(), set()
    for g, graph in enumerate(record.graphs):
        for c, call in enumerate(graph.calls):
            touching = [dtype for shape, dtype in call.tensors if _touches([list(shape)], tokens, vocab)]
            if touching:
                found.add((g, c))
                sizes.update({_FLOATS[d]: 1 for d in touching if d in _FLOATS})
    return found, {(tokens, vocab): sizes}


def dtype_name(size: int) -> str:
    """An element size as the dtype the logits had: 4 -> fp32, 2 -> bf16/fp16."""
    return {4: "fp32", 2: "bf16/fp16", 8: "fp64"}.get(size, f"{size}-byte")
