"""Every summary and diff checks its own capture first: dropped kernels, launches without their kernels, negative
durations, events far outside the trace, windows cut short, missing ranks and clocks that drift apart are said at the
top, one line each, with what they affect; a clean capture says nothing."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch
from test_fsdp2_analysis import Layout, _Trace

import kprof_callbacks as kprof
from kprof_callbacks.analysis import diff, summarize
from kprof_callbacks.analysis.health import is_capture
from kprof_callbacks.analysis.report_table import md_text
from kprof_callbacks.cli import main

FIXTURES = Path(__file__).parent / "fixtures"


def _events(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


@pytest.fixture
def dropped_kernels(tmp_path) -> Path:
    """gpu_small with every third kernel deleted (its launches kept): what a full CUPTI buffer leaves."""
    doc = _events(FIXTURES / "gpu_small.pt.trace.json.gz")
    kernels = [i for i, e in enumerate(doc["traceEvents"]) if e.get("cat") == "kernel"]
    gone = set(kernels[::3])
    doc["traceEvents"] = [e for i, e in enumerate(doc["traceEvents"]) if i not in gone]
    path = tmp_path / "dropped" / "gpuhost_1.1.pt.trace.json"
    path.parent.mkdir()
    path.write_text(json.dumps(doc))
    return path


def _capture(summary) -> list[str]:
    return [d.kind for d in summary.diagnostics if is_capture(d)]


def test_clean_captures_say_nothing():
    for fixture in ("gpu_small.pt.trace.json.gz", "gpu_mlp_h100.pt.trace.json.gz"):
        assert _capture(summarize(FIXTURES / fixture)) == []


def test_dropped_kernels_are_flagged_first_in_the_summary_and_the_diff(dropped_kernels, capsys):
    s = summarize(dropped_kernels)
    first = s.diagnostics[0]
    assert first.kind == "capture_dropped_activities"
    dropped = len(
        [e for e in _events(FIXTURES / "gpu_small.pt.trace.json.gz")["traceEvents"] if e.get("cat") == "kernel"]
    )
    assert first.message.startswith(f"Capture: {(dropped + 2) // 3} of ") and "GPU time" in first.message
    text = s.render()
    assert text.index(first.message) < text.index("Steps") < text.index("Findings")  # at the top, not a finding
    assert "Findings" not in text or first.message not in text.split("Findings")[1]
    assert md_text(first.message) in s.to_markdown().split("**Steps")[0] and first.message in s._repr_html_()
    d = diff(FIXTURES / "gpu_small.pt.trace.json.gz", dropped_kernels)
    assert d.capture == [f"B: {first.message}"]
    assert not [x for x in d.diagnostics if x.kind.startswith("capture_")]  # not a finding that "appeared"
    report = d.render()
    assert report.index(f"! B: {first.message}") < report.index("Step time:")
    assert main(["diff", str(FIXTURES / "gpu_small.pt.trace.json.gz"), str(dropped_kernels)]) == 0
    assert f"! B: {first.message}" in capsys.readouterr().out


def test_kernels_without_launches_negative_durations_and_far_events(tmp_path):
    doc = _events(FIXTURES / "gpu_small.pt.trace.json.gz")
    events = doc["traceEvents"]
    launches = [e for e in events if e.get("name") == "cudaLaunchKernel"]
    for e in launches[:4]:
        events.remove(e)
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    ops[0]["dur"] = -3.0
    far = dict(ops[1], ts=ops[1]["ts"] + 3e7)  # 30 s after the steps: a clock gone wrong
    events.append(far)
    path = tmp_path / "run" / "gpuhost_1.1.pt.trace.json"
    path.parent.mkdir()
    path.write_text(json.dumps(doc))
    s = summarize(path)  # the file is read: a negative duration no longer loses it
    assert s.files == [path] and not s.problems
    by_kind = {d.kind: d.message for d in s.diagnostics if is_capture(d)}
    assert set(by_kind) == {"capture_activities_without_launch", "capture_negative_durations", "capture_out_of_range"}
    assert by_kind["capture_activities_without_launch"].startswith("Capture: 4 of ")
    assert by_kind["capture_negative_durations"].startswith("Capture: 1 events had a negative duration")
    assert by_kind["capture_out_of_range"].startswith("Capture: 1 events lie farther outside the steps")


def test_a_window_cut_short_is_said(tmp_path):
    with kprof.session(tmp_path, run="cut", wait=1, warmup=1, active=5) as s:
        for _ in range(4):  # the window's steps 2-6: the loop ends in step 4
            torch.ones(8).sum()
            s.step()
    (line,) = [d.message for d in s.summary().diagnostics if d.kind == "capture_cut_short"]
    assert line.startswith("Capture: the window of steps 2-3 (") and "cut short" in line
    with kprof.session(tmp_path, run="whole", wait=1, warmup=1, active=2) as s:
        for _ in range(6):
            torch.ones(8).sum()
            s.step()
    assert _capture(s.summary()) == []


def test_missing_ranks_and_drifting_clocks_across_hosts(tmp_path):
    run = tmp_path / "hosts"
    _Trace(Layout(rank=0)).write(run)
    rank1 = _Trace(Layout(rank=1, clock=3.7e6)).write(run)
    assert _capture(summarize(run)) == []  # an offset the alignment fixes says nothing
    doc = json.loads(rank1.read_text())
    first = min(e["ts"] for e in doc["traceEvents"])
    for e in doc["traceEvents"]:
        e["ts"] += (e["ts"] - first) * 0.05  # its clock runs 5% fast: 5 ms over the run's 100 ms
    doc["distributedInfo"]["world_size"] = 4
    rank1.write_text(json.dumps(doc))
    lines = {d.kind: d.message for d in summarize(run).diagnostics if is_capture(d)}
    assert lines["capture_missing_ranks"].startswith("Capture: ranks 2-3 of 4 wrote no trace here")
    assert lines["capture_clock_skew"].startswith("Capture: rank 1's host clock still differs from rank 0's by up to ")
