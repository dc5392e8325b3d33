"""What each generated table shows: its results file and its columns, as ``tables.py`` renders them.

A ``Table`` names a file under ``benchmarks/results/`` and its columns; a ``Col`` is a header and a ``str.format``
pattern over one row (a cell whose values are missing reads a dash). ``TABLES`` maps each name used in a
``<!-- table: NAME -->`` marker to its Table.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Col:
    """One column: its header, a ``str.format`` pattern over a row (see ``tables._Cells``), and whether its cells are
    numbers (right-aligned)."""

    header: str
    fmt: str
    number: bool = True


@dataclasses.dataclass(frozen=True)
class Table:
    """A table of ``source`` (a file in the results folder): its columns, over the list ``rows`` of that file."""

    source: str
    columns: tuple[Col, ...]
    rows: str = "rows"


def _t(header: str, fmt: str) -> Col:
    """A text column (left-aligned)."""
    return Col(header, fmt, number=False)


def _calibration(source: str, noise: bool) -> Table:
    """Calibration rows: synthetic ones at two noise levels (1,000 trials a rate), or end to end (a few trials)."""
    rate = ".1%" if noise else ".0%"
    return Table(
        source,
        (
            _t("detector", "{detector}"),
            _t("injected effect", "{effect}"),
            _t("run", "{run}"),
            *((Col("noise", "{noise_sigma:.0%}"),) if noise else ()),
            Col("false positives [95% CI]", _rate("false_positive", rate)),
            Col("detection [95% CI]", _rate("detection", rate)),
            _t("meets targets", "{meets_targets}"),
        ),
    )


def _reading(host: str) -> Table:
    """Every reading target of run_all.py on a GPU host."""
    return Table(f"reading-{host}.json", (_t("target", "{target}"), _t("measured", "{measured}"), _t("", "{met}")))


def _gpu_traces(host: str) -> Table:
    """gpu_traces.py's rows on a GPU host: the GPT trace, 8 rank files of it, 1 GB of its events."""
    return Table(
        f"gpu_traces-{host}.json",
        (
            _t("what", "{what}"),
            Col("MB", "{mb:.0f}"),
            Col("jobs", "{jobs}"),
            Col("wall s", "{wall_s:.2f}"),
            Col("MB/s", "{mb_s:.0f}"),
            Col("peak RSS MB (the process)", "{rss}"),
            Col("peak RSS MB (summed over it and its workers)", "{tree_rss}"),
            Col("peak PSS MB (it and its workers)", "{tree_pss}"),
        ),
    )


def _rate(name: str, spec: str) -> str:
    """``rate [low, high]`` of ``<name>_rate`` and ``<name>_ci``."""
    return f"{{{name}_rate:{spec}}} [{{{name}_ci[0]:{spec}}}, {{{name}_ci[1]:{spec}}}]"


def _range(key: str, spec: str = "+.1%") -> str:
    """``value (low .. high)`` of a ``[value, low, high]`` list."""
    return f"{{{key}[0]:{spec}}} ({{{key}[1]:{spec}}} .. {{{key}[2]:{spec}}})"


# The columns of results measured on several devices: one tuple, a Table per results file.
_REAL_MODEL = (
    _t("mode", "{mode}"),
    _t("variant", "{variant}"),
    Col("torch ms/step", "{torch_ms:.2f}"),
    Col("kprof.swap ms/step", "{kprof_ms:.2f}"),
    Col("speedup [95% CI]", "{speedup:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"),
    _t("verdict", "{verdict}"),
    _t("check (no `tol=`)", "{check}"),
)

# real_model.py's rows since its bare loops: each variant's own time and peak, and compare's interval.
_REAL_MODEL_BARE = (
    _t("mode", "{mode}"),
    _t("variant", "{variant}"),
    Col("bare loop ms/step", "{bare_ms:.2f}"),
    Col("× torch (bare loop)", "{bare_x:.3f}"),
    Col("peak GiB", "{peak_gib:.2f}"),
    Col("compare ms/step", "{kprof_ms:.2f}"),
    Col("compare × torch [95% CI]", "{speedup:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"),
    _t("verdict", "{verdict}"),
    Col("compare / bare loop (torch)", "{harness_x:.3f}"),
    _t("check (no `tol=`)", "{check}"),
)

