"""What `kprof.diff` returns: the step-time verdict, the rows with their intervals and verdicts, and the `Diff`
that holds them with its gates and reports. `tracediff.diff` computes them."""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from .. import exits, stats
from . import diff_report, fmt, memory_diff
from .html import fragment
from .machine import Change as MachineChange

if TYPE_CHECKING:
    import pandas

NEW, GONE, INCREASED, DECREASED, UNCHANGED = "new", "gone", "increased", "decreased", "unchanged"


@dataclasses.dataclass(frozen=True)
class Side:
    """One side of a diff: where it came from and which steps it holds."""

    source: str  # as given (a path, `PATH@steps=SPEC`, or a Summary's name)
    run: str  # the Summary's name
    steps: list[int]  # the step numbers used
    samples: int  # steps x ranks/workers: the per-step samples resampled


@dataclasses.dataclass(frozen=True)
class StepTimeChange:
    """The step-time verdict for B against A: its estimate, its interval and the steps behind them, in one object.

    ``speedup`` is how many times longer a typical A step is than a typical B step (the median of the pairwise
    step-time ratios A/B, ``stats.rank_ratio``): above 1, B is faster. ``low``/``high`` bound it at the diff's
    confidence and are None when a side has too few steps for the rank test (``min_steps``), where the verdict is
    ``stats.TOO_FEW``. ``change`` and ``change_interval`` say the same as B's relative change in step time.
    """

    a_median_us: float
    b_median_us: float
    speedup: float
    low: float | None
    high: float | None
    verdict: str  # stats.FASTER / SLOWER / SAME / TOO_FEW: B compared with A
    a_steps: int
    b_steps: int
    min_steps: int  # steps a side (equal sides) the rank test needs for an interval at this confidence
    a_mean_us: float
    b_mean_us: float
    note: str | None = None  # why the means moved otherwise than the typical step, when they did
    window_starts: tuple[int, int] = (0, 0)  # steps a side left out of the test: each the first of its window

    @property
    def change(self) -> float:
        """B's typical step time relative to A's, minus 1: +0.2 is 20% slower (``1 / speedup - 1``)."""
        return 1.0 / self.speedup - 1.0

    @property
    def change_interval(self) -> tuple[float, float] | None:
        """The interval of ``change`` (None with too few steps)."""
        return None if self.low is None else (1.0 / self.high - 1.0, 1.0 / self.low - 1.0)

    @property
    def significant(self) -> bool:
        """B is faster or slower: the interval excludes 1 and the change passes the noise threshold."""
        return self.verdict in (stats.FASTER, stats.SLOWER)


@dataclasses.dataclass(frozen=True)
class Change:
    """One row: per-step means in A and B (microseconds; a number for kind "count"), the change and its verdict."""

    kind: str  # op (self CPU time), label (wall time), kernel/memcpy/memset/nccl (GPU time), count
    name: str
    a: float
    b: float
    change: float  # b - a
    low: float  # interval of the change
    high: float
    a_calls: float  # calls per step (for counts: the count)
    b_calls: float
    p_value: float  # Welch's t-test (of calls per step for new and gone rows), before the false-discovery control
    significant: bool
    status: str  # new / gone (by presence), increased / decreased (significant), unchanged
    verdict: str  # the status in words, with what it rests on

    @property
    def presence_changed(self) -> bool:
        """New in B or gone from it."""
        return self.status in (NEW, GONE)


@dataclasses.dataclass(frozen=True)
class DiagnosticChange:
    """A finding present on one side only."""

    kind: str
    change: str  # "appeared" (in B) or "went away" (was in A)
    message: str


