"""kprof never charges its own cost to the training: a loop of known cost, plain and under Lightning, keeps its step
time through every window's start and end, and ``kprof/profiler_ms`` carries what the windows cost."""

from __future__ import annotations

import functools
import importlib
import statistics
import time

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kprof_callbacks as kprof
from kprof_callbacks import layout, torch_compat
from kprof_callbacks.analysis.fmt import duration
from kprof_callbacks.analysis.series import read_series
from kprof_callbacks.timing import StepTimer

SCHEDULE = dict(wait=2, warmup=1, active=3, repeat=3)  # windows end at steps 5, 11 and 17
WINDOW_ENDS = [5, 11, 17]
STEPS = 24
SLEEP = 0.010


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def host_clock(monkeypatch):
    """The fixed-cost loop is CPU work, so its steps are timed on the host clock, as on a machine without a GPU. On
    a GPU machine a session times steps with CUDA events, and the events of a loop that launches nothing are stamped
    when the GPU gets to them: in a GPU test suite, a GPU shared by 28 workers, up to ~6 ms late."""
    session_module = importlib.import_module("kprof_callbacks.session")  # the package's `session` is the function
    monkeypatch.setattr(session_module, "StepTimer", functools.partial(StepTimer, cuda=False))


def _slow_steps(diagnostics) -> set[int]:
    """The steps the slow-step findings name ("Step 10 took ...")."""
    return {int(d.message.split()[1]) for d in diagnostics if d.kind == "slow_step"}


# where a window's start and stop land: its first and last steps. A slow step there is kprof's cost called slow; a
# slow step elsewhere is the machine (a loaded test machine has some), which the tests do not hold against kprof.
WINDOW_EDGES = {end - k for end in WINDOW_ENDS for k in (0, SCHEDULE["active"] - 1)}


def _mlp() -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256))
    return model, torch.optim.SGD(model.parameters(), lr=0.01), torch.randn(64, 256)


def _work(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    """The fixed-cost step: a 10 ms sleep (data loading, say) and an MLP's training step."""
    time.sleep(SLEEP)
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
    whatever else the machine runs, and each window's cost is in profiler_ms of its last step."""
    step_ms, own_ms = _step_ms(tags), tags[layout.PROFILER_TAG].values
    assert tags[layout.PROFILER_TAG].steps.tolist() == list(range(STEPS))
    known = ~np.isnan(mine)
    # a few us of loop between the two; a ms or two of page faults: the export's fork leaves pages copy-on-write
    assert np.abs(step_ms - mine)[known].max() < 3.0, np.c_[step_ms, mine]
    quiet = np.delete(own_ms, WINDOW_ENDS)
    assert np.median(own_ms[WINDOW_ENDS]) >= 5 * max(np.median(quiet), 0.05), (own_ms[WINDOW_ENDS], np.median(quiet))


def test_the_fixed_cost_loop_keeps_its_step_time_through_window_ends(tmp_path, host_clock):
    model, opt, x = _mlp()
    mine = []  # the loop's own time per step, measured around its own work
    start = time.perf_counter()
    with kprof.session(tmp_path, run="fixed", **SCHEDULE) as s:
        for _ in range(STEPS):
            t0 = time.perf_counter()
            _work(model, opt, x)
            mine.append(time.perf_counter() - t0)
            s.step()
    wall = time.perf_counter() - start
    tags = _series(s.run_dir)
    _check(tags, 1e3 * np.array(mine))
    step_ms, own_ms = _step_ms(tags), tags[layout.PROFILER_TAG].values
    # wall = step + profiler: nothing is lost between the two (the session's start and stop are outside every step)
    assert step_ms.sum() + own_ms.sum() <= 1e3 * wall < step_ms.sum() + own_ms.sum() + 2000
    summary = s.summary()
    assert not _slow_steps(summary.diagnostics) & WINDOW_EDGES
    (cost,) = [d.message for d in summary.diagnostics if d.kind == "profiler_cost"]
    assert cost.startswith(f"Profiling cost the training thread {duration(own_ms.sum() * 1e3)} over 24 steps")
    assert f"a window cost {duration(np.median(own_ms[WINDOW_ENDS]) * 1e3)} at its end (median of 3" in cost


class _FixedCost(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model, _, _ = _mlp()

    def training_step(self, batch, batch_idx):
        time.sleep(SLEEP)
        return self.model(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class _Clock(L.Callback):
    """Notes when its ``on_train_batch_end`` runs: placed before kprof's callback, where a batch ends; after it,
    where the next one starts."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def on_train_batch_end(self, *args) -> None:
        self.times.append(time.perf_counter())


def test_the_fixed_cost_loop_under_lightning(tmp_path, host_clock):
    data = DataLoader(TensorDataset(torch.randn(STEPS * 64, 256)), batch_size=64)
    csv = CSVLogger(tmp_path, name="csv")
    ends, starts = _Clock(), _Clock()
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
    trainer.fit(_FixedCost(), data)
    (run,) = (tmp_path / "lightning_logs").glob("version_*/kprof/train")
    mine = np.r_[np.nan, 1e3 * (np.array(ends.times[1:]) - np.array(starts.times[:-1]))]
    _check(_series(run), mine)
    assert layout.PROFILER_TAG in (tmp_path / "csv" / "version_0" / "metrics.csv").read_text().splitlines()[0]
    assert not _slow_steps(kprof.summarize(run).diagnostics) & WINDOW_EDGES


def test_the_slow_step_trigger_does_not_fire_on_a_window_end(tmp_path, monkeypatch):
    """A window whose end blocks the training thread 80 ms (torch's stop on a big trace) is kprof's cost: the
    slow-step trigger, which sees steps without it, arms nothing after it."""
    results = torch_compat.window_results

    def slow_stop(prof):
        time.sleep(0.08)
        return results(prof)

    monkeypatch.setattr(torch_compat, "window_results", slow_stop)
    with kprof.session(
        tmp_path,
        run="r",
        trigger="slow_step",
        slow_factor=4.0,  # the 80 ms end would be 8x a step; a loaded machine's hiccups stay below 4x
        slow_min_steps=5,
        cooldown=0,
        warmup=1,
        active=2,
        max_captures=3,
    ) as s:
        for step in range(30):
            time.sleep(SLEEP)
            if step == 10:
                assert s.arm("by hand")
            s.step()
    assert [c.reason for c in s.captures] == ["by hand"]
    assert s.step_times[13] < 2 * statistics.median(s.step_times)  # the window ended in step 12's s.step()


def test_step_timer_splits_each_step_from_the_callers_own_time():
    timer = StepTimer(cuda=False)
    read = timer.reader(own=True)
    timer.start()
    for own in (0.0, 0.03, 0.0):
        time.sleep(0.01)
        timer.end()
        time.sleep(own)
        timer.start()
    start, rows = read()
    step_s, own_s = np.array(rows).T
    assert start == 0 and len(rows) == 3
    assert (step_s >= 0.01).all() and (step_s < 0.025).all()  # the 30 ms after step 1 is in no step
    assert own_s[1] >= 0.03 and own_s[0] < 0.01 and own_s[2] < 0.01
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