_LOSS = (
    _t("tokens × hidden × vocab", "{shape}"),
    Col("kprof ms", "{ms:.3f}"),
    Col("eager fp32 logits ms", "{eager_fp32_ms:.3f}"),
    Col("eager bf16 logits ms", "{eager_bf16_ms:.3f}"),
    Col("compile ms", "{compile_ms:.3f}"),
    Col("Liger ms", "{liger_ms:.3f}"),
    Col("CCE ms", "{cce_ms:.3f}"),
    Col("kprof × best torch", "{best_torch_x:.2f}"),
    Col("kprof × Liger", "{liger_x:.2f}"),
    Col(
        "peak GiB: kprof / eager fp32 / eager bf16 / compile / Liger / CCE",
        "{peak_gib:.2f} / {eager_fp32_peak_gib:.2f} / {eager_bf16_peak_gib:.2f} / {compile_peak_gib:.2f} / "
        "{liger_peak_gib:.2f} / {cce_peak_gib:.2f}",
    ),
)

_KERNELS = (
    _t("op", "{op}"),
    _t("dtype", "{dtype}"),
    _t("shape", "{shape}"),
    Col("kprof ms", "{kprof_ms:.4f}"),
    Col("% of copy", "{copy_pct:.1f}"),
    Col("% of spec", "{spec_pct:.1f}"),
    Col("triton ms", "{triton_ms:.4f}"),
    Col("eager ms", "{eager_ms:.4f}"),
    Col("compile ms", "{compile_ms:.4f}"),
    Col("Liger ms", "{liger_ms:.4f}"),
    Col("kprof × best other", "{best_other_x:.2f}"),
)

_HOST_OVERHEAD = (
    _t("layer", "{layer}"),
    _t("autograd", "{mode}"),
    Col("torch µs/call", "{torch_us:.2f}"),
    Col("kprof µs/call", "{kprof_us:.2f}"),
    Col("kprof / torch (range)", "{ratio:.2f} ({ratio_min:.2f} .. {ratio_max:.2f})"),
)

_MODULE_OVERHEAD = (
    _t("model", "{model}"),
    Col("round", "{round}"),
    Col("step ms", "{step_ms:.2f}"),
    Col("module calls a step", "{module_calls}"),
    Col("in a window: paired steps, median (range)", _range("inside")),
    Col("hooks µs a call", "{hook_us:.2f}"),
    Col("in a window: calls × hooks / step", "{estimated_inside:+.2%}"),
    Col("outside: `s.step()` µs more", "{outside_us:+.2f}"),
    Col("outside, of the step", "{outside:+.3%}"),
)

_FSDP2 = (
    _t("config", "{config}"),
    Col("step ms", "{step_ms:.1f}"),
    Col(
        "exposed all-gather fwd / bwd ms",
        "{exposed_all_gather_forward_ms:.1f} / {exposed_all_gather_backward_ms:.1f}",
    ),
    Col("exposed reduce-scatter ms", "{exposed_reduce_scatter_ms:.1f}"),
    Col("overlap", "{overlap:.0%}"),
    Col("all-gather queued ms", "{all_gather_queued_ms:.1f}"),
    Col("unsharded at peak / total MiB", "{unsharded_at_peak_mib:.0f} / {unsharded_total_mib:.0f}"),
    _t("findings", "{findings}"),
    _t("command", "`{command}`"),
)


