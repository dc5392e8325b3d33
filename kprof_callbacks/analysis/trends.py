"""Findings over every step of a run, from the scalars the session wrote (``series``): what profiling itself cost,
memory that grows from step to step, and the throughput / model FLOPs utilization the program reached. With a CUDA
memory snapshot (``memory_snapshot=True``), a growth finding names the allocation sites that hold the memory.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from .. import layout, peaks
from . import fmt
from .growth import Growth, growth
from .series import Series
from .snapshot import summaries
from .tables import Diagnostic

_LEAK_HINT = (
    "something is kept from step to step: a list of tensors, a loss kept with its graph (log loss.item() "
    "or loss.detach()), a cache that never evicts"
)
_SITES = 3  # allocation sites named in a growth finding


def findings(
    series: dict[str, dict[str, Series]],
    snapshots: list[Path],
    matmul_flops: Counter | None = None,
    profiled_us: float = 0.0,
    profiled_steps: int = 0,
    window_ends: dict[str, list[int]] | None = None,
    gpu: str = "",
) -> list[Diagnostic]:
    """Profiling's own cost and memory growth per worker (CUDA allocated, else the process's RSS), throughput / MFU
    from the FLOPs the program gave, and from the matrix products of the profiled steps (``matmul_flops`` by dtype in
    ``profiled_steps`` steps that took ``profiled_us``, on the ``gpu`` the traces name). ``window_ends``: per worker,
    the last step of each trace."""
    found = []
    many = len(series) > 1
    for worker, tags in series.items():
        where = f" on {worker}" if many else ""
        if layout.PROFILER_TAG in tags:
            found.append(_cost_finding(tags, (window_ends or {}).get(worker, []), where))
        for key, what in (("allocated", "CUDA memory allocated"), ("rss", "the process's resident memory")):
            points = tags.get(layout.MEMORY_TAGS[key])
            trend = growth(points.steps, points.values) if points is not None else None
            if trend is not None:
                found.append(_growth_finding(trend, what + where, snapshots if key == "allocated" else []))
                break
    found += _mfu_findings(series)
    by_dtype = matmul_flops or Counter()
    total = sum(by_dtype.values())
    if total and profiled_us and profiled_steps:
        peak, how = _matmul_peak(series, by_dtype, gpu)
        found.append(_matmul_finding(total / profiled_steps, total / profiled_us / 1e6, peak, how))
    return found


def _cost_finding(tags: dict[str, Series], window_ends: list[int], where: str) -> Diagnostic:
    """What kprof and torch.profiler cost the training thread: in all, and at the end of each window."""
    own, step = tags[layout.PROFILER_TAG], tags.get(layout.STEP_TIME_TAG)
    total_us = float(own.values.sum()) * 1e3
    wall = f" ({fmt.share(total_us / (total_us + float(step.values.sum()) * 1e3))} of the wall time)" if step else ""
    ends = own.values[np.isin(own.steps, window_ends)] * 1e3
    windows = (
        f"; a window cost {fmt.duration(float(np.median(ends)))} at its end (median of {ends.size}: torch "
        "stopping its profiler, the hand-off to the trace writer)"
        if ends.size
        else ""
    )
    export = tags.get(layout.AFTER_WINDOW_TAG)
    if export is not None and export.values.sum() > 0:
        windows += (
            f"; the steps right after its windows took {fmt.duration(float(export.values.sum()) * 1e3)} more than "
            "the steps before them while the traces were exported (kprof/after_window_ms, also left out)"
        )
    return Diagnostic(
        "profiler_cost",
        "info",
        (
            f"Profiling cost the training thread {fmt.duration(total_us)} over {own.steps.size} steps{where}{wall}"
            f"{windows}. kprof/step_time_ms and every finding leave it out (kprof/profiler_ms has it per step)."
        ),
    )


def _peak(series: dict[str, dict[str, Series]]) -> float | None:
    """The dense peak the session measured MFU against (written once, at step 0), if it knew one."""
    return next((float(tags[layout.PEAK_TAG].values[0]) for tags in series.values() if layout.PEAK_TAG in tags), None)


def _matmul_peak(series: dict[str, dict[str, Series]], by_dtype: Counter, gpu: str) -> tuple[float | None, str]:
    """The dense peak to hold the matrix products against, and where it came from ("" for the one the session
    recorded), or why there is none: else the peak of the GPU the trace names in the products' dtype (one dtype
    holding 99% of their FLOPs)."""
    session = _peak(series)
    if session:
        return session, ""
    dtype, flops = by_dtype.most_common(1)[0]
    if not gpu or not dtype or flops < 0.99 * sum(by_dtype.values()):
        return None, (
            "; no dense peak to give MFU against: kprof.session records one for the GPUs in kprof's table, and "
            "peak_tflops= (and mfu_dtype=) for others"
        )
    if dtype == "fp32":
        return None, (
            f"; fp32 products on the {gpu} run at its fp32 peak, or at its TF32 peak where TF32 is allowed "
            "(torch.backends.cuda.matmul.allow_tf32), which the trace does not say: pass peak_tflops= to kprof.session "
            "for MFU"
        )
    peak = peaks.peak_tflops(gpu, dtype)
    if peak is None:
        return None, f"; the {gpu} is not in kprof's table of peaks: pass peak_tflops= to kprof.session for MFU"
    return peak, f", the {dtype} dense peak of the {gpu} the trace names"


def _matmul_finding(per_step: float, tflops: float, peak: float | None, how: str) -> Diagnostic:
    """``how``: where a ``peak`` came from ("" for the session's), or why there is none."""
    mfu = how
    if peak:
        mfu = f", {fmt.share(tflops / peak)} of {_peak_text(peak)} TFLOP/s{how or ', the dense peak'}"
    return Diagnostic(
        "matmul_flops",
        "info",
        (
            f"Matrix products: {per_step:.4g} FLOP per profiled step, {tflops:.3g} TFLOP/s{mfu} (counted from the "
            "recorded input shapes of mm/addmm/bmm/baddbmm, as torch's with_flops counts them; attention and "
            "convolutions are not counted)."
        ),
    )


def _growth_finding(trend: Growth, what: str, snapshots: list[Path]) -> Diagnostic:
    sites = growing_sites(snapshots)
    named = (
        f" Allocation sites holding memory allocated after warm-up (memory snapshot): {sites}."
        if sites
        else " Profile with memory_snapshot=True to have the allocation sites named."
        if not snapshots
        else ""
    )
    if trend.mb_per_step >= 0.01:
        rate, ci = f"{trend.mb_per_step:.2f} MB", f"{trend.low:.2f}-{trend.high:.2f}"
    else:  # a slow leak over a long run: bytes, not "0.00 MB"
        rate, ci = fmt.size(trend.mb_per_step * 2**20), f"{fmt.size(trend.low * 2**20)}-{fmt.size(trend.high * 2**20)}"
    return Diagnostic(
        "memory_growth",
        "warning",
        (
            f"Memory grows {rate} per step over steps {trend.first}-{trend.last} ({what}; Theil-Sen slope, 95% CI "
            f"{ci}; "
            f"{trend.total_mb:.0f} MB in all): {_LEAK_HINT}.{named}"
        ),
    )


def _mfu_findings(series: dict[str, dict[str, Series]]) -> list[Diagnostic]:
    rates = [tags[layout.TFLOPS_TAG] for tags in series.values() if layout.TFLOPS_TAG in tags]
    if not rates:
        return []
    tflops = float(np.median(np.concatenate([r.values for r in rates])))
    steps = np.concatenate([r.steps for r in rates])
    span = f"median over steps {steps.min()}-{steps.max()}"
    mfu = [tags[layout.MFU_TAG].values for tags in series.values() if layout.MFU_TAG in tags]
    peak = _peak(series)
    if not mfu or peak is None:
        if tflops > peaks.HIGHEST_TFLOPS:
            return [
                _wrong_flops(
                    f"{tflops:.3g} TFLOP/s ({span}) is more than any GPU's dense peak (kprof's table "
                    f"tops out at {peaks.HIGHEST_TFLOPS:g} TFLOP/s)"
                )
            ]
        return [
            Diagnostic(
                "mfu",
                "info",
                (
                    f"Achieved {tflops:.3g} TFLOP/s ({span}, from the FLOPs the program gave per step). No MFU: the "
                    "device "
                    "is not in kprof's table of dense peaks; pass peak_tflops= (and mfu_dtype=) to kprof.session."
                ),
            )
        ]
    share = float(np.median(np.concatenate(mfu)))
    if share > 1.0:
        return [
            _wrong_flops(
                f"Model FLOPs utilization {fmt.share(share)} ({span}): {tflops:.3g} TFLOP/s achieved "
                f"against a dense peak of {_peak_text(peak)} TFLOP/s"
            )
        ]
    return [
        Diagnostic(
            "mfu",
            "info",
            (
                f"Model FLOPs utilization {fmt.share(share)} ({span}): {tflops:.3g} TFLOP/s achieved of a dense peak "
                f"of {_peak_text(peak)} TFLOP/s (from the FLOPs the program gave per step; dense, not the sparse "
                "datasheet figure)."
            ),
        )
    ]


def _wrong_flops(what: str) -> Diagnostic:
    """A rate no device reaches: the FLOPs the program gave (or the peak) are wrong, and so is every MFU figure."""
    return Diagnostic(
        "mfu_impossible",
        "warning",
        (
            f"{what}: more than the hardware can do, so the FLOPs given per step are likely wrong (a count per sample "
            "or per token multiplied once too often, forward and backward counted twice), or the peak is "
            "(peak_tflops=, "
            "or mfu_dtype= for a dtype faster than the one MFU is measured against). kprof/tflops and kprof/mfu are "
            "only as right as those FLOPs."
        ),
    )


def growing_sites(snapshots: list[Path]) -> str:
    """The allocation sites holding the most memory at the end of the snapshots' history among allocations made
    after its first fifth (`snapshot.GROWTH_AFTER`), as ``file:line in function (n blocks, MB)``; "" when there are
    none. The snapshots are read by kprof's own reader (plain values only), never unpickled."""
    held: Counter = Counter()
    blocks: Counter = Counter()
    for summary in summaries(snapshots):
        for device in summary.get("devices", []):
            for site in device.get("growing", []):
                held[site["site"]] += site["bytes"]
                blocks[site["site"]] += site["blocks"]
    top = [(site, size) for site, size in held.most_common(_SITES) if blocks[site] >= 3]
    return ", ".join(f"{site} ({blocks[site]} blocks, {size / 2**20:.1f} MB)" for site, size in top)


def _peak_text(tflops: float) -> str:
    """A dense peak as the findings print it: `989.0`, and a small one with its digits (`0.004`, never `0.0`)."""
    return f"{tflops:.1f}" if tflops >= 1 else f"{tflops:.3g}"
