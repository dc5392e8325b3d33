"""Fault 7: a long run that profiles forever (repeat=0) under a disk budget: memory and disk stay bounded."""

from __future__ import annotations

import gc
import json

import psutil

import kprof_callbacks as kprof


def test_endless_profiling_keeps_memory_flat_and_disk_within_budget(tmp_path, train, check_traces):
    """1,200 steps, endless windows, max_trace_mb=2: RSS grows < 4 MB after warm-up, disk within the budget bound."""
    budget = 2 * 2**20
    rss: dict[int, int] = {}

    def sample(s: kprof.Session) -> None:
        if s.steps in (200, 1200):
            gc.collect()
            rss[s.steps] = psutil.Process().memory_info().rss

    with kprof.session(tmp_path, run="r", wait=30, warmup=1, active=2, repeat=0, max_trace_mb=budget / 2**20) as s:
        train(s, 1200, step_sleep=0.002, after_step=sample)
    files = check_traces(tmp_path)
    sizes = [p.stat().st_size for p in files]
    windows = 1200 // 33
    assert len(s.step_times) == 1200
    # keeping each capture's profiler results alive would add ~0.3 MB per window here (measured: ~8 MB)
    assert rss[1200] - rss[200] < 4 * 2**20
    assert 1 < len(files) < windows  # captures happened, then the budget stopped them
    # A window starts only while the bytes written plus those held for the writer (each counted as the largest
    # trace so far) are under budget: past it, at most the capture being recorded and one misjudged by that count.
    assert sum(sizes) < budget + 2 * max(sizes)


def test_back_to_back_windows_report_the_steps_they_recorded(tmp_path, train, check_traces):
    """Endless windows with no wait between them: each capture's first/last step matches ProfilerStep#N in its trace."""
    with kprof.session(tmp_path, run="r", wait=0, warmup=1, active=2, repeat=0, scalars=False) as s:
        train(s, 12, after_step=lambda s: s.flush())
    check_traces(tmp_path)
    assert len(s.captures) == 4
    for capture in s.captures:
        events = json.loads(capture.path.read_text())["traceEvents"]
        steps = [e["name"].removeprefix("ProfilerStep#") for e in events if e["name"].startswith("ProfilerStep#")]
        recorded = sorted(int(step) for step in steps)
        assert recorded == list(range(capture.first_step, capture.last_step + 1)), capture
