"""kprof never charges its own cost to the training: a loop of known cost, plain and under Lightning, keeps its step
time through every window's start and end, and ``kprof/profiler_ms`` carries what the windows cost.

The loops run on a controlled clock (``clock``): the loop's work moves it by 10 ms a step, torch's ``profile.step()``
by 1 ms and the hand-off of a finished window by 40 ms more, so every number is known exactly whatever else the
machine runs. What torch.profiler really costs at a window's end is measured by ``benchmarks/overhead.py``."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kprof_callbacks as kprof
from kprof_callbacks import layout, metrics, timing, torch_compat
from kprof_callbacks.analysis.fmt import duration
from kprof_callbacks.analysis.series import read_series
from kprof_callbacks.recorder import Recorder
from kprof_callbacks.timing import StepTimer

SCHEDULE = dict(wait=2, warmup=1, active=3, repeat=3)  # windows end at steps 5, 11 and 17
WINDOW_ENDS = [5, 11, 17]
STEPS = 24
SLEEP = 0.010  # the loop's own work per step
STEP_COST = 0.001  # torch's profile.step(), every step
WINDOW_COST = 0.040  # the hand-off of a finished window, at its end


pytestmark = pytest.mark.usefixtures("one_thread")


class Clock:
    """Seconds that move only when told (``advance``)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch) -> Clock:
    """The session's steps timed on a ``Clock`` (the host timer, as without a GPU) that torch's ``profile.step()``
    moves by STEP_COST and the hand-off of each finished window by WINDOW_COST: kprof's own work, known exactly."""
    clock = Clock()
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    monkeypatch.setattr(metrics, "StepTimer", functools.partial(StepTimer, cuda=False))
    step, ready = torch.profiler.profile.step, Recorder._trace_ready

    def costly_step(self) -> None:
        clock.advance(STEP_COST)
        step(self)

    def costly_ready(self, prof) -> None:
        clock.advance(WINDOW_COST)
        ready(self, prof)

    monkeypatch.setattr(torch.profiler.profile, "step", costly_step)
    monkeypatch.setattr(Recorder, "_trace_ready", costly_ready)
    return clock


def _mlp() -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256))
    return model, torch.optim.SGD(model.parameters(), lr=0.01), torch.randn(64, 256)


