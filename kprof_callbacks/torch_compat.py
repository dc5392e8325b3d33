"""Every private torch API kprof relies on, in one place, so that a torch upgrade breaks here and nowhere else.

Each function says what it is for and what it falls back to. tests/test_torch_compat.py runs each one against the
installed torch: torch 2.13 on the CPU in CI, 2.11+cu130 on the GPU machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import pickle
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

log = logging.getLogger(__name__)


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


def compiled_at_root(module: torch.nn.Module) -> bool:
    """Whether calling ``module`` runs compiled code from its root: ``torch.compile(module)``'s wrapper, or a module
    compiled in place by ``module.compile()`` (its private ``_compiled_call_impl``)."""
    return is_compiled(module) or getattr(module, "_compiled_call_impl", None) is not None


# ``torch.compiler.is_compiling()`` for module hooks, at half its cost (they ask on every module call):
# ``is_dynamo_compiling()`` is the constant True where Dynamo traces the hook (nothing after it is traced, no guard)
# and a bare ``return False`` elsewhere; then the flag ``is_compiling()`` itself reads (true in a compile session's own
# calls of modules, on fake tensors), without its ``torch.jit.is_scripting()`` call:
#     if is_dynamo_compiling() or COMPILER._is_compiling_flag: ...
# (a torch without that private flag gets an object whose flag asks ``is_compiling()``: slower, never an error)


class _CompilingFlag:
    @property
    def _is_compiling_flag(self) -> bool:
        return torch.compiler.is_compiling()


is_dynamo_compiling = torch.compiler.is_dynamo_compiling
COMPILER = torch.compiler if hasattr(torch.compiler, "_is_compiling_flag") else _CompilingFlag()

# A profiler range (enter and exit it): torch's C++ ``_RecordFunctionFast``, 0.5 us a range against 7 us for
# ``record_function`` (its category is ``cpu_op``); ``record_function`` where this torch lacks it
FastRange = getattr(torch._C._profiler, "_RecordFunctionFast", torch.profiler.record_function)


def never_compiled_as_frames(*functions: Callable) -> None:
    """Dynamo compiles no frame of its own for ``functions`` (module hooks), yet still traces through them where
    compiled code calls them. Hooks around a compiled module's call run under Dynamo's frame callback: it would
    compile each into code that does nothing (``is_compiling`` was true while it traced them), in the user's step
    (55 ms of guards on an H100), and the module would lose its range. Only once Dynamo is imported (importing it
    takes a second; torch.compile does), through its private ``skip_code``; without it, nothing."""
    skip = getattr(sys.modules.get("torch._dynamo.eval_frame"), "skip_code", None)
    for fn in functions if skip is not None else ():
        skip(fn.__code__)


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


# -- what inductor knows about each kernel it generates -------------------------------------------------------------
# Inductor calls ``torch._inductor.debug.set_kernel_post_grad_provenance_tracing(node_schedule, kernel_name,
# is_extern=False)`` once per kernel call it writes into a graph's wrapper, in call order, whatever
# ``config.trace.provenance_tracking_level`` says (the function itself returns at once when it is 0). codegen/triton.py
# and codegen/cpp.py bind it by name at import, ir.py and scheduler.py look it up at call time: the debug module and
# every inductor module holding the name are patched once, and the patch routes each call to the active sink.
_PROVENANCE = "set_kernel_post_grad_provenance_tracing"
_SINK: list[Callable[[InductorKernel], None] | None] = [None]


@dataclasses.dataclass(frozen=True)
class InductorKernel:
    """One kernel call inductor generated: the graph being generated (its identity groups calls), the kernel's name
    (``triton_poi_fused_add_0``, ``extern_kernels.mm``), whether it is an extern call, and the FX nodes it computes."""

    graph: object
    name: str
    extern: bool
    origins: list


def record_inductor_kernels(sink: Callable[[InductorKernel], None] | None) -> str | None:
    """Send each kernel inductor generates from now on to ``sink`` (None: to nobody). Returns None when this torch
    has the hook, else one line saying why nothing will be recorded."""
    try:
        import torch._inductor.debug as debug
    except ImportError as exc:
        return f"torch {torch.__version__} has no inductor ({exc})"
    original = getattr(debug, _PROVENANCE, None)
    if original is None or not {"node_schedule", "kernel_name", "is_extern"} <= set(_parameters(original)):
        return f"torch {torch.__version__}'s inductor has no {_PROVENANCE}(node_schedule, kernel_name, is_extern)"
    if not getattr(original, "_kprof", False):
        _patch(debug, original)
    _SINK[0] = sink
    return None


def _parameters(fn: Callable) -> list[str]:
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return []


def _patch(debug, original: Callable) -> None:
    def provenance(node_schedule, kernel_name, is_extern=False):
        sink = _SINK[0]
        if sink is not None and kernel_name:
            try:
                sink(InductorKernel(_current_graph(), kernel_name, bool(is_extern), _origins(node_schedule, is_extern)))
            except Exception:  # recording is a bonus: it never breaks a compilation
                log.debug("kprof: recording inductor kernel %s failed", kernel_name, exc_info=True)
        return original(node_schedule, kernel_name, is_extern)

    provenance._kprof = True
    for name, module in list(sys.modules.items()):
        if name.startswith("torch._inductor") and getattr(module, _PROVENANCE, None) is original:
            setattr(module, _PROVENANCE, provenance)


def _current_graph() -> object:
    from torch._inductor.virtualized import V

    return V.graph


def _origins(node_schedule, is_extern: bool) -> list:
    """The FX nodes a kernel computes: an extern kernel's origin node (else its origins), or the origins of each
    scheduler node of a fused kernel's schedule (the reduction markers in it carry none)."""
    if is_extern:
        exact = getattr(node_schedule, "origin_node", None)
        return [exact] if exact is not None else sorted(node_schedule.origins, key=lambda n: n.name)
    found: dict = {}
    for snode in node_schedule:
        node = getattr(snode, "node", None)
        for origin in sorted(getattr(node, "origins", ()) or (), key=lambda n: n.name):
            found.setdefault(origin, None)
    return list(found)


