"""Fault 8: the writer falls behind (fast steps, back-to-back windows, a slow disk): every window the schedule started
is written; past the memory budget training waits at the window's end, and the wait is reported."""

from __future__ import annotations

import time

import pytest

import kprof_callbacks as kprof
from kprof_callbacks import exporter, writer


@pytest.mark.parametrize("wait", [0, 2])
def test_every_scheduled_window_of_fast_steps_is_written(tmp_path, train, check_traces, wait):
    """~1 ms CPU steps, 12 windows (back to back with wait=0): 12 traces, none dropped."""
    with kprof.session(tmp_path, run="r", wait=wait, warmup=1, active=2, repeat=12, scalars=False) as s:
        train(s, 12 * (wait + 3) + 2)
    assert len(s.captures) == 12
    assert [c.error for c in s.captures] == [None] * 12
    assert len(check_traces(tmp_path)) == 12 == len(s.trace_files)


def test_past_the_budget_training_waits_for_the_writer_and_says_how_long(
    tmp_path, train, check_traces, told, monkeypatch
):
    """A disk that takes 0.3 s per trace and a budget of about one trace: the windows wait, none is lost."""
    export = exporter.export

    def slow_export(results, final, compress):
        time.sleep(0.3)
        return export(results, final, compress)

    monkeypatch.setattr(exporter, "export", slow_export)  # the forked child runs the patched function too
    with told() as messages:
        with kprof.session(
            tmp_path, run="r", wait=0, warmup=1, active=1, repeat=6, scalars=False, max_pending_mb=0.001
        ) as s:
            train(s, 14)
    assert len(check_traces(tmp_path)) == 6 == len(s.trace_files)
    waits = [c.waited_s for c in s.captures]
    assert s.writer_wait_s == pytest.approx(sum(waits)) and s.writer_wait_s > 0.3
    assert waits[0] == 0.0  # the first capture always has room
    assert len(messages) == 1 and "training waited" in messages[0], messages


def test_captures_dropped_at_exit_have_no_path_an_error_and_a_count(tmp_path, train, check_traces, told, monkeypatch):
    """A backlog longer than write_timeout at exit (20 windows, 0.3 s per trace, write_timeout=1): each capture has
    a path only once its file exists; the dropped ones have none and say why; the warning counts them."""
    export = exporter.export

    def slow_export(results, final, compress):
        time.sleep(0.3)
        return export(results, final, compress)

    monkeypatch.setattr(exporter, "export", slow_export)
    just_finished = []
    with told() as messages:
        with kprof.session(
            tmp_path, run="r", wait=0, warmup=0, active=1, repeat=20, scalars=False, write_timeout=1.0
        ) as s:
            train(s, 20, after_step=lambda s: just_finished.append(s.captures[-1].path))
    assert just_finished == [None] * 20  # a window that has just ended is not written yet
    written = [c for c in s.captures if c.path is not None]
    dropped = [c for c in s.captures if c.path is None]
    assert [c.path for c in written] == s.trace_files == check_traces(tmp_path)
    assert all(c.error is None for c in written)
    assert len(s.captures) == 20 and len(dropped) >= 10
    assert all("not written" in c.error and "within 1 s" in c.error for c in dropped), [c.error for c in dropped]
    assert len(messages) == 1 and f"{len(dropped)} captures not yet written were dropped" in messages[0], messages


def test_lightning_fit_writes_every_cycle(fit, check_traces, tmp_path):
    """ProfilerCallback(wait=2, warmup=1, active=3, repeat=5) on a 32-batch fit: 5 traces (4 before the fix)."""
    callback = kprof.ProfilerCallback(
        logdir=tmp_path / "log", run="r", wait=2, warmup=1, active=3, repeat=5, summary=False
    )
    fit([callback], steps=32)
    assert len(check_traces(tmp_path / "log")) == 5


def test_an_export_forks_only_while_the_training_thread_is_parked_in_kprof(tmp_path, check_traces, monkeypatch):
    """A fork copies every lock the process holds, so it must never land while the training thread runs torch code.
    The writer is kept busy (a slow on_trace callback), so later windows cannot fork at their own end: they fork at
    a later step, while the training thread waits in kprof, never during the user's step."""
    import torch

    in_user_code, seen = [False], []
    fork = writer.os.fork

    def watched_fork():
        seen.append(in_user_code[0])
        return fork()

    monkeypatch.setattr(writer.os, "fork", watched_fork)
    model = torch.nn.Linear(16, 16)
    config = kprof.ProfileConfig(logdir=tmp_path, run="r", wait=0, warmup=0, active=1, repeat=4, scalars=False)
    with kprof.Session(config, on_trace=lambda path: time.sleep(0.4)) as s:
        for _ in range(16):
            in_user_code[0] = True
            deadline = time.perf_counter() + 0.05
            while time.perf_counter() < deadline:
                model(torch.randn(8, 16)).sum().backward()
            in_user_code[0] = False
            s.step()
    assert len(check_traces(tmp_path)) == 4
    assert len(seen) == 4 and not any(seen), seen
