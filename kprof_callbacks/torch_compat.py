"""Every private torch API kprof relies on, in one place, so that a torch upgrade breaks here and nowhere else.

Each function says what it is for and what it falls back to. tests/test_torch_compat.py runs each one against the
installed torch: torch 2.13 on the CPU in CI, 2.11+cu130 on the GPU machine.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch


def trace_only_config():
    """torch >= 2.12's ``trace_only`` profiler mode (an ``experimental_config``), else None.

    kprof reads the exported trace, never the profiler's Python event objects, so it lets torch skip building
    them when a window closes: that work runs on the training thread (20 MB CPU trace: 270-380 -> 175-180 ms).
    """
    try:
        return torch._C._profiler._ExperimentalConfig(trace_only=True)
    except TypeError:  # torch without the keyword
        return None


def profiler_enabled() -> bool:
    """True while any torch profiler (kprof's, torch.profiler, Lightning's) is collecting in this process."""
    return bool(torch.autograd.profiler._is_profiler_enabled)


def step_ranges(prof: torch.profiler.profile, enabled: bool) -> None:
    """Let ``prof`` open its ``ProfilerStep#N`` range at the next ``step()`` only when ``enabled``.

    torch opens that range (a ``record_function``) on every step, recording or not; outside windows it is most of
    what ``prof.step()`` costs (~10 of ~12 us per call on a 2-core box) and nothing collects it. A range left open
    by the last step of a window is closed here, as torch would close it first too.
    """
    if not enabled and prof.step_rec_fn is not None:
        prof.step_rec_fn.__exit__(None, None, None)
        prof.step_rec_fn = None
    prof.record_steps = enabled


def window_results(prof: torch.profiler.profile):
    """The finished window's results (an object with ``export_chrome_trace``); the next window gets new ones."""
    return prof.profiler


def first_to_store(key: str, value: str) -> str | None:
    """In the store of torch.distributed's default process group (shared by its ranks, alive as long as the group):
    ``value`` if this rank is the first to store one under ``key``, else the first rank's; None without a group."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.distributed_c10d._get_default_store().compare_set(key, "", value).decode()


def record_memory_history(enabled: bool, max_entries: int = 100_000) -> None:
    """Start (keeping the last ``max_entries`` events) or stop recording the CUDA caching allocator's history."""
    if enabled:
        torch.cuda.memory._record_memory_history(max_entries=max_entries)
    else:
        torch.cuda.memory._record_memory_history(enabled=None)


def allocator_snapshot() -> dict:
    """The CUDA caching allocator's state now: its segments and blocks, and the history recorded so far (plain
    dicts and lists, as ``_dump_snapshot`` pickles them)."""
    return torch.cuda.memory._snapshot()


def dump_memory_snapshot(path: Path) -> dict:
    """Save the allocator's snapshot (``allocator_snapshot``) as the pickle https://pytorch.org/memory_viz and kprof
    read, as ``torch.cuda.memory._dump_snapshot`` does; the snapshot saved."""
    snapshot = allocator_snapshot()
    with open(path, "wb") as f:
        pickle.dump(snapshot, f)
    return snapshot


def add_trace_metadata(key: str, json_text: str) -> None:
    """Put ``key`` with the JSON value ``json_text`` at the top of the trace of the window being recorded (torch
    clears it for the next window)."""
    torch.autograd._add_metadata_json(key, json_text)


def attach_oom_observer(observer) -> None:
    """Call ``observer(device, requested, device_allocated, device_free)`` when the CUDA caching allocator fails an
    allocation, before the OutOfMemoryError is raised (torch keeps observers for the life of the process)."""
    torch._C._cuda_attach_out_of_memory_observer(observer)


def device_memory(device: int) -> dict[str, int]:
    """The allocator's ``allocated`` and ``reserved`` bytes on ``device`` and the device's ``free`` and ``total``."""
    free, total = torch.cuda.mem_get_info(device)
    return {
        "allocated": torch.cuda.memory_allocated(device),
        "reserved": torch.cuda.memory_reserved(device),
        "free": free,
        "total": total,
    }


def cuda_memory(device: int) -> tuple[int, int, int]:
    """(allocated, reserved, peak allocated since the previous call) bytes of the caching allocator on ``device``.

    Host-side counters, no sync. torch's public ``memory_allocated`` and friends each flatten the whole stats dict
    in Python; one ``_cuda_memoryStats`` call serves all three. The peak is reset for the next call.
    """
    stats = torch._C._cuda_memoryStats(device)
    torch._C._cuda_resetPeakMemoryStats(device)
    allocated, reserved = stats["allocated_bytes"]["all"], stats["reserved_bytes"]["all"]
    return allocated["current"], reserved["current"], allocated["peak"]


def is_compiled(module: torch.nn.Module) -> bool:
    """Whether ``module`` is ``torch.compile``'s wrapper (its state_dict keys carry an ``_orig_mod.`` prefix)."""
    return isinstance(module, torch._dynamo.eval_frame.OptimizedModule)


def original_module(module: torch.nn.Module) -> torch.nn.Module:
    """The module under ``torch.compile``'s wrapper (its private ``_orig_mod``), or ``module`` when not compiled."""
    return module._orig_mod if is_compiled(module) else module


def has_fake_kernel(qualname: str) -> bool:
    """Whether the operator ``qualname`` (``"kprof::gelu"``) has a fake (meta) kernel registered from Python: a
    second ``register_fake`` for it would raise."""
    return torch._library.simple_registry.singleton.find(qualname).fake_impl.kernel is not None


def autocasts(op: str, device_type: str) -> bool:
    """Whether torch's autocast has a rule of its own for the operator ``op`` (``"aten::layer_norm"``) on
    ``device_type`` ("cpu" or "cuda"): the Triton twins follow torch's policy for the op they replace, as the C++
    operators do."""
    key = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA"}[device_type]
    return torch._C._dispatch_has_kernel_for_dispatch_key(op, key)


def is_fake(t: torch.Tensor) -> bool:
    """Whether ``t`` is a fake (shape-only) tensor, bare or functionalized: the Triton twins' bodies run as their own
    fake kernels under Triton's interpreter, and launch nothing then."""
    return torch._subclasses.fake_tensor.is_fake(t)