@dataclasses.dataclass(frozen=True)
class GraphFacts:
    """What is known of the graph inductor generates: backward or forward, Dynamo's compile id (``0/1``: frame 0,
    its second compilation) and the compiled function (``GPT.forward``) with where it starts (``file:line``)."""

    backward: bool
    compile_id: str
    function: str
    where: str


def graph_facts(graph: object) -> GraphFacts:
    """The facts of ``graph`` (an inductor graph being generated), from inductor's and Dynamo's contexts."""
    from torch._guards import CompileContext, TracingContext

    compile_id = CompileContext.current_compile_id()
    tracing = TracingContext.try_get()
    code = tracing.traced_code[0] if tracing is not None and getattr(tracing, "traced_code", None) else None
    function = getattr(code, "co_qualname", getattr(code, "co_name", "")) if code is not None else ""
    where = f"{code.co_filename}:{code.co_firstlineno}" if code is not None else ""
    return GraphFacts(bool(getattr(graph, "is_backward", False)), str(compile_id or ""), function, where)


@contextlib.contextmanager
def compile_caches_bypassed() -> Iterator[None]:
    """Inductor's FX graph cache and AOTAutograd's cache off for the block: a graph loaded from either skips code
    generation, so its kernels would never be seen."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    saved = [
        (c, k, getattr(c, k))
        for c, k in ((inductor_config, "fx_graph_cache"), (functorch_config, "enable_autograd_cache"))
        if hasattr(c, k)
    ]
    for config, key, _ in saved:
        setattr(config, key, False)
    try:
        yield
    finally:
        for config, key, value in saved:
            setattr(config, key, value)
