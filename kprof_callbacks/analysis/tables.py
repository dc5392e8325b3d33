"""Row types of the Summary tables. Times are microseconds (as in the trace and key_averages), memory bytes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

SORT_KEYS = ("cuda", "cpu", "memory")  # what the operator table can be sorted by: self CUDA time, self CPU time, memory


@dataclasses.dataclass(frozen=True)
class StepStats:
    """One profiled step (a `ProfilerStep#N` range, extended to the end of the GPU work it launched)."""

    step: int
    rank: int | None
    worker: str
    wall_us: float
    gpu_busy_us: float  # union of kernels, copies and sets on all streams
    gpu_idle_us: float
    kernel_us: float  # compute kernels (NCCL kernels are in comm_us)
    memcpy_us: float
    memset_us: float
    comm_us: float  # NCCL kernels, or gloo collectives on the host
    cpu_only_us: float  # host ops running while the GPU is idle
    dataloader_us: float
    peak_memory: int  # bytes allocated at the peak (CUDA if recorded, else host); 0 if not recorded


@dataclasses.dataclass(frozen=True)
class OpStats:
    """A host operator (aten op, runtime call), aggregated like key_averages()."""

    name: str
    input_shapes: str  # "" unless grouped by input shape
    calls: int
    cpu_total_us: float
    self_cpu_us: float
    cuda_total_us: float  # GPU time of kernels launched by it and its children
    self_cuda_us: float
    cpu_memory: int
    self_cpu_memory: int
    cuda_memory: int
    self_cuda_memory: int


@dataclasses.dataclass(frozen=True)
class KernelStats:
    """A GPU activity name: kernel, memcpy, memset or NCCL kernel."""

    name: str
    kind: str
    count: int
    total_us: float
    mean_us: float
    max_us: float


@dataclasses.dataclass(frozen=True)
class LabelStats:
    """A record_function label (`region()`, Lightning hooks, user ranges)."""

    name: str
    count: int
    total_us: float
    mean_us: float
    cuda_total_us: float  # GPU time of kernels launched inside it
    step_share: float  # total / summed step wall time
    contains: tuple[str, ...] = ()  # labels that ran inside it: their time is in its total too


@dataclasses.dataclass(frozen=True)
class RankStats:
    """One rank (or worker) of a run: means per step of compute, communication and their overlap."""

    rank: int | None
    worker: str
    steps: int
    step_us: float
    compute_us: float  # GPU compute kernels, or host ops on a CPU-only run
    comm_us: float
    overlap_us: float  # communication that runs while compute runs
    exposed_comm_us: float  # communication nothing overlaps: the step waits for it
    collectives: int = 0  # collectives matched with other ranks (the n-th of its kind in a step, on every rank)
    waited_us: float = 0.0  # in them, waiting for the last rank to arrive (clocks aligned; mean per step)
    late_us: float = 0.0  # the others' wait for it where it arrived last (its lead on their median; mean per step)
    clock_offset_us: float = 0.0  # its host's clock minus rank 0's host's, from the ends of shared collectives
    host_only_us: float = 0.0  # host operators running while its GPU is idle (0 in a trace without GPU activity)

    @property
    def comm_share(self) -> float:
        return self.comm_us / self.step_us if self.step_us else 0.0

    @property
    def overlap_share(self) -> float:
        return self.overlap_us / self.comm_us if self.comm_us else 0.0


@dataclasses.dataclass(frozen=True)
class CommStats:
    """One collective (all-gather, reduce-scatter, all-reduce, ...) on one rank in one step, split by process group
    (the levels of a device mesh: HSDP's `mesh_shard` and `mesh_replicate`) and FSDP phase."""

    rank: int | None
    worker: str
    step: int
    collective: str
    phase: str  # "forward" or "backward" (FSDP's labels say which), "" where a trace does not say
    calls: int
    total_us: float  # time it ran (a union: two at once count once)
    overlap_us: float  # of which computation ran at the same time, on any stream or thread
    exposed_us: float  # of which nothing computed: the step waited for it
    group: str = ""  # its process group (`mesh_shard`, `default_pg`), as the trace names it; "" where it does not
    group_size: int = 0  # ranks in that group; 0 where the trace does not say


@dataclasses.dataclass(frozen=True)
class FsdpStep:
    """FSDP's parameter memory and the edges of one step on one rank (traces with FSDP's labels)."""

    rank: int | None
    worker: str
    world_size: int | None  # ranks in the job, as the trace says
    step: int
    groups: int  # FSDP parameter groups that all-gathered (one per fully_shard call that ran)
    first_gather_exposed_us: float  # exposed part of the step's first all-gather (start of forward)
    last_scatter_exposed_us: float  # exposed part of the step's last reduce-scatter (end of backward)
    gather_scatter_concurrent_us: float  # all-gather and reduce-scatter running at the same time
    gather_queued_us: float  # all-gathers waiting for a reduce-scatter to end before they start (one communicator)
    unsharded_total: int  # bytes of the unsharded parameters (as all-gathered) of the groups that all-gathered in
    # the step or stayed unsharded into it; 0 without profile_memory
    unsharded_at_peak: int  # of which alive at the step's memory peak
    groups_at_peak: int  # groups whose unsharded parameters were alive then
    largest_group: int  # bytes of the largest group's unsharded parameters
    peak_memory: int  # bytes allocated at that peak


@dataclasses.dataclass(frozen=True)
class StepSkew:
    """Across ranks, one step: which rank computed longest and by how much."""

    step: int
    slowest_rank: int
    slowest_compute_us: float
    median_compute_us: float  # median over the other ranks
    lag_us: float  # slowest minus others


@dataclasses.dataclass(frozen=True)
class Diagnostic:
    """A finding: a sentence with the evidence and a suggestion."""

    kind: str
    severity: str  # "warning" or "info"
    message: str


@dataclasses.dataclass(frozen=True)
class Problem:
    """A file that could not be summarized, and why; the rest of the run is summarized without it."""

    path: Path
    reason: str
    transient: bool = dataclasses.field(default=False, compare=False)  # the process reading it died: try again later

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"
