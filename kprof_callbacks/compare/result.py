"""What ``kprof.compare`` returns: one ``VariantResult`` per variant inside a ``Comparison``, as text, Markdown and
HTML, and which variants regressed."""

from __future__ import annotations

import dataclasses
import math
import platform
from html import escape
from typing import TYPE_CHECKING

import numpy as np
import torch

from .. import stats
from ..analysis import fmt, fragment, markdown_table, md_text, table, text_table
from ..timing import Timing

if TYPE_CHECKING:
    from ..analysis import Diff

K = 2.0  # a variant may be this many times as far from float64 as the reference is
FLOOR_ULPS = 4  # relative error every tensor may have whatever the reference's, in units in the last place

BASELINE = "baseline"
ERROR = "error"


@dataclasses.dataclass
class VariantResult:
    """One variant's numbers; ``timing`` is None when the variant failed (``status == "error"``)."""

    name: str
    status: str = "ok"
    error: str | None = None
    timing: Timing | None = None
    speedup: float | None = None  # median(baseline) / median(this): above 1 is faster
    ci: tuple[float, float] | None = None
    verdict: str | None = None
    peak_mem_mb: float | None = None
    check_against: str | None = None  # the reference variant of the numerical check
    check_basis: str | None = None  # "float64": against the reference's float64 run; "tol": tol=; "dtype": by dtype
    check_label: str | None = None  # the tensor reported: the first beyond its limit, else the closest to it
    check_max_rel_err: float | None = (
        None  # its error (vs float64, or vs the reference); the reference's own: vs float64
    )
    check_ref_err: float | None = None  # the reference's own error against float64 on that tensor
    check_tol: float | None = None  # its limit
    check_worst: str | None = None  # the first tensor beyond its limit (None when all agree)
    check_note: str | None = None  # why the check fell back to per-dtype tolerances
    note: str | None = None  # on a noisy machine: why the verdict is "noisy measurement", or why it stands
    noise_ci: tuple[float, float] | None = None  # on a noisy machine: the interval widened for the steps' spread
    first_step_s: float | None = None  # the first step, untimed (it compiles under torch.compile), in seconds
    trace_dir: str | None = None
    trace_diff: str | None = None  # with a logdir: what changed in the traces against the baseline (trace_summary)

    @property
    def check_ok(self) -> bool | None:
        """True/False once checked against a reference; None for the reference itself or without a check."""
        return None if self.check_against is None else self.check_worst is None

    @property
    def check_detail(self) -> str | None:
        """The check in words: ``1.1e-02 vs torch's own 1.3e-02 against float64 (grad of wte.weight): ok``."""
        if self.check_against is None or self.check_max_rel_err is None:
            return None
        outcome = "ok" if self.check_ok else f"FAILED (limit {self.check_tol:.1e})"
        where = f" ({self.check_label})" if self.check_label else ""
        if self.check_basis == "float64":
            return (
                f"{self.check_max_rel_err:.1e} vs {self.check_against}'s own {self.check_ref_err:.1e} against "
                f"float64{where}: {outcome}"
            )
        against = "tol=" if self.check_basis == "tol" else f"the dtype's tolerance ({self.check_note})"
        return f"{self.check_max_rel_err:.1e} from {self.check_against} with {against}{where}: {outcome}"

    def to_dict(self) -> dict:
        t = self.timing
        return {
            "name": self.name,
            "status": self.status,
            "error": self.error,
            "median_ms": t.median_ms if t else None,
            "p10_ms": t.p10_ms if t else None,
            "p90_ms": t.p90_ms if t else None,
            "speedup": self.speedup,
            "ci_low": self.ci[0] if self.ci else None,
            "ci_high": self.ci[1] if self.ci else None,
            "verdict": self.verdict,
            "note": self.note,
            "noise_ci": list(self.noise_ci) if self.noise_ci else None,
            "first_step_s": self.first_step_s,
            "peak_mem_mb": self.peak_mem_mb,
            "check_against": self.check_against,
            "check_ok": self.check_ok,
            "check_basis": self.check_basis,
            "check_label": self.check_label,
            "check_max_rel_err": _finite(self.check_max_rel_err),
            "check_ref_err": self.check_ref_err,
            "check_tol": self.check_tol,
            "check_worst": self.check_worst,
            "check_detail": self.check_detail,
            "trace_dir": self.trace_dir,
            "trace_diff": self.trace_diff,
            "times_ms": list(t.times_ms) if t else [],
        }


