"""One way to write a number everywhere: durations rounded alike in the terminal, the HTML report and the tab
(fmt.py and fmt.js), confidence levels never shown as 100%, a gate's estimate and interval in the same words, the
same name for the findings, and the slow-step trigger's text only where the trigger was on."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import kprof_callbacks as kprof
from kprof_callbacks import layout, stats
from kprof_callbacks.analysis import diff, diff_report, fmt, summarize
from kprof_callbacks.analysis.series import read_series

STATIC = Path(kprof.__file__).parent / "tensorboard" / "static"
DURATIONS = [0.0, 0.05, 0.25, 12.35, 99.95, 100.0, 117.0, 999.5, 1000.0, 1234.5, 9999.4, 10_000.0, 32_250.0,
             32_350.0, 102_300.0, 102_349.9, 999_999.0, 1_000_000.0, 1_234_567.0, -0.25, -32_250.0, -117.0]  # fmt: skip
LEVELS = [0.5, 0.8, 0.9, 0.95, 0.975, 0.99, 0.999, 0.9989, 1 - 0.05 / 44, 1 - 0.05 / 2000, 1 - 1e-7]


def test_durations_round_a_tie_as_the_tab_does():
    assert f"{32.25:.1f}" == "32.2"  # Python's own format: a tie to even
    assert fmt.duration(32_250.0) == "32.3 ms"  # toFixed's: away from zero, as the tab writes it
    assert [fmt.duration(x) for x in (117.0, 102_300.0, 0.25)] == ["117 us", "102.3 ms", "0.3 us"]


def test_confidence_levels_show_the_digits_they_need_and_never_100():
    assert [fmt.level(c) for c in (0.95, 0.9, 0.999, 0.9989)] == ["95%", "90%", "99.9%", "99.89%"]
    assert fmt.level(1 - 0.05 / 2000) == "99.9975%"  # the rows' level with nothing significant among 2000 rows
    assert all(fmt.level(c) != "100%" for c in LEVELS)
    with pytest.raises(ValueError, match="between 0 and 1"):
        fmt.level(1.0)


@pytest.mark.skipif(shutil.which("node") is None, reason="node (to run the tab's fmt.js) not found")
def test_the_tab_writes_durations_and_levels_as_the_reports_do(tmp_path):
    shutil.copy(STATIC / "fmt.js", tmp_path / "fmt.js")
    (tmp_path / "package.json").write_text('{"type": "module"}')
    script = tmp_path / "run.js"
    script.write_text(
        "import {duration, level} from './fmt.js';\n"
        f"console.log(JSON.stringify([{json.dumps(DURATIONS)}.map(duration), {json.dumps(LEVELS)}.map(level)]));\n"
    )
    done = subprocess.run(["node", str(script)], capture_output=True, text=True, check=True)
    durations, levels = json.loads(done.stdout)
    assert durations == [fmt.duration(x) for x in DURATIONS]
    assert levels == [fmt.level(c) for c in LEVELS]


def _trace(path: Path, rng: np.random.Generator, n: int, scale: float = 1.0) -> Path:
    events, t = [], 0.0
    for i in range(n):
        start = t
        for k in range(40):
            dur = 20.0 * (k + 1) * scale * rng.lognormal(0, 0.1)
            events.append({"ph": "X", "cat": "cpu_op", "name": f"aten::op{k}", "pid": 1, "tid": 1, "ts": t, "dur": dur})
            t += dur + 1.0
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": 1, "tid": 1,
                       "ts": start, "dur": t - start})  # fmt: skip
        t += 5.0
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_a_diff_with_nothing_significant_heads_its_intervals_with_their_level(tmp_path):
    rng = np.random.default_rng(0)
    d = diff(_trace(tmp_path / "a.pt.trace.json", rng, 6), _trace(tmp_path / "b.pt.trace.json", rng, 6))
    assert not d.significant() and len(d.changes) > 40
    header = diff_report.interval_header(d)
    assert header == f"{fmt.level(1 - 0.05 / len(d.changes))} CI (FDR-adjusted)" and not header.startswith("100%")
    assert header in d.render() and header in d.to_markdown()


def test_the_gate_words_its_estimate_and_interval_alike(tmp_path):
    """An estimate 41.1% faster with an interval from 86.6% faster to 48.3% slower: both in words of faster/slower,
    never "faster" beside a signed interval."""
    rng = np.random.default_rng(1)
    d = diff(_trace(tmp_path / "a.pt.trace.json", rng, 6), _trace(tmp_path / "b.pt.trace.json", rng, 6))
    change, low, high = -0.411, -0.866, 0.483  # B's relative change in step time; speedup = 1 / (1 + change)
    t = dataclasses.replace(d.step_time, speedup=1 / (1 + change), low=1 / (1 + high), high=1 / (1 + low))
    gate = diff_report.gate(dataclasses.replace(d, step_time=dataclasses.replace(t, verdict=stats.SAME)), 5)
    assert "B's typical step is 41.1% faster than A's [95% CI: 86.6% faster to 48.3% slower]" in gate
    slower = dataclasses.replace(t, speedup=1 / 1.2, low=1 / 1.3, high=1 / 1.1, verdict=stats.SLOWER)
    gate = diff_report.gate(dataclasses.replace(d, step_time=slower), 5)
    assert "B's typical step is 20.0% slower than A's [95% CI: 10.0% to 30.0% slower]" in gate


def test_every_report_calls_its_findings_findings(tmp_path):
    rng = np.random.default_rng(2)
    s = summarize(_trace(tmp_path / "a.pt.trace.json", rng, 6))
    s = dataclasses.replace(s, diagnostics=[kprof.analysis.tables.Diagnostic("x", "warning", "a finding")])
    for text in (s.render(), s._repr_html_()):
        assert "Findings" in text and "Diagnostics" not in text


def test_the_slow_step_trigger_is_recorded_only_when_it_was_on(tmp_path):
    for trigger, expected in (("slow_step", 3.0), ("schedule", None)):
        with kprof.session(tmp_path, run=trigger, trigger=trigger, wait=1, warmup=1, active=1) as s:
            for _ in range(4):
                torch.ones(4).sum()
                s.step()
        (series,) = read_series(s.run_dir).values()
        tag = series.get(layout.TRIGGER_TAG)
        assert (tag.values.tolist() if tag else None) == (None if expected is None else [expected])
