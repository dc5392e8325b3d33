"""Flamegraph "folded stacks" (`frame;frame;leaf value` lines) from the host call tree.

Frames are the enclosing Python functions (recorded with with_stack=True), labels and
operators, outermost first; the value is the event's self CPU time, or for `self_cuda`
the GPU time of each kernel under the op that launched it. Unlike torch's export_stacks,
which writes only Python frames, the operator itself is the leaf frame. Open the file
with flamegraph.pl, speedscope or inferno.
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import numpy as np

METRICS = ("self_cpu", "self_cuda")


@dataclasses.dataclass
class StackSource:
    """What one trace contributes to a flamegraph (kept from summarize() for a later export)."""

    names: list[str]
    name: np.ndarray  # host event name ids
    parent: np.ndarray
    depth: np.ndarray
    keep: np.ndarray
    self_cpu_us: np.ndarray
    kernel_name: np.ndarray  # device event name ids
    kernel_launcher: np.ndarray  # host event index or -1
    kernel_us: np.ndarray
    has_python: bool


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_STEP = re.compile(r"^ProfilerStep#\d+$")


def _frame(name: str) -> str:
    """A frame name safe for the folded format, with per-call noise (object addresses, step numbers) removed."""
    name = _STEP.sub("ProfilerStep*", _ADDRESS.sub("", name))
    return name.replace(";", ":").replace("\n", " ")


def _paths(src: StackSource, frames: list[str]) -> list[str]:
    """The folded path (outermost frame first) of every kept host event."""
    paths = [""] * src.name.size
    parent, keep, name = src.parent.tolist(), src.keep.tolist(), src.name.tolist()
    for i in np.argsort(src.depth, kind="stable").tolist():
        if keep[i]:
            p = parent[i]
            paths[i] = f"{paths[p]};{frames[name[i]]}" if p >= 0 else frames[name[i]]
    return paths


def folded(sources: Iterable[StackSource], metric: str) -> dict[str, float]:
    """Folded path -> summed metric (microseconds) over all sources."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    out: dict[str, float] = defaultdict(float)
    for src in sources:
        frames = [_frame(n) for n in src.names]
        paths = _paths(src, frames)
        if metric == "self_cpu":
            for i in np.flatnonzero(src.keep & (src.self_cpu_us > 0)).tolist():
                out[paths[i]] += float(src.self_cpu_us[i])
        else:
            for k, launcher, us in zip(src.kernel_name.tolist(), src.kernel_launcher.tolist(), src.kernel_us.tolist()):
                stem = paths[launcher] if launcher >= 0 and paths[launcher] else "(no host op)"
                out[f"{stem};{frames[k]}"] += us
    return out


def write_folded(stacks: dict[str, float], path: str | Path) -> int:
    """Write `path;to;frame value` lines (integer microseconds, zeros dropped); returns the line count."""
    lines = [f"{stack} {int(round(v))}" for stack, v in sorted(stacks.items()) if round(v) > 0]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + ("\n" if lines else ""))
    return len(lines)
