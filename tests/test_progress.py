"""One progress meter (kprof_callbacks.progress) for long work: compare's steps and bench's rows, as summaries
use it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kprof_callbacks.bench import ops as bench_ops
from kprof_callbacks.bench import timing as bench_timing
from kprof_callbacks.compare import compare
from kprof_callbacks.progress import Progress


def test_a_callback_gets_every_update_and_a_bar_needs_more_than_min_total(capsys):
    seen = []
    with Progress(lambda done, total: seen.append((done, total)), 5, "work") as meter:
        meter.add(2)
        meter.add(3)
    assert seen == [(2, 5), (5, 5)]
    with Progress(True, 10, "small", min_total=10) as meter:
        meter.add(10)
        meter.write("a line")
    assert capsys.readouterr().err == "a line\n"  # at the threshold: no bar, lines still printed
    with Progress(True, 11, "big work", min_total=10) as meter:
        meter.add(11)
        meter.write("a line")
    err = capsys.readouterr().err
    assert "big work" in err and "100%" in err and "a line" in err


def test_compare_reports_every_training_step_it_runs(tmp_path):
    """Warm-up, timed and profiled steps of both variants: the count ends at the total it announced."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    batches = [torch.randn(4, 8) for _ in range(2)]
    seen = []
    compare(
        {"a": model, "b": nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))},
        lambda m, x: m(x).square().mean(),
        batches,
        steps=4,
        warmup=1,
        check=False,
        logdir=tmp_path / "log",
        progress=lambda done, total: seen.append((done, total)),
    )
    profiled = 1 + 1 + 5  # compare's own schedule: wait 1, warmup 1, active 5 (its trace diff's steps at 95%)
    assert seen[-1] == (2 * (1 + 4 + profiled),) * 2
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_bench_rows_print_above_a_progress_bar(capsys):
    op = next(op for op in bench_ops.OPS if op.name == "add")
    rows = bench_timing.run_benchmarks(
        [op],
        bench_ops.QUICK_SIZES,
        "cpu",
        compile_ref=False,
        triton=False,
        warmup=1,
        iters=2,
        on_row=lambda rows: None,
        progress=True,
    )
    err = capsys.readouterr().err
    assert len(rows) == 2 and err.count("[kprof bench] |") == 2
    assert "kprof bench: 100%" in err and "2/2" in err


@pytest.mark.parametrize("total", [0, 3])
def test_no_bar_without_progress(capsys, total):
    with Progress(False, total, "quiet") as meter:
        meter.add(total)
    assert capsys.readouterr().err == ""