@dataclasses.dataclass(eq=False)
class Diff:
    """What changed from A to B: step time, rows with intervals and verdicts, findings that came or went."""

    a: Side
    b: Side
    step_time: StepTimeChange
    changes: list[Change]  # significant first, then by size of the change
    diagnostics: list[DiagnosticChange]
    notes: list[str]
    mean_step_change_us: float  # mean step time of B minus A (means add up across rows; the verdict uses medians)
    confidence: float
    noise_threshold: float
    row_confidence: float  # the level of the rows' intervals: 1 - R q / m (false-coverage-adjusted), R of m rows
    memory: memory_diff.MemoryChange | None = None  # each side's memory peak over its steps (profile_memory=True)
    capture: list[str] = dataclasses.field(default_factory=list)  # each side's capture-health lines, "A: ..."
    machine: MachineChange | None = None  # how the two sides' machines differed, when they did

    @property
    def machine_changed(self) -> bool:
        """The slower side ran on a busier or throttled machine, and that accounts for its slowdown
        (``machine.compare``): a failed regression gate answers "inconclusive" instead (docs/ci.md)."""
        return self.machine is not None and self.machine.explains

    def gate_status(self, pct: float) -> int:
        """The regression gate's exit status at `pct` percent (``exits``): REGRESSION when B ``regressed``,
        INCONCLUSIVE instead when the machine changed (``machine_changed``) or when a pass could hide a regression
        behind A's busier machine (``masked``), else OK. ValueError with too few steps, as ``regressed``."""
        if self.regressed(pct):
            return exits.INCONCLUSIVE if self.machine_changed else exits.REGRESSION
        return exits.INCONCLUSIVE if self.masked(pct) else exits.OK

    def masked(self, pct: float) -> bool:
        """A ran on a busier or throttled machine whose measured losses made its steps more than `pct` percent
        longer: a regression of B that large could hide behind it, so a gate that passes is "inconclusive"."""
        m = self.machine
        return m is not None and m.busier == "A" and m.lost is not None and m.lost > stats.regression_limit(pct)

    def significant(self, kinds: Sequence[str] | None = None) -> list[Change]:
        """The significant rows (of `kinds` only, when given), largest change first."""
        return [c for c in self.changes if c.significant and (kinds is None or c.kind in kinds)]

    def contributors(
        self, kinds: Sequence[str] = ("kernel", "memcpy", "memset", "nccl"), top: int = 5, min_share: float = 0.0
    ) -> list[Change]:
        """The significant rows of `kinds` that moved the way the step time did: what accounts for a speedup.

        With the default kinds, the GPU activities that made B faster (or slower) than A, each at least
        `min_share` of the change in mean step time (`share_of_step_change`), largest first.
        """
        return [c for c in self.significant(kinds) if self.share_of_step_change(c) > max(min_share, 0.0)][:top]

    def share_of_step_change(self, change: Change) -> float:
        """`change` as a fraction of the change in mean step time (0 when the step time did not move)."""
        delta = self.mean_step_change_us
        return change.change / delta if delta else 0.0

    def headline(self, top: int = 3) -> str:
        """One paragraph: the step-time verdict and the GPU activities (else operators) that account for it."""
        return diff_report.headline(self, top)

    def regressed(self, pct: float) -> bool:
        """Whether B's step time is slower than A's by more than `pct` percent, with significance: the step-time
        verdict is "slower" and the lower bound of B's relative change (``step_time.change_interval``) is above
        `pct` / 100 (``stats.regressed``). ValueError when a side has too few steps for an interval."""
        limit = stats.regression_limit(pct)
        t = self.step_time
        if t.low is None:
            raise ValueError(
                f"too few steps to tell a regression: {t.a_steps} against {t.b_steps}; the step-time "
                f"rank test needs {t.min_steps} a side at {fmt.level(self.confidence)} confidence: profile more "
                "steps (active=10)"
            )
        return stats.regressed(t.speedup, t.low, t.high, limit, threshold=self.noise_threshold)

    def more_memory(self, pct: float) -> bool:
        """Whether B's peak allocated (the median over its steps) is above A's by more than `pct` percent.
        ValueError when a side recorded no memory events."""
        return memory_diff.more_memory(self, pct)

    def render(
        self, top: int = 10, fail_if_slower: float | None = None, fail_if_more_memory: float | None = None
    ) -> str:
        """The report as text, `top` rows per table; with `fail_if_slower` (percent), the regression gate's answer
        (`regressed`, and what grew when it failed) at the end, and with `fail_if_more_memory` the memory gate's."""
        if top < 1:
            raise ValueError(f"top must be >= 1, got {top}")
        gates = [diff_report.gate(self, fail_if_slower)] if fail_if_slower is not None else []
        gates += [memory_diff.gate(self, fail_if_more_memory)] if fail_if_more_memory is not None else []
        return "\n\n".join([diff_report.render(self, top), *gates])

    def __str__(self) -> str:
        return self.render()

    def print(self, top: int = 10, file: TextIO | None = None) -> None:
        """Print the text report (to stdout unless `file` is given)."""
        print(self.render(top=top), file=file or sys.stdout)

    def to_markdown(
        self, top: int = 10, fail_if_slower: float | None = None, fail_if_more_memory: float | None = None
    ) -> str:
        """The report as GitHub-flavoured Markdown (a pull-request comment), with the gates' answers on top when
        `fail_if_slower` or `fail_if_more_memory` (percent) is given."""
        if top < 1:
            raise ValueError(f"top must be >= 1, got {top}")
        gates = [diff_report.gate(self, fail_if_slower)] if fail_if_slower is not None else []
        gates += [memory_diff.gate(self, fail_if_more_memory)] if fail_if_more_memory is not None else []
        return diff_report.markdown(self, top, " ".join(gates) or None)

    def _repr_html_(self) -> str:
        """The HTML report as a notebook shows it: no page around it, no scripts, nothing fetched."""
        return fragment(diff_report.body(self, 10))

    def to_dict(self) -> dict[str, Any]:
        """Everything as JSON-safe dicts and lists."""
        return {
            "a": dataclasses.asdict(self.a),
            "b": dataclasses.asdict(self.b),
            "step_time": dataclasses.asdict(self.step_time),
            "mean_step_change_us": self.mean_step_change_us,
            "changes": [
                {
                    k: None if isinstance(v, float) and math.isnan(v) else v  # no interval: null in JSON
                    for k, v in dataclasses.asdict(c).items()
                }
                for c in self.changes
            ],
            "diagnostics": [dataclasses.asdict(d) for d in self.diagnostics],
            "memory": None if self.memory is None else dataclasses.asdict(self.memory),
            "notes": list(self.notes),
            "capture": list(self.capture),
            "machine": None if self.machine is None else dataclasses.asdict(self.machine),
            "settings": {
                "confidence": self.confidence,
                "noise_threshold": self.noise_threshold,
                "row_confidence": self.row_confidence,
                "test": "step time: Mann-Whitney rank test (Hodges-Lehmann ratio, Moses interval); rows: "
                "Welch t-test, Benjamini-Hochberg false discovery rate 1 - confidence, intervals at "
                "the false-coverage-adjusted level",
            },
        }

    def to_pandas(self) -> dict[str, pandas.DataFrame]:
        """DataFrames: `step_time` (one row), `changes`, `diagnostics`."""
        import pandas as pd

        data = self.to_dict()
        columns = {
            "changes": [f.name for f in dataclasses.fields(Change)],
            "diagnostics": [f.name for f in dataclasses.fields(DiagnosticChange)],
        }
        return {
            "step_time": pd.DataFrame([data["step_time"]]),
            **{key: pd.DataFrame(data[key], columns=cols) for key, cols in columns.items()},
        }

    def to_html(self, path: str | Path, top: int = 30) -> Path:
        """Write a self-contained HTML report (inline SVG, no scripts, no network)."""
        return diff_report.write_html(self, Path(path), top)
