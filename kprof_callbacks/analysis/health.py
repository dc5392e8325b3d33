"""Capture health: what a report checks in its own input before its findings, one line each, with what it affects.

A profiler that drops records says nothing: a full CUPTI buffer leaves launches without their kernels, a clock
conversion bug puts events far outside the trace, a broken clock writes negative durations, a run's last window
stops mid-step, a rank's trace never lands, two hosts' clocks drift apart. Each of these skews what the tables say
without looking wrong, so every summary and every diff says so first. The lines are findings of kinds starting
``capture_`` (``is_capture``); the reports show them at the top, apart from the other findings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from . import fmt, ranks
from .events import RUNTIME, Events, is_step_name
from .steps import StepTimes
from .tables import Diagnostic

PREFIX = "capture_"
LAUNCHES = frozenset(
    {
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cudaLaunchCooperativeKernel",
        "cudaGraphLaunch",
        "cudaMemcpyAsync",
        "cudaMemsetAsync",
        "hipLaunchKernel",
        "hipExtLaunchKernel",
        "hipMemcpyAsync",
        "hipMemsetAsync",
    }
)
"""Runtime calls that put GPU work on a stream: each one's correlation id is on the activity it started."""
SKEW_US = 50.0  # ends of one collective on two hosts, clocks aligned, farther apart than this: a clock that drifts
MIN_SPAN_NS = 1_000_000_000  # events farther outside the steps than the steps' span (at least 1 s) are out of range


@dataclasses.dataclass(frozen=True)
class FileHealth:
    """What one trace file's records say about their own capture."""

    file: str
    rank: int | None
    world_size: int | None
    launches: int = 0  # launch calls inside the steps
    launches_without_activity: int = 0  # of which no GPU activity carries the correlation id
    activities: int = 0
    activities_without_launch: int = 0  # GPU activities whose correlation id no runtime call has
    clipped: int = 0  # events with a negative duration, clipped to 0
    out_of_range: int = 0  # events farther outside the steps than their span
    cut_short: tuple[int, int] | None = None  # (first, last) step of a window stopped mid-step


def is_capture(d: Diagnostic) -> bool:
    """Whether a finding is a capture-health line (shown at the top, apart from the findings)."""
    return d.kind.startswith(PREFIX)


def split(found: Sequence[Diagnostic]) -> tuple[list[Diagnostic], list[Diagnostic]]:
    """``(capture-health lines, the other findings)`` of ``found``, in its order."""
    return [d for d in found if is_capture(d)], [d for d in found if not is_capture(d)]


def gather(tl: Events, times: StepTimes, clipped: int, world_size: int | None) -> FileHealth:
    """The capture health of one trace file (``clipped``: its negative durations; ``world_size`` as it says)."""
    host, dev = tl.host, tl.device
    launch_names = np.array([n in LAUNCHES for n in tl.names] or [False], bool)
    in_steps = times.windows.index_of(host.start) >= 0
    launching = (host.kind == RUNTIME) & (host.corr >= 0) & launch_names[host.name] & in_steps
    ran = np.isin(host.corr[launching], dev.corr)
    runtime_corr = host.corr[(host.kind == RUNTIME) & (host.corr >= 0)]
    linked = dev.corr >= 0
    steps_named = int(np.array([is_step_name(n) for n in tl.names] or [False], bool)[host.name].sum())
    cut = None
    if steps_named > tl.steps.shape[0] and tl.steps.shape[0]:  # the last step range held nothing: stopped mid-step
        cut = (int(tl.steps[0, 0]), int(tl.steps[-1, 0]))
    return FileHealth(
        file=tl.source.path.name,
        rank=tl.source.rank,
        world_size=world_size,
        launches=int(launching.sum()),
        launches_without_activity=int((~ran).sum()),
        activities=int(dev.start.size),
        activities_without_launch=int((linked & ~np.isin(dev.corr, runtime_corr)).sum()) if runtime_corr.size else 0,
        clipped=clipped,
        out_of_range=_out_of_range(tl),
        cut_short=cut,
    )


def _out_of_range(tl: Events) -> int:
    """Events that end more than the steps' span (at least 1 s) before the first step or start as far after the last:
    a clock conversion gone wrong, not work of the run."""
    if not tl.steps.shape[0]:
        return 0
    lo, hi = int(tl.steps[:, 1].min()), int(tl.steps[:, 2].max())
    margin = max(hi - lo, MIN_SPAN_NS)
    starts = np.concatenate([tl.host.start, tl.device.start])
    ends = np.concatenate([tl.host.end, tl.device.end])
    return int(((ends < lo - margin) | (starts > hi + margin)).sum())


