"""Trace analysis: `summarize(path)` reads torch.profiler trace files into a `Summary`; `diff(a, b)` compares two.

The names are imported on first use, so a submodule (the CLI's help text, the sort keys) costs only itself.
"""

from __future__ import annotations

from .._lazy import lazy_names

_NAMES = {
    "Summary": ".summary",
    "summarize": ".summary",
    "Change": ".tracediff",
    "Diff": ".tracediff",
    "diff": ".tracediff",
    "SORT_KEYS": ".tables",
    "default_jobs": ".workers",
    "run_summary": ".commands",
    "run_diff": ".commands",
    **dict.fromkeys(
        ("Diagnostic", "KernelStats", "LabelStats", "OpStats", "Problem", "RankStats", "StepSkew", "StepStats"),
        ".tables",
    ),
}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = lazy_names(__name__, _NAMES)
