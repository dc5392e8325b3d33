"""Fault 4: Ctrl-C (KeyboardInterrupt) and SIGTERM arrive while a window is being recorded, in a real process."""

from __future__ import annotations

import os
import signal
import time

import psutil

from faultkit import leftovers

# A big trace (100 layers, shapes and stacks: ~0.3 s to write) and windows back to back, so a signal lands
# while one window is recorded and the previous one is still being written.
BUSY = [
    "--steps",
    "400",
    "--layers",
    "100",
    "--step-sleep",
    "0.05",
    *("--option", "wait=0", "--option", "warmup=1", "--option", "active=2", "--option", "repeat=0"),
    *("--option", "record_shapes=True", "--option", "with_stack=True", "--option", "scalars=False"),
]


def _recording_while_writing(p: dict[str, int]) -> bool:
    return p["recording"] == 1 and p["traces"] >= 1 and p["captures"] > p["traces"]


def test_sigterm_mid_window_finishes_queued_writes_and_dies_of_sigterm(tmp_path, spawn, check_traces):
    """SIGTERM while a finished window is being written: the write completes, exit status stays -15, no temp file."""
    child = spawn(tmp_path, *BUSY)
    queued = child.wait_until(_recording_while_writing)["captures"]
    os.kill(child.pid, signal.SIGTERM)
    assert child.finish() == -signal.SIGTERM
    assert len(check_traces(tmp_path)) >= queued
    assert leftovers(tmp_path) == []
    assert "Traceback" not in child.stderr()


def _interrupted_control(tmp_path, spawn):
    """The same loop without kprof, interrupted by SIGINT: its exit status is what "as Python does" means here.

    (-2, death by SIGINT, with CPython 3.11 on the CPU machine; 1 with the GPU machine's Python 3.12 and torch 2.11,
    with or without kprof.)"""
    control = spawn(tmp_path / "control", *BUSY, "--option", "enabled=False")
    control.wait_until(lambda p: p["step"] >= 3)
    os.kill(control.pid, signal.SIGINT)
    return control.finish()


def test_ctrl_c_mid_window_saves_the_cut_short_window_and_exits_as_python_does(tmp_path, spawn, check_traces):
    """SIGINT mid-window: one KeyboardInterrupt traceback, the exit status of the same loop without kprof, the
    cut-short window written."""
    expected = _interrupted_control(tmp_path, spawn)
    child = spawn(tmp_path, *BUSY)
    written = child.wait_until(lambda p: p["recording"] == 1 and p["traces"] >= 1 and p["captures"] == p["traces"])
    os.kill(child.pid, signal.SIGINT)
    assert child.finish() == expected
    stderr = child.stderr()
    assert stderr.count("Traceback (most recent call last)") == 1 and stderr.rstrip().endswith("KeyboardInterrupt")
    assert len(check_traces(tmp_path)) >= written["traces"] + 1, stderr
    assert leftovers(tmp_path) == []


def test_ctrl_c_while_training_waits_for_the_writer_keeps_the_finished_window(tmp_path, spawn, check_traces):
    """Ctrl-C while the training thread waits for room (a slow on_trace holds the writer, a window every step and a
    budget of one capture): the window that was waiting is written, and torch's profiler stops cleanly."""
    expected = _interrupted_control(tmp_path, spawn)
    child = spawn(
        tmp_path / "log",
        "--steps",
        "50",
        "--slow-first-trace",
        "4",
        *("--option", "wait=0", "--option", "warmup=0", "--option", "active=1", "--option", "repeat=0"),
        *("--option", "max_pending_mb=0.001", "--option", "scalars=False"),
    )
    child.wait_for(lambda line: line.startswith("on_trace"))
    time.sleep(1.0)  # the next window has ended long since: training waits for room while on_trace sleeps
    os.kill(child.pid, signal.SIGINT)
    assert child.finish() == expected
    stderr = child.stderr()
    assert stderr.count("Traceback (most recent call last)") == 1 and stderr.rstrip().endswith("KeyboardInterrupt")
    assert "disableProfiler" not in stderr and "failed" not in stderr, stderr
    steps = [line for line in child.lines if line.startswith("step ")]
    assert steps and steps[-1].startswith("step 1 "), child.lines  # step 2 ended in the wait
    assert len(check_traces(tmp_path / "log")) >= 2, (child.lines, stderr)
    assert leftovers(tmp_path / "log") == []


def _freeze_an_export(child) -> psutil.Process:
    """SIGSTOP the forked process exporting a trace, once one is caught mid-write (the test's "hung disk")."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for export in psutil.Process(child.pid).children():
            export.suspend()
            time.sleep(0.05)
            if export.status() == psutil.STATUS_STOPPED and leftovers(child.logdir):
                return export
            export.resume()
        time.sleep(0.002)
    raise AssertionError(f"never caught an export mid-write; stderr:\n{child.stderr()}")


def test_ctrl_c_with_a_hung_write_exits_within_the_bound_and_leaves_no_process(tmp_path, spawn, check_traces):
    """Ctrl-C while an export hangs: exit within write_timeout + slack, one warning, the hung export killed."""
    expected = _interrupted_control(tmp_path, spawn)
    child = spawn(tmp_path, *BUSY, "--option", "write_timeout=2.0")
    child.wait_until(lambda p: p["traces"] >= 1)
    export = _freeze_an_export(child)
    started = time.monotonic()
    os.kill(child.pid, signal.SIGINT)
    assert child.finish() == expected
    assert time.monotonic() - started < 2.0 + 8.0
    warnings = [line for line in child.stderr().splitlines() if "kprof:" in line]
    assert len(warnings) == 1 and "did not finish within 2 s" in warnings[0], warnings
    assert not export.is_running() or export.status() == psutil.STATUS_ZOMBIE
    check_traces(tmp_path)


def test_sigterm_under_lightning_keeps_lightnings_exit_and_saves_the_cut_short_window(tmp_path, spawn, check_traces):
    """SIGTERM mid-window in Trainer.fit: exit status as without kprof, the cut-short window saved, all traces valid."""
    options = ("--option", "wait=2", "--option", "warmup=1", "--option", "active=3", "--option", "repeat=0")
    with_kprof = spawn(tmp_path / "kprof", *options, script="lightning_loop.py")
    control = spawn(tmp_path / "control", "--no-kprof", script="lightning_loop.py")
    written = with_kprof.wait_until(lambda p: p["recording"] == 1 and p["traces"] >= 1)["traces"]
    control.wait_until(lambda p: p["step"] >= 8)
    for child in (with_kprof, control):
        os.kill(child.pid, signal.SIGTERM)
    assert with_kprof.finish() == control.finish()
    assert len(check_traces(tmp_path / "kprof")) >= written + 1
    assert leftovers(tmp_path) == []
    stopped = [line for line in with_kprof.lines if line.startswith("kprof:")]
    assert len(stopped) == 1 and "stopped the run" in stopped[0], with_kprof.lines[-5:]


def test_sigterm_while_the_session_closes_still_finishes_the_last_write(tmp_path, spawn, check_traces):
    """SIGTERM just as the loop ends, while the session saves its last (big) window: written whole, exit status -15."""
    one_window = ("--steps", "3", "--option", "warmup=0", "--option", "active=3", "--option", "repeat=1")
    child = spawn(tmp_path, *BUSY[2:], *one_window)
    child.wait_until(lambda p: p["step"] == 3)  # the window's write is under way; Session.__exit__ waits for it
    os.kill(child.pid, signal.SIGTERM)
    assert child.finish() == -signal.SIGTERM
    assert len(check_traces(tmp_path)) == 1
    assert leftovers(tmp_path) == []