def _work(clock: Clock, model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    """The fixed-cost step: 10 ms (data loading, say) and an MLP's training step."""
    clock.advance(SLEEP)
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()


def _series(run_dir) -> dict:
    (tags,) = read_series(run_dir).values()
    return tags


def _step_ms(tags: dict) -> np.ndarray:
    """Each step's time as the loop measures it: the step's own and, right after a window, what kprof charged to
    itself for the window's export (kprof/after_window_ms)."""
    step = tags[layout.STEP_TIME_TAG]
    export = tags.get(layout.AFTER_WINDOW_TAG)
    charged = np.zeros(step.values.size)
    if export is not None:
        charged[np.searchsorted(step.steps, export.steps)] = export.values
    return step.values + charged


def _check(tags: dict, mine: np.ndarray) -> None:
    """Each step's time is the loop's own work between two boundaries (``mine``, ms; NaN where not measured),
    whatever else the machine runs, and kprof's own work is in profiler_ms of the step it followed: torch's step
    after every step, a window's hand-off after its last."""
    step_ms, own_ms = _step_ms(tags), tags[layout.PROFILER_TAG].values
    assert tags[layout.PROFILER_TAG].steps.tolist() == list(range(STEPS))
    known = ~np.isnan(mine)
    np.testing.assert_allclose(step_ms[known], mine[known], atol=1e-4)
    np.testing.assert_allclose(step_ms, 1e3 * SLEEP, atol=1e-4)
    expected = np.full(STEPS, 1e3 * STEP_COST)
    expected[WINDOW_ENDS] += 1e3 * WINDOW_COST
    np.testing.assert_allclose(own_ms, expected, atol=1e-4)


def test_the_fixed_cost_loop_keeps_its_step_time_through_window_ends(tmp_path, clock):
    model, opt, x = _mlp()
    mine = []  # the loop's own time per step, measured around its own work
    start = clock.perf_counter()
    with kprof.session(tmp_path, run="fixed", **SCHEDULE) as s:
        for _ in range(STEPS):
            t0 = clock.perf_counter()
            _work(clock, model, opt, x)
            mine.append(clock.perf_counter() - t0)
            s.step()
    wall = clock.perf_counter() - start
    tags = _series(s.run_dir)
    _check(tags, 1e3 * np.array(mine))
    step_ms, own_ms = _step_ms(tags), tags[layout.PROFILER_TAG].values
    # wall = step + profiler: nothing is lost between the two (the session's start and stop are outside every step)
    assert step_ms.sum() + own_ms.sum() == pytest.approx(1e3 * wall, abs=1e-3)
    summary = s.summary()
    (cost,) = [d.message for d in summary.diagnostics if d.kind == "profiler_cost"]
    assert cost.startswith(f"Profiling cost the training thread {duration(own_ms.sum() * 1e3)} over 24 steps")
    assert f"a window cost {duration(np.median(own_ms[WINDOW_ENDS]) * 1e3)} at its end (median of 3" in cost


class _FixedCost(L.LightningModule):
    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.model, self.clock = _mlp()[0], clock

    def training_step(self, batch, batch_idx):
        self.clock.advance(SLEEP)
        return self.model(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class _Clock(L.Callback):
    """Notes when its ``on_train_batch_end`` runs: placed before kprof's callback, where a batch ends; after it,
    where the next one starts."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.times: list[float] = []

    def on_train_batch_end(self, *args) -> None:
        self.times.append(self.clock.perf_counter())


def test_the_fixed_cost_loop_under_lightning(tmp_path, clock):
    data = DataLoader(TensorDataset(torch.randn(STEPS * 64, 256)), batch_size=64)
    csv = CSVLogger(tmp_path, name="csv")
    ends, starts = _Clock(clock), _Clock(clock)
    trainer = L.Trainer(
        default_root_dir=tmp_path,
        logger=[TensorBoardLogger(tmp_path), csv],
        max_steps=STEPS,
        accelerator="cpu",  # the fixed-cost loop is CPU work, on any machine
        callbacks=[ends, kprof.ProfilerCallback(summary=False, **SCHEDULE), starts],
        log_every_n_steps=4,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    trainer.fit(_FixedCost(clock), data)
    (run,) = (tmp_path / "lightning_logs").glob("version_*/kprof/train")
    mine = np.r_[np.nan, 1e3 * (np.array(ends.times[1:]) - np.array(starts.times[:-1]))]
    _check(_series(run), mine)
    assert layout.PROFILER_TAG in (tmp_path / "csv" / "version_0" / "metrics.csv").read_text().splitlines()[0]


def test_the_slow_step_trigger_does_not_fire_on_a_window_end(tmp_path, monkeypatch, clock):
    """A window whose end blocks the training thread 80 ms (torch's stop on a big trace) is kprof's cost: the
    slow-step trigger, which sees steps without it, arms nothing after it."""
    results = torch_compat.window_results

    def slow_stop(prof):
        clock.advance(0.08)
        return results(prof)

    monkeypatch.setattr(torch_compat, "window_results", slow_stop)
    with kprof.session(
        tmp_path,
        run="r",
        trigger="slow_step",
        slow_factor=4.0,  # the 80 ms end, were it charged to the step, would make it 9x the others
        slow_min_steps=5,
        cooldown=0,
        warmup=1,
        active=2,
        max_captures=3,
    ) as s:
        for step in range(30):
            clock.advance(SLEEP)
            if step == 10:
                assert s.arm("by hand")
            s.step()
    assert [c.reason for c in s.captures] == ["by hand"]
    assert s.step_times[13] == pytest.approx(SLEEP)  # the window ended in step 12's s.step()


def test_step_timer_splits_each_step_from_the_callers_own_time(clock):
    timer = StepTimer(cuda=False)
    read = timer.reader(own=True)
    timer.start()
    for own in (0.0, 0.03, 0.0):
        clock.advance(0.01)
        timer.end()
        clock.advance(own)
        timer.start()
    start, rows = read()
    step_s, own_s = np.array(rows).T
    assert start == 0 and len(rows) == 3
    np.testing.assert_allclose(step_s, 0.01)  # the 30 ms after step 1 is in no step
    np.testing.assert_allclose(own_s, [0.0, 0.03, 0.0], atol=1e-12)
    timer.mark()
    assert timer.count == 4 and read()[1][0][1] == 0.0  # mark(): a boundary with no own time


def test_flops_that_cannot_be_a_step_are_refused_at_the_call(tmp_path):
    with kprof.session(tmp_path, run="r", wait=5) as s:
        for bad in (1e300, 10**400, float("inf"), float("nan"), -1.0, "1e9", True):
            with pytest.raises(ValueError, match="flops must be the FLOPs of one step"):
                s.step(flops=bad)
        s.step(flops=6e15)
        s.step(flops=10**18)
    assert s.steps == 2
    for bad in (1e300, 10**400, 0, float("nan")):
        with pytest.raises(ValueError, match="flops_per_batch must be the FLOPs of one step"):
            kprof.ProfilerCallback(flops_per_batch=bad)
