"""Findings about what fills memory at the peak (`Summary.memory`): activations that dominate it (and what activation
checkpointing of the repeated blocks would free), large single tensors (a loss head's [tokens, vocab] logits),
optimizer state an 8-bit optimizer or sharding would shrink, and memory the allocator reserves but leaves unused.

Each rule decides on the median over the profiled steps, so a window's first step (the optimizer's state being
created, the allocator growing) does not decide it; docs/findings.md gives the rules and their measured rates.
"""

from __future__ import annotations

from statistics import median

import numpy as np

from .. import layout
from . import fmt
from .memory import STEP_KINDS, MemoryStep, MemorySummary
from .series import Series
from .tables import Diagnostic

ACTIVATION_SHARE = 0.50  # activations alive at the peak, of the peak
LARGE_BLOCK_SHARE = 0.08  # one block a step makes, of the peak
OPTIMIZER_SHARE = 0.25  # optimizer state alive at the peak, of the peak
IDLE_SHARE, IDLE_MIN = 0.25, 256 * 2**20  # reserved but not allocated at the peak: of the reserved, and at least
_LISTED = 4  # blocks a large-tensor finding lists
_MB = 2**20


def memory_findings(
    memory: MemorySummary | None, series: dict[str, dict[str, Series]] | None = None
) -> list[Diagnostic]:
    """The memory findings of one run (none without memory events), from its steps' peaks and, for fragmentation
    where the trace does not say what was reserved, from the session's memory scalars."""
    if memory is None or not memory.steps:
        return []
    steps = memory.steps
    return [
        d
        for d in (
            activations(steps, memory),
            large_blocks(steps, memory),
            optimizer_state(steps),
            fragmentation(steps, series or {}),
        )
        if d is not None
    ]


def _share(steps: list[MemoryStep], kind: str) -> float:
    return median(s.kinds.get(kind, 0) / s.peak for s in steps if s.peak) if any(s.peak for s in steps) else 0.0


def _head(steps: list[MemoryStep]) -> str:
    return f"median over {len(steps)} step{'s' * (len(steps) != 1)}, peak {fmt.size(median(s.peak for s in steps))}"


def checkpointing(memory: MemorySummary) -> tuple[str, int, int, float] | None:
    """What activation checkpointing of the largest repeated family would free at the shown peak: (family,
    instances, bytes freed, forward us recomputed); None without a family of two instances or more."""
    families: dict[str, list] = {}
    for r in memory.repeated:
        families.setdefault(r.family, []).append(r)
    if not families:
        return None
    family, members = max(families.items(), key=lambda kv: sum(r.activations for r in kv[1]))
    kept = [r.activations - r.output for r in members]
    freed = sum(kept) - max(kept)  # the outputs stay (the checkpoints' inputs); one instance is recomputed at a time
    return family, len(members), max(freed, 0), sum(r.forward_us for r in members)


def activations(steps: list[MemoryStep], memory: MemorySummary) -> Diagnostic | None:
    """Activations (made in forward, kept for backward) fill at least ACTIVATION_SHARE of the peak."""
    share = _share(steps, "activations")
    if share < ACTIVATION_SHARE:
        return None
    shown = memory.shown
    where = f"; the peak is in {shown.phase} at {shown.where}" if shown and shown.where else ""
    advice = (
        " Activation checkpointing (torch.utils.checkpoint) of the repeated blocks, or a smaller micro-batch with "
        "gradient accumulation, trades compute for this memory."
    )
    found = checkpointing(memory)
    if found and found[2] > 0:
        family, count, freed, forward_us = found
        cost = f", about {fmt.duration(forward_us)} per step" if forward_us else ""
        advice = (
            f" Checkpointing each of the {count} {family} (torch.utils.checkpoint around each instance's forward) "
            f"would free about {fmt.size(freed)} at that peak: their activations alive then less the outputs the "
            f"checkpoints keep and one instance's recomputed at a time; the cost is their forward run again in "
            f"backward{cost} (about a third more compute)."
        )
    return Diagnostic(
        "memory_activations",
        "info",
        f"Activations fill {fmt.share(share)} of the memory peak ({fmt.size(memory.kind_median('activations'))}; "
        f"{_head(steps)}{where}).{advice}",
    )


