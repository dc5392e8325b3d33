"""Fault 3: the user's code fails inside kprof's reach (on_trace callback, summary of a damaged run)."""

from __future__ import annotations

import threading
import time

import pytest

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


def test_hanging_on_trace_delays_exit_by_at_most_write_timeout(tmp_path, train, told, check_traces):
    """An on_trace that never returns: the session exits after write_timeout, says so once, written traces intact."""
    release = threading.Event()
    started = time.monotonic()
    with told() as messages:
        with Session(_config(tmp_path, repeat=2, write_timeout=1.0), on_trace=lambda path: release.wait()) as s:
            train(s, 3)
    elapsed = time.monotonic() - started
    release.set()
    assert elapsed < 10
    assert len(messages) == 1 and "did not finish within 1 s" in messages[0]
    assert len(check_traces(tmp_path)) >= 1


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
