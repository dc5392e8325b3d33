"""What a session does for memory besides the profiler's own events: a note in each window's trace of the bytes the
optimizers hold (which the trace's memory events, recorded from the window's start, cannot tell apart), the CUDA
allocator's history for out-of-memory reports, and the report itself when an out-of-memory error ends the session.

The optimizers are found by a global step hook (``register_optimizer_step_post_hook``), so neither a plain loop nor
Lightning has to hand them over; the note is written once per window, at its first recorded step, as the trace's
``kprof_memory`` key (``{"device", "parameters", "gradients", "optimizer_state"}``, bytes as the allocator counts
them, in blocks of 512).
"""

from __future__ import annotations

import json
import logging
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from . import layout, torch_compat

if TYPE_CHECKING:
    from .config import ProfileConfig

log = logging.getLogger(__name__)

OOM_HISTORY_ENTRIES = 20_000  # allocator events oom_snapshot=True keeps: ~10 MB of pickle, a few seconds to save
_BLOCK = 512  # the CUDA caching allocator rounds every allocation up to a multiple of this
_LAST_OOM: dict[str, Any] = {}  # the allocator's numbers at the last failed allocation (the observer's)
_OBSERVING = False  # the observer is attached once per process: torch cannot detach one


def _observe(device: int, requested: int, device_allocated: int, device_free: int) -> None:
    _LAST_OOM.clear()
    _LAST_OOM.update(device=device, requested=requested, allocated=device_allocated, free=device_free)


def last_oom() -> dict[str, Any]:
    """The allocator's numbers at the last allocation that failed in this process (empty when none did, or without
    CUDA): device, requested, allocated, free."""
    return dict(_LAST_OOM)


def _storages(tensors: Any, device: str) -> dict[int, int]:
    """Data pointer -> bytes (in allocator blocks) of the distinct storages of ``tensors`` on ``device``'s type."""
    out: dict[int, int] = {}
    round_to = _BLOCK if device == "cuda" else 1
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type == device and not t.is_meta:
            storage = t.untyped_storage()
            out[storage.data_ptr()] = -(-storage.nbytes() // round_to) * round_to
    return out


class Watch:
    """One session's memory bookkeeping (``Session`` drives it: start, each step, stop)."""

    def __init__(self, config: ProfileConfig, run_dir: Path, worker: str) -> None:
        self.config, self.run_dir, self.worker = config, run_dir, worker
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.optimizers: weakref.WeakSet = weakref.WeakSet()
        self._noted: int | None = None  # the window whose trace has its note
        self._hook = (
            register_optimizer_step_post_hook(self._seen) if config.profile_memory or config.oom_report else None
        )
        self.history = self.device == "cuda" and config.oom_snapshot and not config.memory_snapshot
        if self.history:
            torch_compat.record_memory_history(True, OOM_HISTORY_ENTRIES)
        self._observe()

    def _observe(self) -> None:
        global _OBSERVING
        if self.config.oom_report and self.device == "cuda" and not _OBSERVING:
            try:
                torch_compat.attach_oom_observer(_observe)
                _OBSERVING = True
            except Exception as exc:  # an older torch, a build without it: the report goes without its numbers
                log.debug("no out-of-memory observer: %s", exc)

    def _seen(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.optimizers.add(optimizer)

    def tensors(self) -> dict[str, dict[int, int]]:
        """The distinct storages (pointer -> bytes) of the watched optimizers' parameters, gradients and state."""
        params = [p for opt in list(self.optimizers) for group in opt.param_groups for p in group["params"]]
        state = [v for opt in list(self.optimizers) for s in opt.state.values() for v in s.values()]
        return {
            "parameters": _storages(params, self.device),
            "gradients": _storages((p.grad for p in params), self.device),
            "optimizer_state": _storages(state, self.device),
        }

    def on_step(self, recording: bool, window: int | None) -> None:
        """After ``prof.step()``: at the first recorded step of a window, note the optimizers' bytes in its trace."""
        if not (recording and self.config.profile_memory) or window is None or window == self._noted:
            return
        self._noted = window
        try:
            held = {kind: sum(found.values()) for kind, found in self.tensors().items()}
            torch_compat.add_trace_metadata("kprof_memory", json.dumps({"device": self.device, **held}))
        except Exception as exc:  # a note is a bonus: the window records without it
            log.warning("kprof: could not note the optimizers' memory in the trace: %s", exc)

    def stop(self, exception: BaseException | None, step: int, recording: bool) -> None:
        """At the session's end: the out-of-memory report when ``exception`` is one; unhook and stop the history."""
        try:
            if self.config.oom_report and isinstance(exception, torch.OutOfMemoryError):
                from .oom import write_report

                write_report(self, exception, step, recording)
            self.close()
        except Exception as exc:  # the profiler must still stop, and the exception go on as it was
            log.warning("kprof: the session's memory bookkeeping failed at its end: %s", exc)

    def close(self) -> None:
        """Unhook, and stop the allocator history this watch started."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.history:
            self.history = False
            torch_compat.record_memory_history(False)

    def snapshot_path(self) -> Path:
        """Where an out-of-memory snapshot of this session goes."""
        return layout.oom_snapshot_path(self.run_dir, self.worker)


def save_snapshot(path: Path) -> Path | None:
    """Dump the allocator's snapshot to ``path`` and its summary beside it (what the kprof tab shows without reading
    the pickle); the summary's path, None when only the snapshot could be saved."""
    from .analysis import save_beside, summarize_value

    value = torch_compat.dump_memory_snapshot(path)
    try:
        return save_beside(summarize_value(value, path), path)
    except Exception as exc:  # the pickle is saved: the reader summarizes it when it is opened
        log.warning("kprof: could not summarize the memory snapshot %s: %s", path, exc)
        return None
