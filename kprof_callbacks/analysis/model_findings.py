"""Findings that depend on how the model runs (eager, torch.compile, CUDA graphs) and on what it computes.

How it runs, from the trace: compiled when its steps call compiled graphs (``## Call CompiledFxGraph`` and
``Torch-Compiled Region`` ranges); in CUDA graphs when most of the GPU time is replayed from them (kernels launched by
``cudaGraphLaunch``); eager otherwise. The launch-bound finding's advice follows: compile an eager model; use
``mode="reduce-overhead"`` (CUDA graphs) for a compiled one; neither for one already in CUDA graphs.
The loss head: GPU time on [tokens, vocabulary] logits (``losshead.py``), the median share of the steps' GPU busy time.
"""

from __future__ import annotations

from statistics import median

import numpy as np

from . import fmt, losshead
from .events import Events
from .steps import Windows
from .tables import Diagnostic, StepStats

EAGER, COMPILED, CUDA_GRAPHS = "eager", "compiled", "CUDA graphs"
GRAPHS_SHARE = 0.5  # of the GPU time replayed from CUDA graphs: the model runs in them
LOSS_HEAD_SHARE = 0.15  # of the GPU busy time, median over steps
_COMPILED_RANGES = ("## Call CompiledFxGraph ", "Torch-Compiled Region: ")
_GRAPH_LAUNCH = "GraphLaunch"  # cudaGraphLaunch, hipGraphLaunch and their versioned names


def gather(tl: Events, win: Windows, ev) -> None:
    """Count, inside the steps, the compiled graph calls and the GPU time replayed from CUDA graphs, into ``ev``."""
    host, dev, names = tl.host, tl.device, tl.names
    compiled = np.array([n.startswith(_COMPILED_RANGES) for n in names] or [False])[host.name]
    ev.compiled_calls += int((compiled & (win.index_of(host.start) >= 0)).sum())
    if not dev.start.size:
        return
    inside = win.index_of(dev.start) >= 0
    dur = (dev.end - dev.start) / 1000.0
    graph_launch = np.array([_GRAPH_LAUNCH in n for n in names] or [False])
    runtime = np.flatnonzero(graph_launch[host.name] & (host.corr >= 0))
    replayed = np.isin(dev.corr, host.corr[runtime]) & (dev.corr >= 0)
    ev.device_us += float(dur[inside].sum())
    ev.graph_us += float(dur[inside & replayed].sum())


def mode(ev) -> str:
    """How the model runs: EAGER, COMPILED or CUDA_GRAPHS."""
    if ev.device_us and ev.graph_us >= GRAPHS_SHARE * ev.device_us:
        return CUDA_GRAPHS
    return COMPILED if ev.compiled_calls else EAGER


def launch_advice(ev, steps: list[StepStats]) -> str:
    """What to try against a launch-bound step, for the way the model runs."""
    idle = fmt.duration(median(s.gpu_idle_us for s in steps))
    how = mode(ev)
    if how == CUDA_GRAPHS:
        return (
            f"its kernels already replay from CUDA graphs ({fmt.share(ev.graph_us / ev.device_us)} of GPU time), so "
            f"the {idle} a step the GPU waits is host work outside them: graph breaks, the optimizer step, Python "
            "between graphs; remove graph breaks, compile the optimizer step, or use larger batches."
        )
    if how == COMPILED:
        per_step = ev.compiled_calls / max(len(steps), 1)
        return (
            f"the model is compiled ({per_step:.0f} compiled regions and graph calls a step), yet the GPU waits {idle} "
            'a step for launches: compile with torch.compile(mode="reduce-overhead") (CUDA graphs replay a '
            "graph's kernels in one launch), or capture CUDA graphs by hand (torch.cuda.graph); larger batches also "
            "help."
        )
    return (
        f'the GPU waits {idle} a step for launches: fuse ops with torch.compile (mode="reduce-overhead" also '
        "replays them from CUDA graphs), or use larger batches."
    )


def loss_head(steps: list[StepStats], ev) -> list[Diagnostic]:
    """The loss head, when it takes LOSS_HEAD_SHARE of the typical step's GPU busy time."""
    head: losshead.Evidence = ev.loss_head
    timed = [s for s in steps if s.gpu_busy_us > 0]
    if not head.gpu_us or not timed:
        return []
    per_step = [head.gpu_us.get((s.rank, s.worker, s.step), 0.0) for s in timed]
    share = median(us / s.gpu_busy_us for us, s in zip(per_step, timed))
    if share < LOSS_HEAD_SHARE:
        return []
    logits = "; ".join(
        f"[{tokens}, {vocab}] in "
        + " and ".join(
            f"{losshead.dtype_name(size)} ({fmt.size(tokens * vocab * size)})" for size in sorted(sizes, reverse=True)
        )
        for (tokens, vocab), sizes in sorted(head.logits.items())
    )
    rows = ", ".join(name or "(model)" for name, _ in head.rows.most_common(3))
    return [
        Diagnostic(
            "loss_head",
            "warning",
            (
                f"The loss head takes {fmt.share(share)} of GPU time (median over {len(timed)} steps; "
                f"{fmt.duration(median(per_step))} of {fmt.duration(median(s.gpu_busy_us for s in timed))} a step; "
                f"in {rows}): the output projection writes logits {logits}, and log_softmax, the loss and their "
                "backward read and write them again. A loss in bf16, or a chunked or fused linear + cross-entropy "
                "that never writes [tokens, vocabulary] (kprof.kernels.linear_cross_entropy), removes most of it."
            ),
        )
    ]
