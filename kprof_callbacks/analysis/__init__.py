"""Trace analysis: `summarize(path)` reads torch.profiler trace files into a `Summary`; `diff(a, b)` compares two.

These names are the package's boundary: the rest of kprof (the CLI, the session, the tab, compare, the out-of-memory
report) imports only them, never a module inside (tests/test_package.py checks). Each is imported on first use, so a
submodule (the CLI's help text, the sort keys) costs only itself.
"""

from __future__ import annotations

from .._lazy import lazy_names

_NAMES = {
    **dict.fromkeys(("Summary", "Unreadable", "summarize", "summarize_contents"), ".summary"),
    **dict.fromkeys(("Change", "Diff", "diff"), ".tracediff"),
    **dict.fromkeys(("Input", "parse_steps"), ".diff_inputs"),
    "PROGRESS_BYTES": ".reading",
    "TraceError": ".reader",
    "SORT_KEYS": ".tables",
    "default_jobs": ".workers",
    **dict.fromkeys(("run_summary", "run_diff"), ".commands"),
    **dict.fromkeys(("TraceSlices", "median_step"), ".slices"),
    **dict.fromkeys(("COLLAPSE_RANKS", "RunSlices"), ".ranktimeline"),
    "legend": ".breakdown",
    "diff_view": ".diff_report",
    "module_view": ".modules_report",
    **dict.fromkeys(("fragment", "table"), ".html"),  # report pieces for compare's report
    **dict.fromkeys(("markdown_table", "md_text", "text_table"), ".report_table"),
    **dict.fromkeys(("save_beside", "site_of", "summarize_value"), ".snapshot"),  # memory snapshots, OOM reports
    **dict.fromkeys(("snapshot_end_state", "snapshot_known", "summarize_apart"), ".snapshot"),  # the tab's big ones
    "fmt": ".fmt",  # one rounding for every report (fmt.js writes the same)
    **dict.fromkeys(
        ("Diagnostic", "KernelStats", "LabelStats", "OpStats", "Problem", "RankStats", "StepSkew", "StepStats"),
        ".tables",
    ),
}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = lazy_names(__name__, _NAMES, modules=("fmt",))
