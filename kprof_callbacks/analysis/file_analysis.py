"""One trace file's analysis: its events decoded into the tables, evidence and per-step rows that the run's summary
adds up (steps, operators, labels, kernels, modules, memory, communication, call stacks).

One pass per file: decode (reader), columns (events), call tree (tree), then the per-step breakdown, the totals and
the evidence of the findings. What runs where (this process or workers) is ``reading``'s business.
"""

from __future__ import annotations

import dataclasses

from . import attribution, comm, diagnostics, health, ops, perstep, stacks, steps
from .events import PYTHON, build
from .memory_trace import FileMemory, memory_of
from .reader import TraceFile
from .tree import nest


@dataclasses.dataclass
class FileResult:
    """What one file says, ready to be added up with the run's other files."""

    rank: int | None
    worker: str
    times: steps.StepTimes
    ops: ops.Totals
    ops_by_shape: ops.Totals
    labels: ops.Totals
    label_nesting: set[tuple[str, str]]
    kernels: ops.Totals
    evidence: diagnostics.Evidence
    stack: stacks.StackSource
    per_step: perstep.PerStep
    comm: comm.FileComm
    health: health.FileHealth
    modules: attribution.FileAttribution | None
    memory: FileMemory | None = None


def analyze(trace: TraceFile) -> FileResult:
    """The analysis of one decoded trace file."""
    tl = build(trace)
    host = tl.host
    tree = nest(host.thread, host.start, host.end, host.name)
    costs = ops.host_costs(tl, tree)
    times = steps.step_times(tl, trace.rank, tree)
    launcher = tree.kept(ops.launcher_of_device_events(tl))
    attributed = attribution.analyze(tl, tree, costs, times)  # names the compiled graph calls: before the op totals
    return FileResult(
        rank=trace.rank,
        worker=trace.worker,
        times=times,
        ops=ops.op_totals(tl, tree, costs, by_shape=False),
        ops_by_shape=ops.op_totals(tl, tree, costs, by_shape=True) if tl.shapes else {},
        labels=ops.label_totals(tl, tree, costs),
        label_nesting=ops.label_nesting(tl, tree),
        kernels=ops.kernel_totals(tl),
        evidence=diagnostics.gather(tl, times.windows, tree, attributed),
        stack=stacks.StackSource(
            names=tl.names,
            name=host.name,
            parent=tree.parent,
            depth=tree.depth,
            keep=tree.keep,
            self_cpu_us=costs.self_cpu,
            kernel_name=tl.device.name,
            kernel_launcher=launcher,
            kernel_us=(tl.device.end - tl.device.start) / 1000.0,
            has_python=bool((host.kind == PYTHON).any()),
        ),
        per_step=perstep.with_modules(perstep.from_timeline(tl, tree, costs, times), attributed),
        comm=comm.analyze(tl, times),
        health=health.gather(tl, times, trace.columns.clipped, trace.world_size),
        modules=attributed,
        memory=memory_of(tl, tree, times.windows),
    )


def without_last_step(r: FileResult) -> FileResult:
    """``r`` less its last step (one cut in mid-step) in the step tables and the per-step rows."""
    cut = r.times.rows[-1]
    keep = [i for i, s in enumerate(r.per_step.steps) if s is not cut]
    return dataclasses.replace(r, times=r.times.without_last(), per_step=r.per_step.take(keep))