def _finite(x: float | None) -> float | None:
    """JSON has no infinity: an infinite error (missing gradient, shape mismatch) becomes null."""
    return x if x is None or math.isfinite(x) else None


@dataclasses.dataclass
class Comparison:
    """The result of ``kprof.compare``: print it for the table, or take ``to_pandas()`` / ``to_dict()``."""

    variants: dict[str, VariantResult]
    baseline: str | None
    settings: dict
    device: str
    versions: dict

    def __getitem__(self, name: str) -> VariantResult:
        return self.variants[name]

    def to_dict(self) -> dict:
        return {
            "baseline": self.baseline,
            "device": self.device,
            "versions": self.versions,
            "settings": self.settings,
            "variants": [v.to_dict() for v in self.variants.values()],
        }

    def to_pandas(self):
        """One row per variant, indexed by name (the raw step times stay in ``to_dict()``)."""
        import pandas as pd

        rows = [{k: v for k, v in r.to_dict().items() if k != "times_ms"} for r in self.variants.values()]
        return pd.DataFrame(rows).set_index("name")

    def regressed(self, pct: float) -> list[str]:
        """The variants slower than the baseline by more than `pct` percent with significance (empty: none): the
        timed verdict at the noise threshold is "slower" and the whole bootstrap interval of the slowdown lies above
        `pct` (``stats.regressed``, the rule of ``kprof.diff(a, b).regressed``); on a noisy machine, the interval
        widened for the steps' spread (``VariantResult.noise_ci``), the one the verdict used."""
        limit = stats.regression_limit(pct)
        threshold = self.settings["noise_threshold"]
        return [
            v.name
            for v in self.variants.values()
            if v.name != self.baseline
            and v.ci is not None
            and stats.regressed(v.speedup, *(v.noise_ci or v.ci), limit, threshold=threshold)
        ]

    def _heading(self) -> str:
        s = self.settings
        return (
            f"kprof compare on {self.device}: {s['steps']} timed steps per variant after {s['warmup']} warm-up, "
            f"in rounds of {s['block']} step(s) per variant, in a random order per round (seed {s['seed']})"
        )

    def _table(self) -> tuple[list[str], list[list[str]]]:
        head = [
            "variant",
            "median ms",
            "p10",
            "p90",
            f"timed speedup [{fmt.level(self.settings['confidence'])} CI]",
            "verdict",
            "peak MB",
            "check err (ref's own)",
        ]
        return head, [_row(v) for v in self.variants.values()]

    def _notes(self) -> list[str]:
        """What the table's columns mean, each variant's errors and notes, and the versions."""
        s = self.settings
        out = []
        if self.baseline is not None:
            out.append(
                f"timed speedup = median({self.baseline}) / median(variant) over the timed steps (no profiler); "
                f"'no significant difference' when the CI includes 1.0 or the change is under "
                f"{100 * s['noise_threshold']:g}%"
            )
        if any(v.check_basis == "float64" for v in self.variants.values()):
            out.append(
                "check err: max |variant - float64| / max |float64| of the worst output, loss or gradient, against "
                "the reference run in float64 (the reference's own error in brackets); a variant passes at "
                f"<= {K:g}x the reference's own error + {FLOOR_ULPS} units in the last place of its dtype"
            )
        if any(v.peak_mem_mb is not None for v in self.variants.values()):
            out.append("peak MB: CUDA memory allocated during the variant's steps above what was resident before")
        for v in self.variants.values():
            if v.error:
                out.append(f"{v.name}: {v.error}")
            if v.note:
                out.append(f"{v.name}: {v.verdict}: {v.note}")
            elif v.check_detail:
                out.append(f"check {v.name}: {v.check_detail}")
            if v.trace_diff:
                out.append(f"{v.name} in its traces: {v.trace_diff}")
        if self.settings.get("compile"):
            firsts = ", ".join(f"{v.name} {v.first_step_s:.1f} s" for v in self.variants.values() if v.first_step_s)
            out.append(f"torch.compile: the first step of each variant compiles and is not timed ({firsts})")
        out.append("versions: " + ", ".join(f"{k} {val}" for k, val in self.versions.items() if val))
        return out

    def __str__(self) -> str:
        return "\n".join([self._heading(), text_table(*self._table()), *self._notes()])

    def to_markdown(self) -> str:
        """The table as GitHub-flavoured Markdown (a pull-request comment), its notes as a list below it."""
        return "\n\n".join(
            [
                f"### {md_text(self._heading())}",
                markdown_table(*self._table()),
                "\n".join(f"- {md_text(n)}" for n in self._notes()),
            ]
        )

    def _repr_html_(self) -> str:
        """The table as a notebook shows it (the HTML reports' style, no scripts, nothing fetched)."""
        notes = "".join(f'<p class="info">{escape(n)}</p>' for n in self._notes())
        return fragment(f"<section><h2>{escape(self._heading())}</h2>{table(*self._table())}{notes}</section>")


