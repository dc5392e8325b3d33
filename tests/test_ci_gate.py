"""The CI gate: a saved summary is side A of a diff, `--fail-if-slower` fails a slower run (exit 3) and names what
grew, passes two runs of the same code, and every exit status means one thing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kprof_callbacks.analysis import diff, summarize
from kprof_callbacks.analysis.summary import Summary
from kprof_callbacks.cli import main
from test_diff import noisy_run, write_trace


def _side_a(d) -> dict:
    """A diff's dict without where side A came from (a trace file or the summary saved from it)."""
    doc = d.to_dict()
    doc["a"].pop("source")
    return doc


# --- a saved summary as side A ---------------------------------------------------------------------------------------


def test_summary_json_round_trips_into_diff(tmp_path, capsys):
    """`kprof summary --json > base.json` keeps the per-step rows: diffing against it gives the diff of the traces."""
    rng = np.random.default_rng(0)
    a = noisy_run(tmp_path / "a.pt.trace.json", rng, 8)
    b = noisy_run(tmp_path / "b.pt.trace.json", rng, 8, slower={"aten::op25": 1.5}, extra_kernel="my_new_kernel")
    assert main(["summary", str(a), "--json"]) == 0
    saved = tmp_path / "base.json"
    saved.write_text(capsys.readouterr().out)
    assert _side_a(diff(saved, b)) == _side_a(diff(a, b))
    assert _side_a(diff(f"{saved}@steps=2-7", b)) == _side_a(diff(f"{a}@steps=2-7", b))
    again = summarize(saved)  # read back as it was saved: every table, the findings, the per-step rows
    original = summarize(a)
    assert isinstance(again, Summary) and again.to_dict() == json.loads(json.dumps(original.to_dict()))
    assert again.render() == original.render()
    assert saved.stat().st_size < a.stat().st_size / 2


def test_a_saved_logdir_of_runs_is_one_side_only_when_it_holds_one_run(tmp_path, capsys):
    for name in ("x", "y"):
        (tmp_path / "log" / name).mkdir(parents=True)
        write_trace(tmp_path / "log" / name / "w.1.pt.trace.json", [{"aten::mm": 10.0}] * 4)
    assert main(["summary", str(tmp_path / "log"), "--json"]) == 0
    both = tmp_path / "both.json"
    both.write_text(capsys.readouterr().out)
    assert set(summarize(both)) == {"x", "y"}
    with pytest.raises(ValueError, match="holds 2 runs"):
        diff(both, tmp_path / "log" / "x")
    doc = json.loads(both.read_text())
    one = tmp_path / "one.json"
    one.write_text(json.dumps({"x": doc["x"]}))
    assert diff(one, tmp_path / "log" / "y").a.run == "x"


def test_a_saved_summary_of_another_format_is_refused_with_why(tmp_path):
    run = write_trace(tmp_path / "a.pt.trace.json", [{"aten::mm": 10.0}] * 4)
    doc = summarize(run).to_dict()
    old = tmp_path / "old.json"
    old.write_text(json.dumps({**doc, "kprof_summary": 0}))
    with pytest.raises(ValueError, match="not a saved kprof summary of version 1 .*kprof summary --json"):
        diff(old, run)
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({k: v for k, v in doc.items() if k != "per_step"}))
    with pytest.raises(ValueError, match="broken.json: cannot read this saved kprof summary"):
        summarize(broken)