TABLES: dict[str, Table] = {
    "overhead": Table(
        "overhead-h100.json",
        (
            _t("model", "{model}"),
            Col("rounds", "{rounds}"),
            *(
                Col(name, f"{{{key}[0]:.3f}} (x{{{key}[1]:.3f}})")
                for name, key in (
                    ("no profiler ms", "none"),
                    ("raw, after its window", "raw_outside"),
                    ("kprof, after", "kprof_outside"),
                    ("raw, in its window", "raw_inside"),
                    ("kprof, in", "kprof_inside"),
                )
            ),
            Col("kprof after vs none", _range("kprof_outside_vs_none")),
            Col("kprof in vs raw in", _range("kprof_inside_vs_raw")),
            Col("none vs its own baseline (noise)", _range("none_vs_baseline")),
        ),
    ),
    "window_end-h100": Table(
        "overhead-h100.json",
        (
            Col("active steps", "{active}"),
            Col("trace MB", "{trace_mb}"),
            Col("kprof blocked ms", "{kprof_ms}"),
            Col("of which in torch's `_disable_profiler`", "{kprof_in_disable_ms}"),
            Col("raw torch.profiler + `tensorboard_trace_handler` ms", "{raw_ms}"),
        ),
        rows="window_end",
    ),
    "window_end-cpu": Table(
        "window_end-cpu.json",
        (
            _t("variant", "{variant}"),
            Col("blocked ms, per process", "{blocked_ms}"),
            Col("of which in torch's `_disable_profiler`", "{disable_ms}"),
        ),
    ),
    "after_window": Table(
        "after_window-cpu.json",
        (
            _t("per-step call, long after the window", "{call}"),
            Col("warm µs", "{warm_us}"),
            Col("in the CPU training loop µs", "{loop_us}"),
        ),
    ),
    "after_window_bump": Table(
        "after_window_bump-cpu.json",
        (
            _t("variant", "{variant}"),
            Col("step ms", "{step_ms:.2f}"),
            Col("1st step after a window", "{bump:+.0%}"),
            Col("2nd", "{second:+.0%}"),
            Col("minor faults in the 1st (typical)", "{faults:.0f} ({faults_typical:.0f})"),
            Col("export CPU ms a window", "{export_cpu_ms:.1f}"),
            Col("1st step in `kprof/step_time_ms`", "{bump_in_scalars:+.1%}"),
        ),
    ),
    "lightning": Table(
        "lightning_overhead-h100.json",
        (
            _t("variant", "{variant}"),
            Col("long after, x own baseline, per round", "{after_x:.3f}"),
            Col("after vs none (paired, median and range)", _range("after_vs_none")),
            Col("teardown s (median)", "{teardown_s:.2f}"),
        ),
    ),
    "summary": Table(
        "summary-cpu.json",
        (
            Col("trace MB", "{trace_mb:.1f}"),
            Col("events", "{events:,}"),
            Col("steps", "{steps}"),
            Col("`key_averages()` s", "{key_averages_s:.2f}"),
            Col("`summarize` s", "{summarize_s:.3f}"),
            Col("CPU s", "{summarize_cpu_s:.3f}"),
            Col("× `key_averages()`", "{speedup:.0f}×"),
            Col("`summarize(jobs=N)` s", "{summarize_jobs_s:.3f} (N={jobs})"),
            Col("load average", "{load_average:.1f}"),
        ),
    ),
    **{f"reading-{host}": _reading(host) for host in ("h200", "h100")},
    **{f"gpu_traces-{host}": _gpu_traces(host) for host in ("h200", "h100")},
    "gpt_trace": Table(
        "gpt_trace-cpu.json",
        (_t("input", "{input}"), Col("`--jobs`", "{jobs}"), Col("wall s", "{wall_s}"), Col("peak RSS MB", "{rss_mb}")),
    ),
    "cold_start": Table(
        "cold_start-cpu.json",
        (_t("command", "{command}"), Col("median s", "{median_s:.2f}"), Col("range s", "{min_s:.2f}-{max_s:.2f}")),
    ),
    "diff": Table(
        "diff-cpu.json",
        (
            Col("trace MB (A, B)", "{trace_mb:.1f}"),
            Col("steps", "{steps}"),
            Col("summarize A s", "{summarize_a_s:.2f}"),
            Col("summarize B s", "{summarize_b_s:.2f}"),
            Col("diff of the Summaries s", "{diff_summaries_s:.3f}"),
            Col("`kprof.diff` s", "{diff_s:.2f}"),
            Col("CPU s", "{diff_cpu_s:.2f}"),
            Col("as `kprof diff` reads (jobs=N) s", "{diff_jobs_s:.2f} (N={jobs})"),
            Col("rows", "{rows}"),
            _t("step time B vs A", "{step_time}"),
            Col("load average", "{load_average:.1f}"),
        ),
    ),
    "timeline": Table(
        "timeline-cpu.json",
        (
            Col("trace MB", "{trace_mb:.1f}"),
            Col("events in the step", "{step_events:,}"),
            Col("first step served s", "{cold_s:.2f}"),
            Col("later steps s", "{warm_s:.3f}"),
            Col("JSON MB per step", "{json_mb:.2f}"),
            Col("gzipped MB", "{gzip_mb:.2f}"),
            Col("trace MB per step", "{step_trace_mb:.1f}"),
            Col("load average", "{load_average:.1f}"),
        ),
    ),
    "memory-h100": Table(
        "memory-h100.json",
        (
            _t("run", "{run}"),
            Col("highest peak", "{highest_peak}"),
            Col("explained by the breakdown", "{explained}"),
            Col("allocator's peak in the same steps", "{measured}"),
            Col("error", "{error:+.2%}"),
            Col("activations", "{activations:.0%}"),
            Col("temporaries", "{temporaries:.0%}"),
            Col("optimizer state", "{optimizer_state:.0%}"),
            _t("peak at", "{at}"),
        ),
    ),
    "memory-view": Table(
        "memory_view-cpu.json",
        (
            Col("snapshot", "{case}", number=False),
            Col("MB", "{snapshot_mb:,.0f}"),
            Col("entries", "{entries:,}"),
            Col("kprof's reader s", "{reader_s:.1f}"),
            Col("its CPU s", "{reader_cpu_s:.1f}"),
            Col("MB/s (CPU)", "{reader_mb_per_s:.0f}"),
            Col("its memory MB", "{reader_memory_mb:,.0f}"),
            Col("first view drawn s", "{first_s:.2f}"),
            Col("first view", "{first_view}", number=False),
            Col("full view drawn s", "{full_s:.2f}"),
        ),
    ),
    "kernels-h100": Table("kernels-h100.json", _KERNELS),
    "kernels-loss-h100": Table("kernels_loss-h100.json", _LOSS),
    "kernels-h200": Table("kernels-h200.json", _KERNELS),
    "kernels-gpt-h200": Table("kernels-gpt-h200.json", _KERNELS),
    "gemm_floor": Table(
        "gemm_floor-h100.json",
        (
            _t("", "{what}"),
            Col("fwd ms", "{fwd_ms:.4f}"),
            Col("fwd+bwd ms", "{fwd_bwd_ms:.4f}"),
            Col("fwd+bwd / GEMMs alone", "{ratio:.3f}"),
        ),
    ),
    "host_overhead": Table("host_overhead-h100.json", _HOST_OVERHEAD),
    "host_overhead-h200": Table("host_overhead-h200.json", _HOST_OVERHEAD),
    "triton_sm90": Table(
        "triton_sm90-cpu.json",
        (
            _t("kernel", "{kernel}"),
            _t("tile (rows × row length), warps", "{tile}"),
            Col("registers fp32 / bf16", "{registers}"),
            Col("spill bytes", "{spill}"),
        ),
    ),
    "square": Table(
        "square_compare-h100.json",
        (
            _t("expression", "{expression}"),
            Col("median ms", "{median_ms:.4f}"),
            Col("GB/s", "{gbps}"),
            _t("dispatches to", "{dispatches}"),
        ),
    ),
    "real_model": Table("real_model-h100.json", _REAL_MODEL_BARE),
    "real_model-h200": Table("real_model-h200.json", _REAL_MODEL),
    "real_model_compile-h200": Table("real_model_compile-h200.json", _REAL_MODEL),
    "mfu": Table(
        "mfu-h100.json", (_t("measure", "{measure}"), Col("TFLOP/s", "{tflops:.1f}"), Col("MFU", "{mfu:.1%}"))
    ),
    "ddp": Table(
        "ddp-h200x2.json",
        (
            Col("rank", "{rank}"),
            Col("step ms", "{step_ms:.2f}"),
            Col("compute ms", "{compute_ms:.2f}"),
            Col("communication ms", "{comm_ms:.2f}"),
            Col("overlapped ms", "{overlapped_ms:.2f}"),
            Col("exposed ms", "{exposed_ms:.2f}"),
            Col("comm share", "{comm_share:.1%}"),
        ),
    ),
    "fsdp2": Table("fsdp2-h100x2.json", _FSDP2),
    "fsdp2-h200": Table("fsdp2-h200x2.json", _FSDP2),
    "module_overhead": Table("module_overhead-cpu.json", _MODULE_OVERHEAD),
    "module_overhead-h100": Table("module_overhead-h100.json", _MODULE_OVERHEAD),
    "attribution": Table(
        "attribution-h100.json",
        (
            _t("run", "{mode}"),
            Col("step ms", "{step_ms:.1f}"),
            Col("GPU busy ms", "{gpu_busy_ms:.1f}"),
            Col("modules ms", "{modules_ms:.1f}"),
            Col("loss head", "{loss_head:.0%}"),
            Col("unattributed", "{unattributed:.1%}"),
            Col("compiled GPU time attributed", "{compiled_attributed:.1%}"),
            Col("graphs / breaks a step", "{graphs_per_step} / {breaks_per_step}"),
            _t("checks", "{verdict}"),
        ),
    ),
    **{
        f"multi-gpu-{family}": Table(
            f"{family}-h100x4.json",
            (
                _t("run", "{run}"),
                Col("ranks", "{ranks}"),
                Col("step ms", "{step_ms:.1f}"),
                Col("exposed comm ms", "{exposed_comm_ms:.1f}"),
                Col("others wait for rank 2 ms", "{others_wait_for_rank2_ms:.1f}"),
                _t("claims", "{claims}"),
            ),
        )
        for family in ("fsdp2", "hsdp", "ddp")
    },
    "calibration": _calibration("calibration-cpu.json", noise=True),
    "calibration-real": _calibration("calibration-real-cpu.json", noise=False),
    "calibration-load": _calibration("calibration-load-cpu.json", noise=False),
    "calibration-real-gpu": _calibration("calibration-real-h200.json", noise=False),
    "gpu-suite": Table(
        "test_suite-h100.json",
        (
            Col("run", "{run}"),
            _t("machine", "{device}"),
            _t("commit", "{commit}"),
            Col("run's wall s", "{wall_s:.0f}"),
            _t("part", "{part}"),
            Col("passed", "{passed}"),
            Col("failed", "{failed}"),
            Col("skipped", "{skipped}"),
            Col("deselected", "{deselected}"),
            Col("seconds", "{seconds:.0f}"),
        ),
    ),
}