def trace_summary(v: VariantResult, d: Diff, steps: int) -> str:
    """What ``kprof.diff`` of the profiled steps says (``d``, baseline against ``v``), labelled as what it measures,
    and which speedup to believe when it disagrees with the timed one (``steps`` timed steps a variant)."""
    t = d.step_time
    text = f"{d.a.samples} against {d.b.samples} profiled steps, with the profiler on. {d.headline()}"
    if v.verdict in (stats.NOISY, None) or t.verdict == v.verdict:
        return text
    return (
        f"{text} The timed speedup ({v.speedup:.3f}x: {v.verdict}) is the one to go by: it times {steps} steps "
        f"of each variant without the profiler, interleaved in rounds so that load and clocks hit both alike; "
        f"the traces hold {d.b.samples} steps of each, recorded one variant after the other, with the "
        "profiler's own per-operator cost in every step (heaviest where steps are host-bound). The trace diff is "
        "for where the time went, not how much."
    )


def _row(v: VariantResult) -> list[str]:
    if v.check_max_rel_err is None:
        check = "-"
    elif v.check_against is None:
        check = "reference" + (f" ({v.check_max_rel_err:.1e})" if v.check_basis == "float64" else "")
    else:
        own = f" ({v.check_ref_err:.1e})" if v.check_basis == "float64" else ""
        check = f"{v.check_max_rel_err:.1e}{own}" + ("" if v.check_ok else " FAIL")
    t = v.timing
    if t is None:
        return [v.name, "-", "-", "-", "-", v.verdict or ERROR, "-", check]
    speedup = "-" if v.speedup is None else f"{v.speedup:.3f}"
    if v.ci is not None:
        speedup += f" [{v.ci[0]:.3f}, {v.ci[1]:.3f}]"
    peak = "-" if v.peak_mem_mb is None else f"{v.peak_mem_mb:.1f}"
    return [v.name, f"{t.median_ms:.3f}", f"{t.p10_ms:.3f}", f"{t.p90_ms:.3f}", speedup, v.verdict, peak, check]


def device_name(device: torch.device) -> str:
    """The device the variants ran on, as the table's heading names it."""
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} ({device})"
    return f"{device.type} ({platform.machine()}, {torch.get_num_threads()} threads)"


def versions() -> dict:
    """The versions written next to every figure."""
    from .. import __version__

    return {
        "kprof_callbacks": __version__,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
