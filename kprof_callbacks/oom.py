"""The out-of-memory report: when a CUDA out-of-memory error ends a profiled session, what held memory at that moment
and what was allocating, on one screen, saved beside the traces before the error goes on, unchanged.

It reads what is cheap and still there: the exception's traceback (the step's phase and the module whose forward
ran, found from the frames' ``self``), the allocator's numbers at the failed allocation (an out-of-memory observer)
and now, and the allocator's segments (every live block, with the Python lines that allocated it when its history
is recorded: ``memory_snapshot=True`` or ``oom_snapshot=True``). Live blocks holding the optimizers' parameters,
gradients and state are named by their addresses; the rest is what forward and backward made (activations and
temporaries). Nothing here may raise into the training program: `write_report` logs its own failures.
"""

from __future__ import annotations

import logging
import sys
import traceback
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from . import layout, torch_compat
from .analysis import fmt, site_of
from .memory_watch import last_oom, save_snapshot

if TYPE_CHECKING:
    from .memory_watch import Watch

log = logging.getLogger(__name__)

BLOCKS, SITES = 8, 6  # rows of the report's tables
KINDS = ("parameters", "gradients", "optimizer_state")
REST = "activations and temporaries"
_MESSAGE_CHARS = 300
_BACKWARD_FILES = ("/torch/autograd/__init__.py", "/torch/autograd/graph.py")  # where backward() enters the engine


def where(tb: TracebackType | None) -> tuple[str, str, str]:
    """(phase, module, line) of the failing call, from the innermost frame outwards: backward inside the autograd
    engine's entry (``loss.backward()``, ``torch.autograd.backward``), optimizer inside torch.optim, forward inside an
    nn.Module's method (the module named by its path in the outermost module of the traceback when it is one of its
    children, else by its class)."""
    frames = [f for f, _ in traceback.walk_tb(tb)]
    modules = [f.f_locals.get("self") for f in frames]
    modules = [m for m in modules if isinstance(m, torch.nn.Module)]
    user = [f for f in frames if not _torch_file(f.f_code.co_filename)]
    line = f"{Path(user[-1].f_code.co_filename).name}:{user[-1].f_lineno} in {user[-1].f_code.co_name}" if user else ""
    for frame in reversed(frames):
        name = frame.f_code.co_filename.replace("\\", "/")
        if name.endswith(_BACKWARD_FILES) or name.endswith("/torch/_tensor.py") and frame.f_code.co_name == "backward":
            return "backward", "", line
        if "/torch/optim/" in name:
            return "optimizer", "", line
        if isinstance(frame.f_locals.get("self"), torch.nn.Module):
            return "forward", _module_name(modules[0], frame.f_locals["self"]), line
    return "other", "", line


def _torch_file(filename: str) -> bool:
    name = filename.replace("\\", "/")
    return "/torch/" in name or "/site-packages/" in name or "/dist-packages/" in name


def _module_name(root: torch.nn.Module, module: torch.nn.Module) -> str:
    kind = type(module).__name__
    if module is root:
        return kind
    for name, child in root.named_modules():
        if child is module:
            return f"{name} ({kind})"
    return kind


def _blocks(snapshot: dict[str, Any], device: int) -> list[dict[str, Any]]:
    """The live blocks of ``device``'s segments: address, size, frames (empty without history)."""
    out = []
    for seg in snapshot.get("segments", []):
        if seg.get("device", 0) != device:
            continue
        addr = int(seg.get("address", 0))
        for block in seg.get("blocks", []):
            if block.get("state") == "active_allocated":
                out.append({"addr": addr, "size": int(block.get("size", 0)), "frames": block.get("frames") or []})
            addr += int(block.get("size", 0))
    return out


def _kinds(blocks: list[dict[str, Any]], tensors: dict[str, dict[int, int]]) -> list[str]:
    """Each block's kind: the optimizers' parameters, gradients or state whose storage lies in it, else REST."""
    kinds = [REST] * len(blocks)
    if not blocks:
        return kinds
    starts = np.array([b["addr"] for b in blocks], np.int64)
    order = np.argsort(starts)
    for kind in KINDS:
        pointers = np.array(list(tensors.get(kind, {})), np.int64)
        if not pointers.size:
            continue
        at = order[np.maximum(np.searchsorted(starts[order], pointers, side="right") - 1, 0)]
        inside = (starts[at] <= pointers) & (pointers < starts[at] + np.array([blocks[i]["size"] for i in at]))
        for i in at[inside].tolist():
            if kinds[i] == REST:
                kinds[i] = kind
    return kinds


