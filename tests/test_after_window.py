"""What the steps right after a window pay for its export is kprof's cost: their copy-on-write faults, at the cost
of one measured after the fork, go to kprof/after_window_ms, and kprof/step_time_ms leaves them out, so the step-time
chart does not show the user's code slowing after every window; a step slow for reasons of its own keeps its time."""

from __future__ import annotations

import functools
import math
import os
import types

import numpy as np
import pytest
import torch

import kprof_callbacks as kprof
from kprof_callbacks import afterwindow, layout, metrics, timing
from kprof_callbacks.afterwindow import STEPS, AfterWindow
from kprof_callbacks.analysis.series import read_series

FAULT_S = 5e-6  # what one copy-on-write fault costs in these tests


@pytest.fixture
def faults(monkeypatch) -> types.SimpleNamespace:
    """The process's minor faults as the session reads them: they move only when the test says so."""
    count = types.SimpleNamespace(n=0)
    monkeypatch.setattr(afterwindow, "_minor_faults", lambda: count.n)
    monkeypatch.setattr(AfterWindow, "_fault_cost", lambda self: FAULT_S)
    return count


def test_a_step_that_copied_pages_for_the_export_is_charged_its_extra_time(faults):
    held = {s: 0.010 for s in range(20)} | {12: 0.011, 13: 0.013}  # 12-13: the window's own (slower) steps
    seconds = lambda start, stop: [held.get(s, math.nan) for s in range(start, stop)]  # noqa: E731
    after = AfterWindow()
    after.ended(first=11, last=14)  # warm-up 11, recorded 12-14
    assert [after.charged(s) for s in (14, 15, 15 + STEPS - 1, 15 + STEPS)] == [False, True, True, False]
    for step, took in ((15, 1000), (16, 100)):
        after.started(step)
        faults.n += took
        after.finished(step)
    assert after.charge(15, 0.016, seconds) == pytest.approx(0.006)  # 1000 pages copied: all beyond steps 3-10's
    assert after.charge(15, 0.009, seconds) == 0.0  # faster than before the window: nothing
    assert after.charge(16, 0.050, seconds) == pytest.approx(100 * FAULT_S)  # few faults: of its 40 ms, only theirs
    assert after.charge(16, 0.0102, seconds) == pytest.approx(0.0002)  # at most its time beyond
    assert after.charge(20, 0.030, seconds) == 0.0  # not right after a window
    after.ended(first=19, last=22)
    after.started(23)
    after.finished(23)
    assert after.charge(23, 0.040, seconds) == 0.0  # slow, but no faults: slow for reasons of its own


def test_a_fault_after_a_fork_is_timed(tmp_path):
    """On this machine: a fork leaves the scratch pages copy-on-write, and writing each of them faults."""
    after = AfterWindow()
    thread = afterwindow._THIS_THREAD
    before = afterwindow._minor_faults(thread)
    after._fault_cost()
    assert afterwindow._minor_faults(thread) - before < afterwindow._PAGES  # no fork: the pages are this process's
    child = os.fork()
    if child == 0:
        os._exit(0)
    try:
        before = afterwindow._minor_faults(thread)
        assert 0.0 < after._fault_cost() < 0.01
        assert afterwindow._minor_faults(thread) - before >= afterwindow._PAGES  # a copy-on-write fault a page
    finally:
        os.waitpid(child, 0)
        after.close()


def test_a_session_charges_the_steps_after_its_windows_to_kprof(tmp_path, monkeypatch, faults):
    """Steps of 10 ms on a controlled clock. After the first window, a step of 15 ms with 1,000 faults (5 ms of
    them); after the second, a step of 40 ms with no faults (a sleep of its own). The scalars give the first 10 ms of
    step and 5 ms of kprof's, and the second its own 40 ms."""
    clock = types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
    monkeypatch.setattr(metrics, "StepTimer", functools.partial(timing.StepTimer, cuda=False))
    ends = [5, 11]  # wait=2, warmup=1, active=3, repeat=2
    with kprof.session(tmp_path, run="r", wait=2, warmup=1, active=3, repeat=2) as s:
        for step in range(16):
            torch.ones(4).sum()
            clock.now += {ends[0] + 1: 0.015, ends[1] + 1: 0.040}.get(step, 0.010)
            faults.n += 1000 if step == ends[0] + 1 else 0
            s.step()
    (tags,) = read_series(s.run_dir).values()
    step_ms = dict(zip(tags[layout.STEP_TIME_TAG].steps.tolist(), tags[layout.STEP_TIME_TAG].values.tolist()))
    export = tags[layout.AFTER_WINDOW_TAG]
    assert export.steps.tolist() == [e + k for e in ends for k in range(1, STEPS + 1)]
    assert np.allclose(export.values, [5.0, 0.0, 0.0, 0.0])
    assert np.allclose([step_ms[e + 1] for e in ends], [10.0, 40.0])
    assert np.allclose([ms for step, ms in step_ms.items() if step - 1 not in ends], 10.0)
    assert np.allclose(s.step_times, [v / 1e3 for v in step_ms.values()])  # the property says the same
    assert "the steps right after its windows took 5.00 ms more" in next(
        d.message for d in s.summary().diagnostics if d.kind == "profiler_cost"
    )


def test_the_slow_step_trigger_does_not_take_an_export_for_a_slow_step(tmp_path, monkeypatch, faults):
    """Steps of 10 ms; step 25 takes 50 ms and arms a capture (from step 27: warm-up 1, then 28-29). The step after
    that window takes 40 ms, 30 ms of them its export's page faults: the trigger goes by the step without them and
    starts no second capture (cooldown=0, so nothing else would stop it)."""
    clock = types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
    monkeypatch.setattr(metrics, "StepTimer", functools.partial(timing.StepTimer, cuda=False))
    options = dict(trigger="slow_step", slow_factor=3.0, slow_min_steps=10, cooldown=0, warmup=1, active=2)
    with kprof.session(tmp_path, run="r", **options) as s:
        for step in range(40):
            torch.ones(4).sum()
            clock.now += {25: 0.050, 30: 0.040}.get(step, 0.010)
            faults.n += 6000 if step == 30 else 0  # 30 ms at 5 us a fault
            s.step()
    assert [(c.first_step, c.last_step) for c in s.captures] == [(28, 29)]
    assert s.step_times[30] == pytest.approx(0.010)
