"""FLOPs of the matrix products in a trace, from the input shapes torch recorded (``record_shapes=True``, which
``with_flops=True`` turns on): the count torch's own ``with_flops`` makes for mm, addmm, bmm and baddbmm.

torch's exporter does not write its FLOP counts into the trace, so kprof counts them again from the shapes:
2 x M x K x N per product (x the batch for bmm). Convolutions and attention kernels are not counted; for a model
that has them, give the step's FLOPs yourself (``s.step(flops=...)``).
"""

from __future__ import annotations

import json

import numpy as np

# aten op -> the indices of its two matrix operands in "Input Dims"
MATMULS = {"aten::mm": (0, 1), "aten::addmm": (1, 2), "aten::bmm": (0, 1), "aten::baddbmm": (1, 2)}


def product_flops(op: str, input_dims: str) -> float:
    """FLOPs of one matrix product ``op`` with the recorded ``input_dims`` (JSON); 0 when they do not fit."""
    try:
        dims = json.loads(input_dims)
        a, b = (dims[i] for i in MATMULS[op])
    except (ValueError, IndexError, KeyError, TypeError):
        return 0.0
    if len(a) == 2 and len(b) == 2 and a[1] == b[0]:
        return 2.0 * a[0] * a[1] * b[1]
    if len(a) == 3 and len(b) == 3 and a[2] == b[1]:
        return 2.0 * a[0] * a[1] * a[2] * b[2]
    return 0.0


def matmul_flops(names: list[str], shapes: list[str], name: np.ndarray, shape: np.ndarray) -> float:
    """Total FLOPs of the events (``name`` and ``shape`` ids into ``names``/``shapes``) that are matrix products."""
    ids = [k for k, n in enumerate(names) if n in MATMULS]
    rows = np.flatnonzero(np.isin(name, ids) & (shape >= 0))
    if rows.size == 0:
        return 0.0
    pairs, counts = np.unique(np.stack([name[rows], shape[rows]], axis=1), axis=0, return_counts=True)
    return sum(product_flops(names[n], shapes[s]) * c for (n, s), c in zip(pairs.tolist(), counts.tolist()))
