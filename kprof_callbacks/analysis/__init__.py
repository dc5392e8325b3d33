"""Trace analysis: `summarize(path)` reads torch.profiler trace files into a `Summary`."""

from .summary import Summary, summarize
from .tables import Diagnostic, KernelStats, LabelStats, OpStats, Problem, RankStats, StepSkew, StepStats

__all__ = ["Diagnostic", "KernelStats", "LabelStats", "OpStats", "Problem", "RankStats", "StepSkew", "StepStats", "Summary", "summarize"]