def _numbers(device: int) -> list[str]:
    """The allocator at the failed allocation (the observer's numbers) and now."""
    lines = []
    oom = last_oom()
    if oom:
        lines.append(
            f"At the failed allocation: {fmt.size(oom['requested'])} asked for, {fmt.size(oom['allocated'])} "
            f"allocated, {fmt.size(oom['free'])} free on the device."
        )
    now = torch_compat.device_memory(device)
    idle = now["reserved"] - now["allocated"]
    lines.append(
        f"Now: {fmt.size(now['allocated'])} allocated, {fmt.size(now['reserved'])} reserved ({fmt.size(idle)} "
        f"reserved but unallocated), {fmt.size(now['free'])} free of {fmt.size(now['total'])}."
    )
    return lines


def _tables(blocks: list[dict[str, Any]], kinds: list[str], history: bool) -> list[str]:
    """By kind, the largest blocks and (with history) the allocation sites holding the most."""
    total = sum(b["size"] for b in blocks) or 1
    lines = [f"Live blocks by kind ({len(blocks)} blocks, {fmt.size(total)}):"]
    by_kind: dict[str, int] = {}
    for b, kind in zip(blocks, kinds):
        by_kind[kind] = by_kind.get(kind, 0) + b["size"]
    for kind, size in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {kind.replace('_', ' '):<28} {fmt.size(size):>10}  {fmt.share(size / total):>4}")
    lines.append("Largest live blocks:")
    ranked = sorted(zip(blocks, kinds), key=lambda bk: -bk[0]["size"])
    for b, kind in ranked[:BLOCKS]:
        lines.append(f"  {fmt.size(b['size']):>10}  {kind.replace('_', ' '):<28} {site_of(b['frames'])}".rstrip())
    if history:
        sites: dict[str, int] = {}
        for b in blocks:
            site = site_of(b["frames"]) or "(unknown)"
            sites[site] = sites.get(site, 0) + b["size"]
        lines.append("By allocation site:")
        for site, size in sorted(sites.items(), key=lambda kv: -kv[1])[:SITES]:
            lines.append(f"  {fmt.size(size):>10}  {site}")
    return lines


def render(watch: Watch, exc: BaseException, step: int, recording: bool, snapshot: Path | None) -> str:
    """The report's text."""
    phase, module, line = where(exc.__traceback__)
    device = int(last_device())
    head = f"kprof: CUDA out of memory at step {step}, in {phase}" + (f" of {module}" if module else "")
    lines = [head + (f" ({line})" if line else ""), f"  {type(exc).__name__}: {str(exc)[:_MESSAGE_CHARS]}"]
    lines += _numbers(device)
    state = torch_compat.allocator_snapshot()
    blocks = _blocks(state, device)
    history = any(b["frames"] for b in blocks)
    lines += _tables(blocks, _kinds(blocks, watch.tensors()), history)
    if recording:
        lines.append(f"The step was being profiled: its trace (cut short) is in {watch.run_dir}.")
    lines.append(
        f"Snapshot: {snapshot} (kprof tensorboard {watch.run_dir.parent} shows it)"
        if snapshot
        else "No allocator history was recorded: oom_snapshot=True (or memory_snapshot=True) names the lines that "
        "allocated each block, and saves a snapshot."
    )
    return "\n".join(lines)


def last_device() -> int:
    """The device of the last failed allocation, else the current one."""
    oom = last_oom()
    return oom["device"] if "device" in oom else torch.cuda.current_device()


def write_report(watch: Watch, exc: BaseException, step: int, recording: bool) -> Path | None:
    """Save the snapshot (when its history was recorded) and the report beside the traces, and print where they
    are; the report's path, None when it could not be written (said in a warning, never raised)."""
    try:
        snapshot = None
        if watch.history:
            snapshot = watch.snapshot_path()
            save_snapshot(snapshot)
        elif watch.config.memory_snapshot:  # the session saves it as it stops
            snapshot = layout.snapshot_path(watch.run_dir, watch.worker)
        text = render(watch, exc, step, recording, snapshot)
        path = layout.oom_report_path(watch.run_dir, watch.worker)
        path.write_text(text + "\n", encoding="utf-8")
    except Exception as exc_:  # the report must never hide the error itself
        log.warning("kprof: could not write the out-of-memory report: %s", exc_, exc_info=True)
        return None
    print(f"{text.splitlines()[0]}\nkprof: out-of-memory report: {path}", file=sys.stderr)
    return path
