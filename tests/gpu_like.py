"""Traces laid out as torch.profiler writes them on a GPU, built by hand with times we choose (a mock clock): host
ranges, runtime launches, kernels on a stream, and the record of compiled kernels a session saves beside them."""

from __future__ import annotations

import json
from pathlib import Path

WORKER = "host_1"
HOST_PID, DEVICE_PID, STREAM = 100, 0, 7


class Trace:
    """Events of one trace file: ``op``/``label`` are host ranges, ``launch`` a runtime call and its kernel;
    ``runtime_pid``: the pid written on runtime calls (kineto writes the exporting process's, which can differ)."""

    def __init__(self, runtime_pid: int = HOST_PID) -> None:
        self.events: list[dict] = []
        self._corr = 0
        self.runtime_pid = runtime_pid

    def op(self, name: str, ts: float, dur: float, tid: int = 1, cat: str = "cpu_op", **args) -> None:
        """A host range; ``seq``/``fwd`` become the autograd ``Sequence number``/``Fwd thread id``."""
        pid = self.runtime_pid if cat == "cuda_runtime" else HOST_PID
        fields = {"External id": len(self.events) + 1}
        if "seq" in args:
            fields["Sequence number"] = args.pop("seq")
            fields["Fwd thread id"] = args.pop("fwd", 0)
        fields.update(args)
        self.events.append(
            {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": fields}
        )

    def label(self, name: str, ts: float, dur: float, tid: int = 1) -> None:
        self.op(name, ts, dur, tid, cat="user_annotation")

    def launch(self, ts: float, kernel: str, start: float, dur: float, tid: int = 1, corr: int | None = None) -> int:
        """A ``cudaLaunchKernel`` at ``ts`` (1 us) running ``kernel`` on the GPU from ``start`` for ``dur`` us; with
        ``corr`` the kernel joins that runtime call (a CUDA graph's replay) instead of getting one of its own."""
        if corr is None:
            self._corr += 1
            corr = self._corr
            self.op("cudaLaunchKernel", ts, 1.0, tid, cat="cuda_runtime", correlation=corr)
        self.events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": kernel,
                "pid": DEVICE_PID,
                "tid": STREAM,
                "ts": start,
                "dur": dur,
                "args": {"correlation": corr, "External id": 0},
            }
        )
        return corr

    def graph_launch(self, ts: float, tid: int = 1) -> int:
        """A ``cudaGraphLaunch`` at ``ts``: kernels launched with its correlation id are its replay."""
        self._corr += 1
        self.op("cudaGraphLaunch", ts, 2.0, tid, cat="cuda_runtime", correlation=self._corr)
        return self._corr

    def write(self, folder: Path, record: dict | None = None) -> Path:
        """The trace as ``<worker>.<ns>.pt.trace.json`` in ``folder`` (a GPU named in deviceProperties), and the
        record of compiled kernels beside it when given."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{WORKER}.1.pt.trace.json"
        doc = {"deviceProperties": [{"name": "NVIDIA H100 80GB HBM3"}], "traceEvents": self.events}
        path.write_text(json.dumps(doc, indent=1))
        if record is not None:
            (folder / f"{WORKER}.kprof-graphs.json").write_text(json.dumps(record))
        return path


def record(graphs: list[dict], modules: list[str], lines: list[tuple[str, str]] = ()) -> dict:
    """A record of compiled kernels, as graph_record.GraphRecorder writes it. Each graph: ``compile_id``,
    ``function``, ``backward`` and ``kernels``: (name, extern, {module index: nodes}, {line index: nodes}[, tensors,
    loss])."""

    def kernel(entry: tuple) -> dict:
        name, extern, mods, where, *more = entry
        tensors, loss = [*more, *[[], False][len(more) :]]
        return {
            "name": name,
            "extern": extern,
            "modules": sorted([k, w] for k, w in mods.items()),
            "lines": sorted([k, w] for k, w in where.items()),
            "tensors": tensors,
            "loss": loss,
        }

    return {
        "kprof_graphs": 1,
        "note": None,
        "modules": [[m, False] for m in modules],
        "lines": [list(line) for line in lines],
        "graphs": [dict(g, where="", kernels=[kernel(k) for k in g["kernels"]]) for g in graphs],
    }
