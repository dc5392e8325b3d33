"""Trace analysis: `summarize(path)` reads torch.profiler trace files into a `Summary`; `diff(a, b)` compares two."""

from .summary import Summary, summarize
from .tables import Diagnostic, KernelStats, LabelStats, OpStats, Problem, RankStats, StepSkew, StepStats
from .tracediff import Change, Diff, diff

__all__ = ["Change", "Diagnostic", "Diff", "KernelStats", "LabelStats", "OpStats", "Problem", "RankStats", "StepSkew",
           "StepStats", "Summary", "diff", "summarize"]
