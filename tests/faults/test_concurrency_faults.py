"""Fault 6: several writers at once (two processes, one run folder) and many sessions in one process."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import threading

import psutil
import pytest
import torch

import kprof_callbacks as kprof
from kprof_callbacks.session import Session

from faultkit import HELPERS


def test_two_processes_given_one_run_name_write_two_runs(tmp_path, spawn, check_traces):
    """Two launches with the same logdir and run= at once: each gets its own run folder (never two "ranks" of one
    job), the second says where it went, every trace is valid."""
    options = [
        "--steps",
        "12",
        "--step-sleep",
        "0.1",
        *("--option", "wait=1", "--option", "warmup=1"),
        *("--option", "active=1", "--option", "repeat=4"),
    ]
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


def test_a_rerun_with_the_same_run_name_gets_a_fresh_folder_even_in_one_process(tmp_path, train, capsys):
    """The same session run twice in one process (a notebook cell run again) gets a folder of its own, and its
    summary reads only its own traces (it read both runs', steps 1-3 twice under one worker); a folder claimed rank
    by rank by an older kprof is an earlier launch's."""
    runs = []
    for _ in range(2):
        with kprof.session(tmp_path, run="baseline", wait=0, warmup=1, active=3) as s:
            train(s, 4)
        runs.append(s)
    first, second = runs
    assert (first.run_dir, second.run_dir) == (tmp_path / "baseline", tmp_path / "baseline-2")
    assert f"this one writes to {tmp_path / 'baseline-2'}" in capsys.readouterr().out
    summary = second.summary()
    assert summary.files == second.trace_files and [step.step for step in summary.steps] == [1, 2, 3]
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / ".kprof-claim-single").write_bytes(b"otherhost_1")  # as an older kprof's launch left it
    with kprof.session(tmp_path, run="old", wait=0, warmup=1, active=1) as s:
        train(s, 3)
    assert s.run_dir == tmp_path / "old-2" and len(s.trace_files) == 1


def _launch(*commands: list[str]) -> None:
    """Run ``commands`` at once as the children of one shell (a launcher starting the ranks of one job)."""
    script = " ".join(f"{shlex.join(command)} &" for command in commands) + " wait"
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr


def _short_loop(logdir) -> list[str]:
    """The command of a 3-step loop under a one-step window, with run name "r" (the helper's default)."""
    options = ("--option", "warmup=0", "--option", "active=1", "--option", "scalars=False")
    return [sys.executable, str(HELPERS / "loop.py"), str(logdir), "--steps", "3", *options]


def _workers(run_dir) -> set[str]:
    return {p.name.split(".")[0] for p in run_dir.glob("*.pt.trace.json")}


def test_a_two_rank_launch_then_a_four_rank_launch_with_one_run_name_write_two_runs(tmp_path, check_traces):
    """Ranks 0-1 of the second launch went to <run>-2 and ranks 2-3 into the first launch's folder."""
    loop = _short_loop(tmp_path / "log")
    for world in (2, 4):
        _launch(*(["env", f"RANK={rank}", f"WORLD_SIZE={world}", *loop] for rank in range(world)))
    check_traces(tmp_path / "log")
    assert sorted(p.name for p in (tmp_path / "log").iterdir()) == ["r", "r-2"]
    assert {w.split("_")[0] for w in _workers(tmp_path / "log" / "r")} == {"rank0", "rank1"}
    assert {w.split("_")[0] for w in _workers(tmp_path / "log" / "r-2")} == {"rank0", "rank1", "rank2", "rank3"}


def test_two_launches_one_after_the_other_from_one_script_write_two_runs(tmp_path, check_traces):
    """One shell script launches two ranks, waits, and launches two again: the ranks of both launches had the same
    launcher (the script's shell), and the second launch's ranks joined the first one's folder."""
    loop = _short_loop(tmp_path / "log")
    launch = " ".join(f"{shlex.join(['env', f'RANK={rank}', 'WORLD_SIZE=2', *loop])} &" for rank in range(2))
    done = subprocess.run(["sh", "-c", f"{launch} wait; {launch} wait"], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    check_traces(tmp_path / "log")
    assert sorted(p.name for p in (tmp_path / "log").iterdir()) == ["r", "r-2"]
    for run in ("r", "r-2"):
        assert sorted(w.split("_")[0] for w in _workers(tmp_path / "log" / run)) == ["rank0", "rank1"]


def test_a_session_refused_at_start_leaves_no_folder_behind(tmp_path, train):
    """A session refused because another profiler runs kept its claimed, empty folder: the next run became r-2."""
    with torch.profiler.profile():
        with pytest.raises(RuntimeError, match="another profiler is already running"):
            with kprof.session(tmp_path, run="r"):
                pass
    assert list(tmp_path.iterdir()) == []
    with kprof.session(tmp_path, run="r", wait=0, warmup=1, active=1) as s:
        train(s, 2)
    assert s.run_dir == tmp_path / "r"


def test_two_launches_in_fresh_pid_namespaces_with_one_host_name_write_two_runs(tmp_path, check_traces):
    """A container restarted with the same host name runs its trainer as pid 1 again: before, the second launch
    took the first one's claim for its own and the two merged."""
    loop = _short_loop(tmp_path / "log")
    for _ in range(2):
        done = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", *loop], capture_output=True, text=True, timeout=120
        )
        if done.returncode != 0 and "unshare" in done.stderr:
            pytest.skip(f"cannot make a PID namespace here (needs root): {done.stderr.strip()}")
        assert done.returncode == 0, done.stderr
    check_traces(tmp_path / "log")
    assert sorted(p.name for p in (tmp_path / "log").iterdir()) == ["r", "r-2"]
    assert _workers(tmp_path / "log" / "r") == _workers(tmp_path / "log" / "r-2") == {f"{socket.gethostname()}_1"}


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