def _block_name(b) -> str:
    shape = f" of input {b.shapes}" if b.shapes else ""
    op = b.op + (f" ({b.inner})" if b.inner and b.inner != b.op else "")
    at = f" in {b.where}" if b.where and b.where != b.op else ""
    return f"{fmt.size(b.bytes)} {b.kind} from {op}{shape}{at}, allocated in {b.phase or 'an earlier step'}"


def large_blocks(steps: list[MemoryStep], memory: MemorySummary) -> Diagnostic | None:
    """One tensor a step makes (activations, temporaries) is at least LARGE_BLOCK_SHARE of the peak."""
    shares = [s.largest / s.peak for s in steps if s.peak]
    if not shares or median(shares) < LARGE_BLOCK_SHARE:
        return None
    largest = median(s.largest for s in steps)
    big = [b for b in memory.blocks if b.kind in STEP_KINDS and b.bytes >= largest / 2][:_LISTED]
    listed = "; ".join(_block_name(b) for b in big)
    return Diagnostic(
        "memory_large_tensor",
        "info",
        f"One tensor holds {fmt.share(median(shares))} of the memory peak ({fmt.size(largest)}; {_head(steps)}): "
        f"{listed or 'see the blocks at the peak'}. A loss head's logits ([tokens, vocab], in fp32 and its gradient "
        "beside it) are the usual one: a fused linear + cross-entropy (kprof_callbacks.kernels.linear_cross_entropy, "
        "Liger-Kernel's) never writes them; else compute the loss in chunks of tokens.",
    )


def optimizer_state(steps: list[MemoryStep]) -> Diagnostic | None:
    """Optimizer state is at least OPTIMIZER_SHARE of the peak."""
    share = _share(steps, "optimizer_state")
    if share < OPTIMIZER_SHARE:
        return None
    state = median(s.kinds.get("optimizer_state", 0) for s in steps)
    return Diagnostic(
        "memory_optimizer_state",
        "info",
        f"Optimizer state is {fmt.share(share)} of the memory peak ({fmt.size(state)}; {_head(steps)}). An 8-bit "
        f"optimizer (bitsandbytes' AdamW8bit) keeps Adam's two moments in a quarter of the bytes (about "
        f"{fmt.size(0.75 * state)} less); FSDP (fully_shard) or ZeRO-1 shard it, 1/N of it per rank on N ranks; a "
        "fused AdamW (fused=True) keeps the same state but makes no per-parameter temporaries in the step.",
    )


def _reserved_idle(steps: list[MemoryStep], series: dict[str, dict[str, Series]]) -> tuple[float, float, str] | None:
    """(median reserved, median idle at the peak, the source): from the trace's memory events, else from the session's
    scalars (reserved against the peak since the last sample)."""
    traced = [s for s in steps if s.reserved]
    if traced:
        return median(s.reserved for s in traced), median(s.reserved - s.peak for s in traced), "the trace"
    for tags in series.values():
        reserved, peak = tags.get(layout.MEMORY_TAGS["reserved"]), tags.get(layout.MEMORY_TAGS["peak"])
        if reserved is not None and peak is not None:
            both, a, b = np.intersect1d(reserved.steps, peak.steps, return_indices=True)
            if both.size:
                r, p = reserved.values[a] * _MB, peak.values[b] * _MB
                return float(np.median(r)), float(np.median(r - p)), "kprof/mem_reserved_mb and kprof/mem_peak_mb"
    return None


def fragmentation(steps: list[MemoryStep], series: dict[str, dict[str, Series]]) -> Diagnostic | None:
    """The allocator reserved far more than was allocated at the peak: at least IDLE_SHARE of it and IDLE_MIN idle."""
    found = _reserved_idle(steps, series)
    if found is None:
        return None
    reserved, idle, source = found
    if reserved <= 0 or idle < IDLE_MIN or idle / reserved < IDLE_SHARE:
        return None
    return Diagnostic(
        "memory_fragmentation",
        "warning",
        f"The CUDA allocator reserved {fmt.size(reserved)} at the memory peak but {fmt.size(idle)} of it "
        f"({fmt.share(idle / reserved)}) held no tensor (medians over {len(steps)} steps, from {source}): cached "
        "blocks too small or split for the next allocation (fragmentation), which an out-of-memory error counts as "
        "'reserved but unallocated'. PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lets segments grow in place; "
        "tensors of changing sizes (variable sequence lengths) fragment most: pad them to a few sizes.",
    )
