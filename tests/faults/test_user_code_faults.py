"""Fault 3: the user's code fails inside kprof's reach (on_trace callback, summary of a damaged run), or does what
programs do (change directory, install signal handlers, measure with a coarse clock) while a session runs."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
import torch

import kprof_callbacks as kprof
from kprof_callbacks.config import ProfileConfig
from kprof_callbacks.session import Session


def _config(tmp_path, **options) -> ProfileConfig:
    return ProfileConfig(logdir=tmp_path, run="r", wait=0, warmup=0, active=1, **options)


@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt()], ids=["SystemExit", "KeyboardInterrupt"])
def test_on_trace_raising_base_exception_keeps_writer_alive(tmp_path, train, told, check_traces, exc):
    """on_trace calling sys.exit() (or raising KeyboardInterrupt): every later trace is still written, one warning."""
    seen = []

    def on_trace(path):
        seen.append(path)
        raise exc

    with told() as messages:
        with Session(_config(tmp_path, repeat=4), on_trace=on_trace) as s:
            for _ in range(4):  # one window per step, each written before the next
                train(s, 1)
                started = time.monotonic()
                s.flush(timeout=30)
                flushed_in = time.monotonic() - started
                assert flushed_in < 30, "flush() waited for a writer thread that had died"
    assert len(s.trace_files) == 4 and seen == s.trace_files
    assert check_traces(tmp_path) == sorted(s.trace_files)
    assert len(messages) == 1
    assert f"on_trace callback {on_trace.__qualname__} raised {type(exc).__name__}" in messages[0]


HUNG_S = 120.0  # a hung callback is let go after this long: a session still waiting for it by then waited for it


def _released_after(seconds: float) -> threading.Event:
    """The event a hung ``on_trace`` waits on, set by a timer after ``seconds`` (so no test hangs for ever): the
    session ending with it still unset never waited for the callback, on however slow a machine (no time margins:
    the bounded waits are seconds, the timer minutes)."""
    release = threading.Event()
    timer = threading.Timer(seconds, release.set)
    timer.daemon = True
    timer.start()
    return release


def test_hanging_on_trace_delays_exit_by_at_most_write_timeout(tmp_path, train, told, check_traces):
    """An on_trace that never returns: the session exits after write_timeout, says so once, written traces intact."""
    release = _released_after(HUNG_S)
    with told() as messages:
        with Session(_config(tmp_path, repeat=2, write_timeout=1.0), on_trace=lambda path: release.wait()) as s:
            train(s, 3)
    assert not release.is_set(), f"the session waited {HUNG_S} s for the hung callback"
    release.set()
    assert len(messages) == 1 and "did not finish within 1 s" in messages[0]
    assert len(check_traces(tmp_path)) >= 1


def test_hanging_on_trace_with_the_pending_budget_full_never_stops_training(tmp_path, train, told, check_traces):
    """An on_trace that never returns and no room left for the next capture: training waits at most write_timeout
    once, later captures are dropped with their error set, the session exits within its bounds; one warning each."""
    release = _released_after(HUNG_S)  # before the fix the loop waited here for as long as the callback
    with told() as messages:
        config = _config(tmp_path, repeat=0, write_timeout=1.0, max_pending_mb=0.001, scalars=False)
        with Session(config, on_trace=lambda path: release.wait()) as s:
            train(s, 8)
            assert not release.is_set(), f"training waited {HUNG_S} s for the hung callback"
    assert not release.is_set(), f"the session's exit waited {HUNG_S} s for the hung callback"
    release.set()
    written, dropped = s.captures[:1], s.captures[1:]
    assert [c.path for c in written] == s.trace_files and check_traces(tmp_path) == s.trace_files
    assert len(dropped) >= 7 and all(c.path is None and "dropped" in c.error for c in dropped), dropped
    stuck = [m for m in messages if "made no room" in m]
    assert len(stuck) == 1 and "within 1 s" in stuck[0] and "training continues" in stuck[0], messages
    assert len(messages) == 2 and "did not finish within 1 s" in messages[1], messages


def test_summary_of_a_run_with_a_corrupted_trace_reports_it_and_summarizes_the_rest(tmp_path, train):
    """A trace truncated on disk after the run: Session.summary() names it and still summarizes the intact one."""
    with kprof.session(tmp_path, run="r", wait=0, warmup=1, active=2, repeat=2) as s:
        train(s, 6)
    damaged, intact = s.trace_files
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])
    summary = s.summary()
    assert [p.path.name for p in summary.problems] == [damaged.name]
    assert "truncated or corrupt JSON" in summary.problems[0].reason
    assert summary.to_dict()


def test_summary_of_a_run_whose_only_trace_is_corrupted_fails_clearly(tmp_path, train):
    """Every trace of the run unreadable: Session.summary() raises one ValueError naming the file and the reason."""
    with kprof.session(tmp_path, run="r", wait=0, warmup=1, active=2) as s:
        train(s, 3)
    (path,) = s.trace_files
    path.write_bytes(b'{"traceEvents": [{"ph": "X", "na')
    with pytest.raises(ValueError, match=rf"nothing readable.*{path.name}.*truncated or corrupt JSON"):
        s.summary()


def test_chdir_mid_run_loses_nothing(tmp_path, monkeypatch, train, check_traces):
    """A relative logdir, then os.chdir in the loop: every capture lands in the run folder chosen at the start."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    with kprof.session("log", run="r", wait=1, warmup=1, active=1, repeat=5) as s:
        train(s, 6)
        os.chdir(tmp_path / "elsewhere")
        train(s, 10)
    assert len(s.trace_files) == 5 and all(p.is_file() for p in s.trace_files)
    assert len(check_traces(tmp_path / "log" / "r")) == 5 and s.summary().files
    assert list((tmp_path / "log" / "r").glob("events.out.tfevents.*"))
    assert not (tmp_path / "elsewhere" / "log").exists()


