"""`Summary.memory`: what fills memory at the peak of each profiled step, by kind and by module, and the picture of
the median step (its allocated-memory curve, its largest blocks, its modules by kind, its repeated blocks).

Read from the traces' memory events (``profile_memory=True``, see `memory_trace`) and, where the session saved one,
the CUDA allocator's snapshot (`snapshot`). Everything here is plain data, JSON-safe through ``to_dict``/``from_dict``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from statistics import median
from typing import TYPE_CHECKING, Any

from .breakdown import MEMORY_KINDS

if TYPE_CHECKING:
    import pandas

    from .memory_trace import FileMemory

KINDS = tuple(p.key for p in MEMORY_KINDS)
"""The kinds alive at a peak, in the order the reports list them; they add up to the peak."""
STEP_KINDS = ("activations", "temporaries", "inputs", "other")
"""The kinds each step makes anew (a step's largest block is of these)."""
BEFORE = "(before the trace)"  # the module of blocks allocated before the trace began


@dataclasses.dataclass(frozen=True)
class MemoryStep:
    """One profiled step's memory peak: how much, when, where, and what was alive by kind and by module."""

    step: int
    rank: int | None
    worker: str
    peak: int  # bytes allocated at the peak (CUDA when recorded, else host memory)
    reserved: int  # bytes the allocator held then (0 where the trace does not say)
    at_us: float  # the peak's time from the step's start
    phase: str  # forward, backward, optimizer, zero_grad or other
    where: str  # the module (or site, or operator) allocating at the peak
    kinds: dict[str, int]  # bytes alive at the peak by kind (KINDS): they add up to ``peak``
    modules: dict[str, int]  # bytes alive at the peak by the module that allocated them (the largest)
    largest: int = 0  # the largest block alive at the peak of the kinds a step makes (STEP_KINDS)


@dataclasses.dataclass(frozen=True)
class MemoryBlock:
    """A block alive at the shown step's peak."""

    bytes: int
    kind: str
    where: str  # module, site or operator that allocated it ("(before the trace)" for older blocks)
    op: str  # the operator the program called (outermost), "" when none
    inner: str  # the operator that allocated (innermost)
    shapes: str  # the outermost operator's input shapes (record_shapes=True), "" when not recorded
    phase: str  # the phase it was allocated in
    allocated_us: float | None  # from the step's start; None: before the trace
    freed_us: float | None  # from the step's start; None: not freed in the trace


@dataclasses.dataclass(frozen=True)
class ModuleMemory:
    """Bytes alive at the shown step's peak that one module (or site) allocated, of one kind."""

    module: str
    kind: str
    bytes: int


@dataclasses.dataclass(frozen=True)
class RepeatedModule:
    """One instance of a repeated module (``blocks.3`` of ``blocks.*``) at the shown step's peak: the activations it
    allocated and that were alive then, the last of them (its output, which the next one reads), its forward time."""

    name: str
    family: str
    activations: int
    output: int
    forward_us: float


@dataclasses.dataclass
class MemorySummary:
    """Memory at the peak of every profiled step, and the median step (by peak) in detail."""

    device: str  # "cuda" or "cpu": whose memory the peaks are
    steps: list[MemoryStep]
    shown: MemoryStep | None  # the median step by peak (of the first rank or worker)
    curve: list[list[float]]  # its allocated memory over the step: [[us from the step's start, bytes], ...]
    phases: list[list[Any]]  # its phases in time order: [[phase, from us, to us], ...]
    blocks: list[MemoryBlock]  # its largest blocks alive at the peak
    modules: list[ModuleMemory]  # bytes alive at its peak by module and kind
    repeated: list[RepeatedModule]  # its repeated modules' activations at the peak
    note: dict[str, Any] | None = None  # the session's note: parameters, gradients, optimizer state when it began
    snapshots: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # `snapshot.summarize` of each

    @property
    def peak(self) -> int:
        """The median over steps of the peak allocated (bytes)."""
        return int(median(s.peak for s in self.steps)) if self.steps else 0

    def kind_median(self, kind: str) -> int:
        """The median over steps of the bytes of ``kind`` alive at the peak."""
        return int(median(s.kinds.get(kind, 0) for s in self.steps)) if self.steps else 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: plain dicts and lists."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MemorySummary:
        """The summary ``to_dict`` wrote."""

        def step(row: dict[str, Any] | None) -> MemoryStep | None:
            return None if row is None else MemoryStep(**row)

        return cls(
            device=data["device"],
            steps=[MemoryStep(**s) for s in data["steps"]],
            shown=step(data["shown"]),
            curve=data["curve"],
            phases=data["phases"],
            blocks=[MemoryBlock(**b) for b in data["blocks"]],
            modules=[ModuleMemory(**m) for m in data["modules"]],
            repeated=[RepeatedModule(**r) for r in data["repeated"]],
            note=data.get("note"),
            snapshots=data.get("snapshots", []),
        )

    def to_pandas(self) -> dict[str, pandas.DataFrame]:
        """DataFrames: ``memory`` (a row per step, a column per kind), ``memory_blocks``, ``memory_modules``."""
        import pandas as pd

        steps = [
            {**{k: v for k, v in dataclasses.asdict(s).items() if k not in ("kinds", "modules")}, **s.kinds}
            for s in self.steps
        ]
        return {
            "memory": pd.DataFrame(steps),
            "memory_blocks": pd.DataFrame([dataclasses.asdict(b) for b in self.blocks]),
            "memory_modules": pd.DataFrame([dataclasses.asdict(m) for m in self.modules]),
        }


def merge_memory(files: list[FileMemory | None], snapshot_paths: list[Path]) -> MemorySummary | None:
    """One run's memory from its files' and its allocator snapshots' (None when no file recorded memory and there
    is no snapshot); the shown step is the median one of the first rank or worker's."""
    from .snapshot import summaries

    found = [f for f in files if f is not None and f.steps]
    snapshots = summaries(snapshot_paths)
    if not found and not snapshots:
        return None
    first = min(((f.steps[0].rank is None, f.steps[0].rank or 0, f.steps[0].worker) for f in found), default=None)
    mine = sorted(
        (f for f in found if (f.steps[0].rank is None, f.steps[0].rank or 0, f.steps[0].worker) == first),
        key=lambda f: f.shown.peak,
    )
    pick = mine[(len(mine) - 1) // 2] if mine else None
    return MemorySummary(
        device=found[0].device if found else "cuda",
        steps=[s for f in found for s in f.steps],
        shown=pick.shown if pick else None,
        curve=pick.curve if pick else [],
        phases=pick.phases if pick else [],
        blocks=pick.blocks if pick else [],
        modules=pick.modules if pick else [],
        repeated=pick.repeated if pick else [],
        note=pick.note if pick else None,
        snapshots=snapshots,
    )
