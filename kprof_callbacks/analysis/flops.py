"""FLOPs of the matrix products in a trace, from the input shapes torch recorded (``record_shapes=True``, which
``with_flops=True`` turns on): the count torch's own ``with_flops`` makes for mm, addmm, bmm and baddbmm.

torch's exporter does not write its FLOP counts into the trace, so kprof counts them again from the shapes:
2 x M x K x N per product (x the batch for bmm). Convolutions and attention kernels are not counted; for a model
that has them, give the step's FLOPs yourself (``s.step(flops=...)``).
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np

# aten op -> the indices of its two matrix operands in "Input Dims" (and "Input type")
MATMULS = {"aten::mm": (0, 1), "aten::addmm": (1, 2), "aten::bmm": (0, 1), "aten::baddbmm": (1, 2)}
# "Input type" -> the dtype as peaks.DTYPES spells it; others have no peak in kprof's table
_DTYPES = {"c10::BFloat16": "bf16", "c10::Half": "fp16", "float": "fp32"}


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


def product_dtype(op: str, input_types: str) -> str:
    """The dtype of matrix product ``op``'s first operand from its recorded ``input_types`` (JSON), as
    peaks.DTYPES spells it; "" when not recorded or not bf16, fp16 or fp32."""
    try:
        return _DTYPES.get(json.loads(input_types)[MATMULS[op][0]], "")
    except (ValueError, IndexError, KeyError, TypeError):
        return ""


def matmul_flops(
    tables: tuple[list[str], list[str], list[str]], name: np.ndarray, shape: np.ndarray, types: np.ndarray
) -> Counter:
    """FLOPs of the events that are matrix products, by the dtype of their operands ("" where not known). ``name``,
    ``shape`` and ``types`` are ids into the three ``tables``: names, shapes and types (-1: not recorded)."""
    names, shapes, type_table = tables
    ids = [k for k, n in enumerate(names) if n in MATMULS]
    rows = np.flatnonzero(np.isin(name, ids) & (shape >= 0))
    out: Counter = Counter()
    if rows.size == 0:
        return out
    keys, counts = np.unique(np.stack([name[rows], shape[rows], types[rows]], axis=1), axis=0, return_counts=True)
    for (n, s, t), c in zip(keys.tolist(), counts.tolist()):
        out[product_dtype(names[n], type_table[t]) if t >= 0 else ""] += product_flops(names[n], shapes[s]) * c
    return out
