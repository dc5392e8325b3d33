"""A saved summary (`kprof summary --json`) as a side of a diff: checked as it is read, told from a trace by its
structure, found whatever its name or encoding."""

from __future__ import annotations

import codecs
import json
import math

import numpy as np
import pytest
from test_diff import noisy_run, write_trace

from kprof_callbacks.analysis import summarize
from kprof_callbacks.analysis.summary import Summary
from kprof_callbacks.cli import main


@pytest.fixture
def sides(tmp_path):
    """A run A saved as JSON, and a run B 3x slower in two operators (a regression at any limit)."""
    rng = np.random.default_rng(0)
    a = noisy_run(tmp_path / "a.pt.trace.json", rng, 10)
    b = noisy_run(tmp_path / "b.pt.trace.json", rng, 10, slower={"aten::op25": 3.0, "aten::op3": 3.0})
    return summarize(a).to_dict(), b


def _spoiled(doc: dict, change) -> dict:
    doc = json.loads(json.dumps(doc))
    change(doc)
    return doc


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda d: d["steps"][3].update(wall_us=math.nan), "steps[3].wall_us must be a finite number >= 0, got nan"),
        (lambda d: d["steps"][0].update(wall_us=-5.0), "steps[0].wall_us must be a finite number >= 0, got -5.0"),
        (lambda d: d["steps"][1].update(wall_us=None), "steps[1].wall_us must be a finite number >= 0, got None"),
        (lambda d: d["steps"][2].update(kernel_us="12"), "steps[2].kernel_us must be a finite number >= 0, got '12'"),
        (lambda d: d["per_step"]["steps"].__setitem__(0, -1), "per_step.steps[0] must be the index of one of the 10"),
        (lambda d: d["per_step"]["time_us"][0].__setitem__(2, math.inf), "per_step.time_us[0][2] must be a finite"),
    ],
    ids=["nan", "negative", "null", "string", "index -1", "inf per step"],
)
def test_a_baseline_with_impossible_numbers_is_refused_in_one_line(tmp_path, capsys, sides, change, named):
    """NaN step times passed the gate (exit 0: no interval, no regression); negative times and the index -1 (the
    last step, in Python) were taken as they were; null or string times were a traceback."""
    doc, b = sides
    base = tmp_path / "base.json"
    base.write_text(json.dumps(_spoiled(doc, change)))
    assert main(["diff", str(base), str(b), "--fail-if-slower", "5"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"kprof diff: {base}: cannot read this saved kprof summary (ValueError: {named}")
    assert len(err.strip().splitlines()) == 1
    base.write_text(json.dumps(doc))  # the file as saved: the gate's own answer
    assert main(["diff", str(base), str(b), "--fail-if-slower", "5"]) == 3


def test_a_trace_naming_a_region_kprof_summary_is_a_trace(tmp_path):
    """A trace whose first 4 KB hold the format key as a name was refused as "a saved summary"."""
    trace = write_trace(tmp_path / "w.1.pt.trace.json", [{"kprof_summary": 10.0, "aten::mm": 5.0}] * 4)
    summary = summarize(trace)
    assert isinstance(summary, Summary) and {op.name for op in summary.ops} >= {"kprof_summary", "aten::mm"}


@pytest.mark.parametrize(
    ("name", "encode"),
    [
        ("base", lambda text: text.encode()),
        ("base.json", lambda text: codecs.BOM_UTF8 + text.encode()),
        ("base.json", lambda text: text.encode("utf-16")),  # PowerShell's `>`
    ],
    ids=["no suffix", "utf-8 bom", "utf-16"],
)
def test_a_saved_summary_is_read_whatever_its_name_or_encoding(tmp_path, sides, name, encode):
    """Without `.json`, or with a BOM, the file was taken for a trace and failed with a trace's error."""
    doc, b = sides
    base = tmp_path / name
    base.write_bytes(encode(json.dumps(doc, indent=1)))
    assert summarize(base).to_dict() == doc
    assert main(["diff", str(base), str(b), "--fail-if-slower", "5"]) == 3
