"""Findings: each one a sentence with its evidence (numbers from the trace) and what to try.

Thresholds are deliberately plain (idle > 30% of the step, kernels started on an idle GPU, a step
1.5x the median): a finding is a pointer to where to look, not a verdict. Shares are medians over steps, so the
first step of a window or one outlier does not decide a finding; docs/findings.md gives each rule and its measured
false-positive and detection rates.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from statistics import median

import numpy as np

from . import flops, fmt, losshead, model_findings
from .events import ANNOTATION, KERNEL, MEMCPY, OP, RUNTIME, Events
from .perstep import PerStep
from .steps import WHOLE_TRACE, Windows
from .tables import Diagnostic, RankStats, StepStats
from .tree import Tree

IDLE_SHARE = 0.30
# A kernel that starts this long after the GPU's last activity ended waited for its launch: queued kernels follow
# each other within 1-2 us (0.4-0.9 us in a CUDA graph's replay on an H100)
IDLE_GAP_US = 5.0
DATALOADER_SHARE = 0.10  # of the median step
EVIDENCE_STEPS = 8  # steps whose numbers a finding lists
SLOW_STEP_RATIO = 1.5
SLOW_STEP_SPREAD = 3.0  # ... and this many standard deviations of the worker's log step times (slow_threshold)
GREW_ROWS, GREW_SHARE = 4, 0.05  # a slow step's finding names up to 4 rows, each >= 5% of its extra time
COMM_SHARE = 0.20
OVERLAP_SHARE = 0.50
DDP_OVERLAP = (
    "DDP overlaps gradient all-reduce with backward: check bucket_cap_mb, find_unused_parameters=False, and that no "
    "synchronization sits between backward and the optimizer."
)
FSDP_OVERLAP = (
    "FSDP hides a block's all-gather behind the previous block's computation and its reduce-scatter behind the next "
    "block's backward: the table of collectives shows which one is exposed, and in which phase, and the fsdp_ "
    "findings say what to change."
)
SYNC_CALLS = frozenset(
    {
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cudaMemcpy",
        "hipStreamSynchronize",
        "hipDeviceSynchronize",
        "hipEventSynchronize",
        "hipMemcpy",
    }
)
SCALAR_READ = "aten::_local_scalar_dense"  # .item(), bool(), int() of a tensor
EVAL_LABELS = ("validation_step", "test_step", "predict_step")  # the Lightning callback's labels of an eval loop


@dataclasses.dataclass
class Evidence:
    """Counts gathered inside the step windows of every trace (added up across files)."""

    has_gpu: bool = False
    syncs: Counter = dataclasses.field(default_factory=Counter)
    sync_us: float = 0.0
    scalar_reads: int = 0  # .item()/bool()/int() that called a sync: reads of GPU tensors
    pageable_copies: int = 0
    pageable_bytes: int = 0
    pageable_us: float = 0.0
    kernels: int = 0
    kernel_us: float = 0.0
    waited_kernels: int = 0  # kernels that started on an idle GPU (IDLE_GAP_US after its last activity)
    files_without_steps: list[str] = dataclasses.field(default_factory=list)
    eval_calls: Counter = dataclasses.field(default_factory=Counter)  # (rank, worker, step) -> eval-loop labels in it
    matmul_flops: Counter = dataclasses.field(default_factory=Counter)  # of the steps' matrix products, by dtype
    gpus: Counter = dataclasses.field(default_factory=Counter)  # the GPU each file's trace names -> files
    compiled_calls: int = 0  # calls of compiled graphs (torch.compile) in the steps
    device_us: float = 0.0  # GPU activity in the steps
    graph_us: float = 0.0  # of which replayed from CUDA graphs (launched by cudaGraphLaunch)
    loss_head: losshead.Evidence = dataclasses.field(default_factory=losshead.Evidence)

    def add(self, other: Evidence) -> None:
        for f in dataclasses.fields(self):
            if f.name == "has_gpu":
                self.has_gpu |= other.has_gpu
            elif f.name == "loss_head":
                self.loss_head.add(other.loss_head)
            else:
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def gather(tl: Events, win: Windows, tree: Tree, attributed: object = None) -> Evidence:
    """Evidence from one trace's events that fall inside its steps (`tree`: their host call tree; `attributed`: its
    ``attribution.FileAttribution``, for the loss head)."""
    host, dev = tl.host, tl.device
    names = tl.names
    ev = Evidence(has_gpu=bool(dev.start.size))
    if win.number.size == 1 and win.number[0] == WHOLE_TRACE:
        ev.files_without_steps.append(tl.source.path.name)
    host_in = win.index_of(host.start) >= 0
    sync_id = [k for k, n in enumerate(names) if n in SYNC_CALLS]
    is_sync = host_in & (host.kind == RUNTIME) & np.isin(host.name, sync_id)
    ev.syncs = Counter(names[k] for k in host.name[is_sync].tolist())
    ev.sync_us = float((host.end - host.start)[is_sync].sum()) / 1000.0
    if SCALAR_READ in names:  # a read of a CPU tensor (AdamW's step counts) calls no sync: it waits for nothing
        is_read = host_in & (host.kind == OP) & (host.name == names.index(SCALAR_READ))
        ev.scalar_reads = int(np.isin(np.flatnonzero(is_read), tree.parent[is_sync]).sum())
    dev_in = win.index_of(dev.start) >= 0
    dur = (dev.end - dev.start) / 1000.0
    pageable = dev_in & (dev.kind == MEMCPY) & np.isin(dev.name, [k for k, n in enumerate(names) if "Pageable" in n])
    ev.pageable_copies, ev.pageable_bytes = int(pageable.sum()), int(dev.nbytes[pageable].sum())
    ev.pageable_us = float(dur[pageable].sum())
    kernel = dev_in & (dev.kind == KERNEL)
    ev.kernels, ev.kernel_us = int(kernel.sum()), float(dur[kernel].sum())
    ev.waited_kernels = int((kernel & (idle_before(tl) >= IDLE_GAP_US)).sum())
    eval_ids = [k for k, n in enumerate(names) if n in EVAL_LABELS]
    window = win.index_of(host.start)
    in_eval = (window >= 0) & (host.kind == ANNOTATION) & np.isin(host.name, eval_ids)
    who = (tl.source.rank, tl.source.worker)
    ev.eval_calls = Counter((*who, int(win.number[w])) for w in window[in_eval].tolist())
    if tl.shapes:
        ev.matmul_flops = flops.matmul_flops(
            (names, tl.shapes, tl.types), host.name[host_in], host.shape[host_in], host.types[host_in]
        )
    if ev.has_gpu and tl.source.device:
        ev.gpus[tl.source.device] += 1
    model_findings.gather(tl, win, ev)
    if attributed is not None:
        ev.loss_head = attributed.loss_head
    return ev


def idle_before(tl: Events) -> np.ndarray:
    """Per device event: how long its GPU (all of its streams) had been idle when it started, in us; 0 for a GPU's
    first activity in the trace."""
    dev = tl.device
    devices = {d: k for k, d in enumerate(dict.fromkeys(d for d, _ in tl.streams))}
    gpu = np.array([devices[d] for d, _ in tl.streams] or [0], np.int64)[dev.stream]
    out = np.zeros(dev.start.size)
    for g in np.unique(gpu).tolist():
        mine = np.flatnonzero(gpu == g)
        mine = mine[np.argsort(dev.start[mine], kind="stable")]
        ended = np.maximum.accumulate(dev.end[mine])
        out[mine[1:]] = np.maximum(dev.start[mine[1:]] - ended[:-1], 0) / 1000.0
    return out


def diagnose(
    steps: list[StepStats], ranks: list[RankStats], ev: Evidence, per_step: PerStep, fsdp: bool = False
) -> list[Diagnostic]:
    """The findings of one run's steps, GPU and ranks' communication (`fsdp`: the trace has FSDP's labels), warnings
    first."""
    found = []
    wall = sum(s.wall_us for s in steps)
    if ev.has_gpu and steps:
        found += _gpu_findings(steps, wall, ev, per_step)
    found += model_findings.loss_head(steps, ev) if ev.has_gpu else []
    found += _data_loading(steps)
    found += _slow_steps(steps, per_step, ev.eval_calls)
    if len(ranks) > 1 and all(r.rank is not None for r in ranks):
        found += _rank_findings(ranks, fsdp)
    if not ev.has_gpu:
        found.append(
            Diagnostic(
                "no_gpu",
                "info",
                (
                    "No GPU activity in the trace (a CPU-only run, or ProfilerActivity.CUDA not enabled): "
                    "GPU columns are left out and compute means host operators."
                ),
            )
        )
    if ev.files_without_steps:
        found.append(
            Diagnostic(
                "no_steps",
                "info",
                (
                    f"No ProfilerStep# ranges in {', '.join(ev.files_without_steps[:3])}"
                    f"{' and others' if len(ev.files_without_steps) > 3 else ''}: each such trace is one step "
                    "covering all of it; "
                    "call prof.step() (or Session.step()) once per iteration for per-step numbers."
                ),
            )
        )
    return sorted(found, key=lambda d: d.severity != "warning")


def _data_loading(steps: list[StepStats]) -> list[Diagnostic]:
    """Data loading that takes DATALOADER_SHARE of the typical step: the median share over steps, so that a slow
    first batch of each window (a fresh iterator, the profiler starting) or one outlier does not decide it."""
    timed = [s for s in steps if s.wall_us > 0]
    if not timed or median(s.dataloader_us / s.wall_us for s in timed) < DATALOADER_SHARE:
        return []
    share = median(s.dataloader_us / s.wall_us for s in timed)
    shown = ", ".join(f"{s.step}: {fmt.duration(s.dataloader_us)}" for s in timed[:EVIDENCE_STEPS])
    more = f" and {len(timed) - EVIDENCE_STEPS} more" if len(timed) > EVIDENCE_STEPS else ""
    return [
        Diagnostic(
            "dataloader",
            "warning",
            (
                f"Data loading takes {fmt.share(share)} of a step (median over {len(timed)} steps; "
                f"{fmt.duration(median(s.dataloader_us for s in timed))} per step; by step {shown}{more}): the "
                "training loop "
                "waits for batches; raise DataLoader num_workers, set persistent_workers=True and pin_memory=True, or "
                "move "
                "decoding/augmentation off the main process."
            ),
        )
    ]


def _gpu_findings(steps: list[StepStats], wall: float, ev: Evidence, per_step: PerStep) -> list[Diagnostic]:
    found = []
    idle_share = median(s.gpu_idle_us / s.wall_us for s in steps if s.wall_us) if wall else 0.0
    if idle_share > IDLE_SHARE:
        host = sum(s.cpu_only_us for s in steps) / wall
        found.append(
            Diagnostic(
                "gpu_idle",
                "warning",
                (
                    f"The GPU is idle {fmt.share(idle_share)} of a step (median over {len(steps)} steps; host-only "
                    "work "
                    f"{fmt.share(host)} of step time): it waits for the host; check the input pipeline and host-side "
                    "work "
                    "between kernels (Python overhead, synchronizations, logging)."
                ),
            )
        )
    if ev.kernels >= 100 and ev.waited_kernels / ev.kernels >= 0.5 and idle_share > IDLE_SHARE * 2 / 3:
        found.append(
            Diagnostic(
                "launch_bound",
                "warning",
                (
                    f"Launch-bound: {fmt.share(ev.waited_kernels / ev.kernels)} of {ev.kernels} kernels started on "
                    f"an idle GPU, after the previous one ended (they ran a mean "
                    f"{fmt.duration(ev.kernel_us / ev.kernels)}), and the GPU is idle {fmt.share(idle_share)} of a "
                    f"step: the host cannot launch kernels fast enough; {model_findings.launch_advice(ev, steps)}"
                ),
            )
        )
    if ev.pageable_copies:
        found.append(
            Diagnostic(
                "pageable_memcpy",
                "warning",
                (
                    f"{ev.pageable_copies} host<->device copies from pageable memory ({fmt.size(ev.pageable_bytes)}, "
                    f"{fmt.duration(ev.pageable_us)} in {len(steps)} steps): they are synchronous and slower; use "
                    "DataLoader(pin_memory=True) or tensor.pin_memory(), then .to(device, non_blocking=True)."
                ),
            )
        )
    found += _syncs(steps, ev, per_step)
    return found


def _syncs(steps: list[StepStats], ev: Evidence, per_step: PerStep) -> list[Diagnostic]:
    """Host-GPU synchronizations in the typical step (the median step has one): a sync in one step, such as a loss
    logged every N steps, is not a finding."""
    syncing = [
        i for i, (kind, name) in enumerate(zip(per_step.kind, per_step.name)) if kind == "op" and name in SYNC_CALLS
    ]
    counts = per_step.calls[syncing].max(axis=0) if syncing else np.zeros(len(per_step.steps))
    if not counts.size or np.median(counts) < 1:
        return []
    n_sync = sum(ev.syncs.values())
    calls = ", ".join(f"{name} x{count}" for name, count in ev.syncs.most_common())
    shown = ", ".join(f"{s.step}: {c:g}" for s, c in list(zip(per_step.steps, counts.tolist()))[:EVIDENCE_STEPS])
    return [
        Diagnostic(
            "sync",
            "warning",
            (
                f"{n_sync / len(steps):.1f} host-GPU synchronizations per step "
                f"({calls}; {ev.scalar_reads} in reads of GPU tensors by .item()/bool()/int(), "
                f"{fmt.duration(ev.sync_us)} blocked; by step {shown}): the host stalls until the GPU catches up; "
                "keep values "
                "on the GPU, log every N steps, avoid .item()/.cpu()/print(tensor) inside the step."
            ),
        )
    ]


def slow_threshold(walls: np.ndarray) -> float:
    """How many times its worker's median a step must take to be slow: SLOW_STEP_RATIO, or more where the steps
    vary more: SLOW_STEP_SPREAD standard deviations of the log step times, the longest and the shortest step left out
    of that spread (the one being judged, and a window's stub of a last step). On a noisy machine a 1.5x step is
    ordinary."""
    logs = np.sort(np.log(walls))[1:-1]
    sigma = float(np.std(logs, ddof=1)) if logs.size > 1 else 0.0
    return max(SLOW_STEP_RATIO, math.exp(SLOW_STEP_SPREAD * sigma))


def _slow_steps(steps: list[StepStats], per_step: PerStep, eval_calls: Counter) -> list[Diagnostic]:
    """Steps slower than ``slow_threshold`` x the median step of the same rank/worker; one finding for the worst,
    with what grew in it against that worker's other steps.

    A training step that ran an evaluation loop inside it (Lightning validates mid-epoch inside the training batch
    that ends the interval) is named as such: its time is evaluation, not a slow training step."""
    workers: dict[tuple[int | None, str], list[StepStats]] = {}
    for s in steps:
        workers.setdefault((s.rank, s.worker), []).append(s)
    slow = []  # (ratio, step, its worker's median, its threshold)
    for mine in workers.values():
        walls = np.array([s.wall_us for s in mine])
        typical = float(np.median(walls))
        if len(mine) >= 3 and typical > 0:  # steps of zero length (a coarse clock) have no "slow"
            limit = slow_threshold(walls[walls > 0])
            slow += [(s.wall_us / typical, s, typical, limit) for s in mine if s.wall_us > limit * typical]
    if not slow:
        return []
    ratio, worst, typical, limit = max(slow, key=lambda x: x[0])
    where = "" if len(workers) == 1 else f" on rank {worst.rank}" if worst.rank is not None else f" on {worst.worker}"
    more = ""
    if len(slow) > 1:
        spread = len({(s.rank, s.worker) for _, s, _, _ in slow})
        more = f" ({len(slow)} steps above {limit:.2g}x" + (f" on {spread} ranks/workers)" if spread > 1 else ")")
    head = (
        f"Step {worst.step}{where} took {fmt.duration(worst.wall_us)}, {ratio:.1f}x the median {fmt.duration(typical)}"
    )
    calls = eval_calls[(worst.rank, worst.worker, worst.step)]
    if calls:
        return [
            Diagnostic(
                "eval_in_step",
                "info",
                (
                    f"{head}{more}: it ran an evaluation loop ({calls} validation/test/predict steps) inside the "
                    "training "
                    "step, so that time is evaluation, not a slow training step; profile it on its own with "
                    "ProfilerCallback(stages=('validate',)) or trainer.validate()."
                ),
            )
        ]
    normal = [s for s in workers[(worst.rank, worst.worker)] if s.wall_us <= limit * typical]
    return [
        Diagnostic(
            "slow_step",
            "warning",
            (
                f"{head}{more}. {_grew_in(per_step, worst, normal)} Look at what ran in it (first-iteration warm-up, "
                "allocator growth, garbage collection, checkpointing, recompilation)."
            ),
        )
    ]


def _grew_in(per_step: PerStep, slow: StepStats, normal: list[StepStats]) -> str:
    """What took longer in the `slow` step than the median of the `normal` ones: the rows behind its extra time."""
    extra = slow.wall_us - median(s.wall_us for s in normal)
    *cols, column = per_step.columns([*normal, slow])
    grew = per_step.time_us[:, column] - np.median(per_step.time_us[:, cols], axis=1)
    top = [i for i in np.argsort(-grew, kind="stable")[:GREW_ROWS].tolist() if grew[i] >= GREW_SHARE * extra]
    against = f"against the median of the {len(normal)} other step{'s' * (len(normal) != 1)}"
    if not top:
        return (
            f"No operator, label or GPU activity grew by {fmt.share(GREW_SHARE)} of its extra "
            f"{fmt.duration(extra)} ({against}): the time went between them (Python, GC, I/O outside torch ops)."
        )
    typical_calls = np.median(per_step.calls[:, cols], axis=1)

    def item(i: int) -> str:
        calls, usual = float(per_step.calls[i, column]), float(typical_calls[i])
        count = f" ({calls:g} call{'s' * (calls != 1)}, usually {usual:g})" if calls != usual else ""
        return f"{fmt.row_label(per_step.kind[i], per_step.name[i])} +{fmt.duration(grew[i])}{count}"

    return f"What grew in it, {against} (extra {fmt.duration(extra)}): {', '.join(item(i) for i in top)}."


def _rank_findings(ranks: list[RankStats], fsdp: bool) -> list[Diagnostic]:
    found = []
    worst = max(ranks, key=lambda r: r.comm_share)
    mean_share = sum(r.comm_share for r in ranks) / len(ranks)
    if mean_share >= COMM_SHARE:
        found.append(
            Diagnostic(
                "comm_share",
                "warning",
                (
                    f"Communication takes {fmt.share(mean_share)} of step time on average (rank {worst.rank}: "
                    f"{fmt.share(worst.comm_share)}); {fmt.share(1 - mean_share)} is left for everything else. Grow "
                    "the "
                    "per-rank batch, use gradient accumulation (no_sync), or compress gradients."
                ),
            )
        )
    comm = sum(r.comm_us for r in ranks)
    if comm and mean_share >= COMM_SHARE / 4:
        overlap = sum(r.overlap_us for r in ranks) / comm
        if overlap < OVERLAP_SHARE:
            exposed = sum(r.exposed_comm_us for r in ranks) / len(ranks)
            found.append(
                Diagnostic(
                    "overlap",
                    "warning",
                    (
                        f"Only {fmt.share(overlap)} of communication overlaps computation; {fmt.duration(exposed)} "
                        f"per step per rank is exposed. {FSDP_OVERLAP if fsdp else DDP_OVERLAP}"
                    ),
                )
            )
    return found
