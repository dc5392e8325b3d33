"""The model's part of a session (``kprof.session(model=...)``): what the module view needs from training.

Eager modules: a profiler range around each module call while a window records (``module_ranges``). Compiled code:
the record of each kernel inductor generates during the session, with its modules and source lines
(``graph_record``), saved beside the traces (``layout.graphs_path``) before each window's trace and at the end. While
the session runs, inductor's caches are bypassed: a graph loaded from a cache is not generated again, and its
kernels would go unrecorded. ``analysis/attribution.py`` reads both back.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from torch import nn

from . import layout, torch_compat
from .graph_record import GraphRecorder
from .module_ranges import ModuleRanges, qualified_names
from .writer import TraceWriter


class ModelCapture:
    """Module ranges and the compiled-kernel record of one model, driven by its session; with no model, nothing."""

    def __init__(self, model: nn.Module | None) -> None:
        if model is not None and not isinstance(model, nn.Module):
            raise TypeError(
                f"model must be a torch.nn.Module (the one being trained) or None, got {type(model).__name__}"
            )
        while isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            model = model.module  # its modules' names, without the wrapper's "module." in front
        # a model compiled at its root runs no module of its own eagerly: its kernels are named by the record alone
        eager = model is not None and not torch_compat.compiled_at_root(model)
        self.ranges = ModuleRanges(model) if eager else None
        self.graphs = None if model is None else GraphRecorder(qualified_names(model).values())
        self._undo = contextlib.ExitStack()

    def start(self, recording: bool) -> None:
        """Record the kernels inductor generates from now on (with its caches bypassed), or note why it cannot; module
        ranges on if the first step is ``recording``."""
        self.sync(recording)
        if self.graphs is None:
            return
        note = torch_compat.record_inductor_kernels(self.graphs)
        if note is not None:
            self.graphs.note, self.graphs.changed = note, True
            return
        self._undo.callback(torch_compat.record_inductor_kernels, None)
        self._undo.enter_context(torch_compat.compile_caches_bypassed())

    def sync(self, recording: bool) -> None:
        """Module ranges on while a window records, off otherwise."""
        if self.ranges is not None and recording != self.ranges.active:
            self.ranges.start() if recording else self.ranges.stop()

    def save(self, writer: TraceWriter, run_dir: Path) -> None:
        """Hand the record to the trace writer (written atomically, on its thread) when it changed since last time."""
        if self.graphs is not None and self.graphs.changed:
            data, path = self.graphs.to_json(), layout.graphs_path(run_dir, writer.worker)
            writer.submit_call(lambda: layout.atomic_write(path, data))

    def stop(self, writer: TraceWriter | None = None, run_dir: Path | None = None) -> None:
        """No more ranges, no more recording, inductor's caches as they were; the record saved last (with a writer)."""
        if self.ranges is not None:
            self.ranges.stop()
        self._undo.close()
        if writer is not None and run_dir is not None:
            self.save(writer, run_dir)
