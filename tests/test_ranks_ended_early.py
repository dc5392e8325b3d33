"""A rank that died half-way through a multi-rank run: named, and its step cut short kept out of every average."""

from __future__ import annotations

from pathlib import Path

from test_diff import write_trace

import kprof_callbacks as kprof


def _step(mm_us: float) -> dict[str, float]:
    return {"aten::mm": mm_us, "aten::add": 10.0}


def _run(folder: Path, windows: dict[int, dict[int, list[dict]]]) -> Path:
    """``windows[rank][first step]``: the steps of each trace file of each rank."""
    folder.mkdir()
    for rank, traces in windows.items():
        for k, (first, steps) in enumerate(traces.items()):
            write_trace(folder / f"rank{rank}_host_1.{k}.pt.trace.json", steps, first=first)
    return folder


def _whole() -> list[dict]:
    return [_step(100.0)] * 3


def _ended_early(summary) -> list[str]:
    return [d.message for d in summary.diagnostics if d.kind == "rank_ended_early"]


def test_a_rank_that_died_mid_step_is_named_and_its_cut_step_left_out(tmp_path):
    """Rank 3 died in step 11 (its cut window was saved, as after an exception) and wrote nothing after: it was not
    named, and its 30 us step 11 pulled its mean step time down."""
    windows = {rank: {first: _whole() for first in (0, 10, 20)} for rank in range(3)}
    windows[3] = {0: _whole(), 10: [_step(100.0), _step(30.0)]}
    summary = kprof.summarize(_run(tmp_path / "run", windows))
    assert _ended_early(summary) == [
        "Rank 3 ended before the others: its step 11 was cut in mid-step and is left out; it has no trace of steps "
        "12,20-22, which ranks 0-2 recorded. Did it die, or were its traces lost? Its averages cover only the steps "
        "it recorded whole."
    ]
    rank3 = next(r for r in summary.ranks if r.rank == 3)
    assert rank3.steps == 4 and rank3.step_us == next(r for r in summary.ranks if r.rank == 0).step_us
    assert [s.step for s in summary.steps if s.rank == 3] == [0, 1, 2, 10]
    assert 11 not in {s.step for s in summary.per_step.steps if s.rank == 3}


def test_a_window_stopped_between_steps_keeps_its_last_step(tmp_path):
    """The empty range torch closes at a stop between two steps shows rank 3's step 11 was whole: it is kept."""
    windows = {rank: {first: _whole() for first in (0, 10, 20)} for rank in range(3)}
    windows[3] = {0: _whole(), 10: [_step(100.0), _step(100.0), {}]}
    summary = kprof.summarize(_run(tmp_path / "run", windows))
    (message,) = _ended_early(summary)
    assert message.startswith("Rank 3 ended before the others: it has no trace of steps 12,20-22, which ranks 0-2")
    assert [s.step for s in summary.steps if s.rank == 3] == [0, 1, 2, 10, 11]


def test_ranks_whose_windows_start_a_step_apart_are_not_called_early(tmp_path):
    """Each rank's own trigger (a slow step) may start its window a step after another's: nobody ended early."""
    windows = {0: {100: _whole()}, 1: {101: _whole()}}
    summary = kprof.summarize(_run(tmp_path / "run", windows))
    assert _ended_early(summary) == [] and len(summary.steps) == 6
