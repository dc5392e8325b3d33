"""Fault 5: the training process is killed hard (SIGKILL) while a trace is being written."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from faultkit import leftovers

# ~35 MB traces (100 layers, 4 recorded steps, shapes and stacks): a write takes ~1 s, long enough to land in.
SLOW_WRITES = [
    "--steps",
    "400",
    "--layers",
    "100",
    "--step-sleep",
    "0.05",
    *("--option", "wait=2", "--option", "warmup=1", "--option", "active=4", "--option", "repeat=0"),
    *("--option", "record_shapes=True", "--option", "with_stack=True", "--option", "scalars=False"),
]


def _export_mid_write(child) -> psutil.Process:
    """Wait until a written trace exists and the next one is being exported; return the export process."""
    child.wait_until(lambda p: p["traces"] >= 1 and p["captures"] > p["traces"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        exports = psutil.Process(child.pid).children()
        if exports and leftovers(child.logdir):
            return exports[0]
        time.sleep(0.002)
    pytest.fail(f"no export caught mid-write; stderr:\n{child.stderr()}")


@pytest.mark.parametrize("who", ["process", "group"])
def test_sigkill_while_writing_leaves_only_temp_files_summary_reports(tmp_path, spawn, check_traces, who):
    """SIGKILL mid-write: final-named traces complete, the rest temp files that `kprof summary` skips and reports."""
    logdir = tmp_path / "log"
    child = spawn(logdir, *SLOW_WRITES)
    export = _export_mid_write(child)
    if who == "process":
        os.kill(child.pid, signal.SIGKILL)  # the export process is orphaned and finishes its temp file
        psutil.wait_procs([export], timeout=60)
    else:
        os.killpg(child.pid, signal.SIGKILL)  # what a job scheduler or `kill -9 -PGID` does
    assert child.finish() == -signal.SIGKILL
    complete = check_traces(logdir)
    unfinished = leftovers(logdir)
    assert complete and unfinished
    assert {p.name.split(".partial")[0] for p in unfinished}.isdisjoint(p.name for p in complete)

    summary = subprocess.run(
        [sys.executable, "-m", "kprof_callbacks", "summary", str(logdir)], capture_output=True, text=True, timeout=120
    )
    assert summary.returncode == 0, summary.stderr
    report = summary.stdout + summary.stderr
    for temp in unfinished:
        final = temp.name.split(".partial")[0]
        assert final in report and "still being written" in report, report