def test_a_sigusr1_handler_installed_during_an_on_demand_session_survives_it(tmp_path, train):
    """A cluster's requeue handler installed mid-session stays installed after it (it was replaced by the old one)."""
    seen = []
    before = signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    try:
        with kprof.session(tmp_path, run="r", trigger="on_demand") as s:
            train(s, 2)
            signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append(signum))
            train(s, 2)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert seen == [signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, before)


def test_a_profiler_that_fails_to_start_leaves_nothing_behind(tmp_path, monkeypatch, train):
    """torch's profiler raising at start: a clear error, then no stuck state (a later session and a retry work)."""
    real_enter = torch.profiler.profile.__enter__
    before = {
        "sigterm": signal.getsignal(signal.SIGTERM),
        "sigusr1": signal.getsignal(signal.SIGUSR1),
        "threads": {t.name for t in threading.enumerate()},
    }

    def failing_enter(self):
        raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")

    monkeypatch.setattr(torch.profiler.profile, "__enter__", failing_enter)
    with pytest.raises(RuntimeError, match="could not start.*CUPTI_ERROR_NOT_INITIALIZED"):
        with kprof.session(tmp_path, run="r", trigger="on_demand"):
            pass
    after = {
        "sigterm": signal.getsignal(signal.SIGTERM),
        "sigusr1": signal.getsignal(signal.SIGUSR1),
        "threads": {t.name for t in threading.enumerate()},
    }
    assert after == before and Session._active is None
    monkeypatch.setattr(torch.profiler.profile, "__enter__", real_enter)
    with kprof.session(tmp_path, run="again", wait=0, warmup=1, active=1) as s:
        train(s, 2)
    assert len(s.trace_files) == 1


def test_two_threads_starting_sessions_at_once_get_one_session_and_one_clear_error(tmp_path, train):
    """The check "is another profiler running?" and the claim were far apart: 4 of 6 tries crashed the process."""
    for attempt in range(6):
        barrier, outcomes = threading.Barrier(2), []

        def run(i: int) -> None:
            config = ProfileConfig(logdir=tmp_path / str(attempt), run=f"t{i}", wait=0, warmup=1, active=1)
            session = Session(config)
            barrier.wait()
            try:
                with session as s:
                    train(s, 3)
                outcomes.append("ran")
            except RuntimeError as exc:
                outcomes.append("refused" if "another profiler is already running" in str(exc) else repr(exc))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(outcomes) in (["ran", "refused"], ["ran", "ran"]), outcomes  # "ran" twice: one after the other
    assert Session._active is None


def test_slow_step_trigger_with_a_zero_median_never_raises_into_training(tmp_path, monkeypatch, train):
    """A coarse clock gives steps of 0 s; the trigger divided by the median (ZeroDivisionError out of s.step())."""
    clock = iter(float(i // 30) for i in range(10_000))  # 0 s steps, then one of 1 s
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    with kprof.session(tmp_path, run="r", trigger="slow_step", slow_min_steps=3, poll_every=1) as s:
        train(s, 40)
    assert s.steps == 40


def test_arm_after_the_session_ended_is_refused(tmp_path, train):
    with kprof.session(tmp_path, run="r", trigger="on_demand") as s:
        train(s, 2)
    assert s.arm("too late") is False


def test_a_window_cut_short_by_a_break_reports_the_steps_its_trace_holds(tmp_path, train):
    """wait=0, warmup=1, active=10, and the loop stops after 5 steps: the capture says steps 1-5, as its trace does."""
    with kprof.session(tmp_path, run="r", wait=0, warmup=1, active=10) as s:
        train(s, 5)
    (capture,) = s.captures
    names = [e["name"] for e in json.loads(capture.path.read_text())["traceEvents"]]
    recorded = sorted(int(n.removeprefix("ProfilerStep#")) for n in names if n.startswith("ProfilerStep#"))
    assert (capture.first_step, capture.last_step) == (recorded[0], recorded[-1]) == (1, 5)