def _files(items: Sequence[FileHealth], count: str) -> str:
    named = [h.file for h in items if getattr(h, count)]
    return ", ".join(named[:3]) + (f" and {len(named) - 3} more" if len(named) > 3 else "")


def _line(kind: str, message: str) -> Diagnostic:
    return Diagnostic(PREFIX + kind, "warning", message)


def check(files: Sequence[FileHealth], workers: Sequence[ranks.Worker]) -> list[Diagnostic]:
    """The capture-health lines of a run, from its files' health and its ranks' collectives."""
    found = []
    launches, dropped = sum(h.launches for h in files), sum(h.launches_without_activity for h in files)
    if dropped:
        text = (
            f"Capture: {dropped} of {launches} GPU launches in the steps have no GPU activity in the trace "
            f"({_files(files, 'launches_without_activity')}): the profiler dropped their kernels or copies (a full "
            "activity buffer?), so GPU time, the kernel table and GPU idle undercount the steps."
        )
        found.append(_line("dropped_activities", text))
    activities, orphans = sum(h.activities for h in files), sum(h.activities_without_launch for h in files)
    if orphans:
        text = (
            f"Capture: {orphans} of {activities} GPU activities have no launch in the trace "
            f"({_files(files, 'activities_without_launch')}): the host records were dropped, so these count in GPU "
            "time but not under the operators that launched them."
        )
        found.append(_line("activities_without_launch", text))
    clipped = sum(h.clipped for h in files)
    if clipped:
        text = (
            f"Capture: {clipped} events had a negative duration ({_files(files, 'clipped')}), clipped to 0: a "
            "broken clock; their time is missing from the tables."
        )
        found.append(_line("negative_durations", text))
    far = sum(h.out_of_range for h in files)
    if far:
        text = (
            f"Capture: {far} events lie farther outside the steps than the steps' whole span "
            f"({_files(files, 'out_of_range')}): timestamps gone wrong; they are in no step."
        )
        found.append(_line("out_of_range", text))
    found += [_cut_short(h) for h in files if h.cut_short]
    return found + _missing_ranks(files) + _clock_skew(workers)


def _cut_short(h: FileHealth) -> Diagnostic:
    first, last = h.cut_short
    text = (
        f"Capture: the window of steps {fmt.ranges(range(first, last + 1))} ({h.file}) was cut short: profiling "
        "stopped inside it (the loop ended or raised), so it holds fewer steps than asked for and its unfinished "
        "last step is left out."
    )
    return _line("cut_short", text)


def _missing_ranks(files: Sequence[FileHealth]) -> list[Diagnostic]:
    present = {h.rank for h in files if h.rank is not None}
    if not present:
        return []
    world = max([h.world_size or 0 for h in files] + [max(present) + 1])
    missing = sorted(set(range(world)) - present)
    if not missing:
        return []
    ranks_ = f"rank{'s' * (len(missing) > 1)} {fmt.ranges(missing)} of {world}"
    return [
        _line(
            "missing_ranks",
            (
                f"Capture: {ranks_} wrote no trace here: the ranks table, the slowest rank per step and the waits in "
                "collectives cover the others only."
            ),
        )
    ]


def _clock_skew(workers: Sequence[ranks.Worker]) -> list[Diagnostic]:
    """Hosts whose clock still disagrees with the reference host's after the alignment by the median offset: the
    ends of one collective (which finish together) spread wider than SKEW_US."""
    matched = ranks.match(list(workers))  # the matching the alignment itself uses
    if matched is None or len(set(matched.hosts)) < 2:
        return []
    offsets = ranks.clock_offsets(matched)
    ref = int(np.argmin(matched.ranks))
    residual = np.abs(matched.end - offsets[:, None] - matched.end[ref])
    found = []
    for i, rank in enumerate(matched.ranks):
        left = residual[i][~np.isnan(residual[i])]
        if matched.hosts[i] == matched.hosts[ref] or not left.size:
            continue
        worst, offset = float(np.percentile(left, 90)) / 1000.0, float(offsets[i]) / 1000.0
        if worst > SKEW_US:
            found.append(
                _line(
                    "clock_skew",
                    (
                        f"Capture: rank {rank}'s host clock still differs from rank {matched.ranks[ref]}'s by up to "
                        f"{fmt.duration(worst)} after aligning them by the median offset ({fmt.duration(offset)}): the "
                        "clocks drift, so waits and arrivals between ranks are uncertain by that much."
                    ),
                )
            )
    return found
