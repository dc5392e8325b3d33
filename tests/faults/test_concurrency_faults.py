"""Fault 6: several writers at once (two processes, one run folder) and many sessions in one process."""

from __future__ import annotations

import os
import threading

import psutil
import torch

import kprof_callbacks as kprof
from kprof_callbacks.session import Session


def test_two_processes_writing_one_run_do_not_clobber(tmp_path, spawn, check_traces):
    """Two training processes share logdir and run: each writes its own files under its own worker name, all valid."""
    options = ["--steps", "12", "--step-sleep", "0.1", *("--option", "wait=1", "--option", "warmup=1"),
               *("--option", "active=1", "--option", "repeat=4")]
    children = [spawn(tmp_path / "log", *options) for _ in range(2)]
    assert [child.finish() for child in children] == [0, 0], [child.stderr() for child in children]
    traces = check_traces(tmp_path / "log")
    by_worker = {}
    for path in traces:
        by_worker.setdefault(path.name.rsplit(".", 4)[0], []).append(path)  # <worker>.<time_ns>.pt.trace.json
    assert sorted(w.rsplit("_", 1)[1] for w in by_worker) == sorted(str(c.pid) for c in children)
    assert [len(files) for files in by_worker.values()] == [4, 4]
    assert [child.lines[-1] for child in children] == ["done 4", "done 4"]
    assert len(list((tmp_path / "log" / "r").glob("events.out.tfevents.*"))) == 2


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
