"""The benchmark scripts run end to end in their tiny --quick mode, so they cannot rot between GPU runs."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

RUN_ALL = Path(__file__).resolve().parent.parent / "benchmarks" / "run_all.py"


@pytest.mark.slow
def test_run_all_quick_produces_every_table_and_the_targets(tmp_path):
    out = tmp_path / "results.json"
    done = subprocess.run(
        [sys.executable, str(RUN_ALL), "--quick", "--out", str(out)], capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    results = json.loads(out.read_text())
    for name in ("overhead", "lightning", "summary", "kernels"):
        assert results[name]["returncode"] == 0 and results[name]["result"], name
    measured = {row["target"].split(":")[0] for row in results["targets"]}
    assert {"launch-bound", "compute-bound"} <= measured
    assert any(t["target"].startswith("summary of") for t in results["targets"])
    assert "## targets" in done.stdout
