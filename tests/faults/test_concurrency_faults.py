"""Fault 6: several writers at once (two processes, one run folder) and many sessions in one process."""

from __future__ import annotations

import os
import threading

import psutil
import torch

import kprof_callbacks as kprof
from kprof_callbacks.session import Session


def test_two_processes_given_one_run_name_write_two_runs(tmp_path, spawn, check_traces):
    """Two launches with the same logdir and run= at once: each gets its own run folder (never two "ranks" of one
    job), the second says where it went, every trace is valid."""
    options = ["--steps", "12", "--step-sleep", "0.1", *("--option", "wait=1", "--option", "warmup=1"),
               *("--option", "active=1", "--option", "repeat=4")]
    children = [spawn(tmp_path / "log", *options) for _ in range(2)]
    assert [child.finish() for child in children] == [0, 0], [child.stderr() for child in children]
    check_traces(tmp_path / "log")
    runs = sorted(p.name for p in (tmp_path / "log").iterdir())
    assert runs == ["r", "r-2"]
    for run in runs:
        files = sorted((tmp_path / "log" / run).glob("*.pt.trace.json"))
        assert len(files) == 4 and len({p.name.rsplit(".", 4)[0] for p in files}) == 1  # one worker per run
        assert len(list((tmp_path / "log" / run).glob("events.out.tfevents.*"))) == 1
    moved = [line for child in children for line in child.lines if "holds an earlier run" in line]
    assert len(moved) == 1 and str(tmp_path / "log" / "r-2") in moved[0]
    assert [child.lines[-1] for child in children] == ["done 4", "done 4"]


def test_a_rerun_with_the_same_run_name_gets_a_fresh_folder_and_a_process_reuses_its_own(tmp_path, train, capsys):
    """The same script run twice (two processes) never merges into one folder; sessions of one process share it."""
    for _ in range(2):
        with kprof.session(tmp_path, run="baseline", wait=0, warmup=1, active=1) as s:
            train(s, 3)
    assert s.run_dir == tmp_path / "baseline" and capsys.readouterr().out == ""
    (tmp_path / "baseline" / ".kprof-claim-single").write_bytes(b"otherhost_1")  # as an earlier launch leaves it
    with kprof.session(tmp_path, run="baseline", wait=0, warmup=1, active=1) as s:
        train(s, 3)
    assert s.run_dir == tmp_path / "baseline-2" and len(s.trace_files) == 1
    assert f"this one writes to {tmp_path / 'baseline-2'}" in capsys.readouterr().out


def _resources() -> dict:
    return {
        "threads": sorted(t.name for t in threading.enumerate()),
        "fds": len(os.listdir("/proc/self/fd")),
        "children": psutil.Process().children(recursive=True),
        "profiler": torch.autograd.profiler._is_profiler_enabled,
        "active session": Session._active,
    }


def test_many_short_sessions_leak_nothing(tmp_path, train):
    """30 short sessions, a third ending in an exception: no thread, fd, child process or profiler state is left."""

    def one(i: int) -> None:
        with kprof.session(tmp_path, run=f"r{i}", wait=0, warmup=1, active=1, repeat=2, gzip=i % 2 == 1) as s:
            train(s, 5)
            if i % 3 == 2:
                raise RuntimeError("user error")

    one(0)  # first use: lazy imports, torch's own thread pools
    before = _resources()
    for i in range(30):
        try:
            one(i)
        except RuntimeError as exc:
            assert str(exc) == "user error"
    assert _resources() == before
