"""kprof.ProfilerCallback on real (tiny) Lightning fits on CPU: folders, labels, scalars, stages, faults, resume."""

from __future__ import annotations

import csv
import json
import signal
import time
from collections import Counter
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.profilers import PassThroughProfiler, SimpleProfiler
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kprof_callbacks as kprof
from kprof_callbacks.layout import PARTIAL
from kprof_callbacks.session import Session

BATCH = 8
LIGHTNING_LABELS = {"training_step", "backward", "optimizer_step", "zero_grad", "data_loading"}


class TinyModel(L.LightningModule):
    """Linear regression; ``fail_at`` raises that exception type in the training_step of that batch index."""

    def __init__(self, fail_at: dict[int, type[BaseException]] | None = None) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        self.fail_at = fail_at or {}
        self.training_steps = 0

    def training_step(self, batch, batch_idx):
        if batch_idx in self.fail_at:
            raise self.fail_at[batch_idx](f"stop at batch {batch_idx}")
        self.training_steps += 1
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def test_step(self, batch, batch_idx):
        self.validation_step(batch, batch_idx)

    def predict_step(self, batch, batch_idx):
        return self.net(batch[0])

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def loader(batches: int = 16) -> DataLoader:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batches * BATCH, 16, generator=gen)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=BATCH)


def trainer(tmp_path: Path, callbacks: list, **kwargs) -> L.Trainer:
    options = dict(
        default_root_dir=tmp_path,
        logger=TensorBoardLogger(tmp_path),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        max_epochs=1,
    )
    options.update(kwargs)
    return L.Trainer(callbacks=callbacks, **options)


def traces(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.pt.trace.json"))


def labels(path: Path) -> Counter:
    """record_function ranges in a trace, by name."""
    events = json.loads(path.read_text())["traceEvents"]
    return Counter(e["name"] for e in events if e.get("cat") == "user_annotation")


def no_profiler_left() -> bool:
    return Session._active is None and not torch.autograd.profiler._is_profiler_enabled


def test_traces_with_lightning_labels_go_into_the_tensorboard_version_folder(tmp_path, capsys):
    cb = kprof.ProfilerCallback(wait=1, warmup=1, active=3, repeat=2)
    trainer(tmp_path, [cb], max_steps=12).fit(TinyModel(), loader())

    run_dir = tmp_path / "lightning_logs" / "version_0" / "kprof" / "train"
    files = traces(run_dir)
    assert len(files) == 2  # one per cycle of repeat=2
    for f in files:
        found = labels(f)
        assert LIGHTNING_LABELS <= set(found), found
        assert found["training_step"] == found["optimizer_step"] == 3  # active=3 batches, one update each
    assert not list(run_dir.glob(f"*{PARTIAL}"))
    scalars = EventAccumulator(str(run_dir)).Reload()  # step time beside the traces, where the kprof tab reads it
    assert [e.step for e in scalars.Scalars("kprof/step_time_ms")] == list(range(12))
    assert len(scalars.Scalars("kprof/throughput_samples_per_s")) == 12
    out = capsys.readouterr().out
    assert f"kprof: train traces in {run_dir}" in out
    assert "training_step" in out and "optimizer_step" in out  # the labels table of the summary
    assert f"kprof tensorboard {tmp_path / 'lightning_logs'}" in out and "/#kprof" in out
    assert no_profiler_left()


def test_labels_cost_nothing_outside_windows_and_the_users_profiler_keeps_working(tmp_path):
    seen = []

    class Spy(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            seen.append(type(trainer.profiler).__name__)

    cb = kprof.ProfilerCallback(wait=2, warmup=1, active=2, summary=False)
    t = trainer(tmp_path, [cb, Spy()], max_steps=10, profiler="simple")
    t.fit(TinyModel(), loader())

    # batches 3-5 are the window (warm-up + 2 recorded): only then does the label profiler stand in
    assert seen == ["SimpleProfiler"] * 2 + ["_ActionLabels"] * 3 + ["SimpleProfiler"] * 5
    assert isinstance(t.profiler, SimpleProfiler)  # restored
    durations = t.profiler.recorded_durations
    assert len(durations["[Strategy]SingleDeviceStrategy.training_step"]) == 10  # windows included
    assert len(durations["[_TrainingEpochLoop].train_dataloader_next"]) >= 10


def test_step_time_and_throughput_reach_the_trainers_logger_for_every_step(tmp_path):
    cb = kprof.ProfilerCallback(logdir=tmp_path / "traces", run="csv", wait=1, warmup=1, active=2, summary=False)
    t = trainer(tmp_path, [cb], max_steps=12, logger=CSVLogger(tmp_path), log_every_n_steps=5)
    t.fit(TinyModel(), loader())

    rows = list(csv.DictReader(open(Path(t.logger.log_dir) / "metrics.csv")))
    timed = {int(r["step"]): r for r in rows if r.get("kprof/step_time_ms")}
    assert sorted(timed) == list(range(12))  # every batch, numbered like ProfilerStep#N in the traces
    for r in timed.values():
        ms, rate = float(r["kprof/step_time_ms"]), float(r["kprof/throughput_samples_per_s"])
        assert ms > 0 and rate == pytest.approx(BATCH / (ms / 1e3), rel=1e-6)
    assert len(traces(tmp_path / "traces" / "csv" / "train")) == 1  # explicit logdir wins: <logdir>/<run>/<stage>


def test_without_a_tensorboard_logger_traces_go_under_the_trainers_default_root_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a trace written relative to the working directory would land here
    root = tmp_path / "root"
    cb = kprof.ProfilerCallback(wait=1, warmup=1, active=2, summary=False)
    trainer(root, [cb], max_steps=6, logger=CSVLogger(root)).fit(TinyModel(), loader())
    (run,) = (root / "log").iterdir()  # <default_root_dir>/log/<timestamp shared by the ranks>/<stage>
    assert len(traces(run / "train")) == 1
    assert not (tmp_path / "log").exists()


def test_a_step_is_a_batch_under_gradient_accumulation(tmp_path):
    cb = kprof.ProfilerCallback(wait=1, warmup=1, active=4, summary=False)
    trainer(tmp_path, [cb], max_steps=4, accumulate_grad_batches=2).fit(TinyModel(), loader())

    (trace,) = traces(tmp_path / "lightning_logs" / "version_0" / "kprof" / "train")
    found = labels(trace)
    assert found["training_step"] == found["backward"] == 4  # four batches recorded
    assert found["optimizer_step"] == found["zero_grad"] == 2  # ... holding two optimizer steps


def test_fast_dev_run_and_a_window_cut_short_by_max_steps(tmp_path, monkeypatch, capsys, recwarn):
    monkeypatch.chdir(tmp_path)
    cb = kprof.ProfilerCallback(wait=1, warmup=1, active=3)
    L.Trainer(fast_dev_run=True, callbacks=[cb], enable_progress_bar=False).fit(TinyModel(), loader())
    assert no_profiler_left()
    (run,) = (tmp_path / "log").iterdir()  # no logger: log/<timestamp>/train
    assert traces(run / "train") == []  # one batch never reaches the window: said plainly, not warned about
    assert "kprof: no train traces" in capsys.readouterr().out
    assert not [w for w in recwarn if "kprof" in str(w.message)]

    cb = kprof.ProfilerCallback(wait=1, warmup=1, active=3, summary=False)
    trainer(tmp_path, [cb], max_steps=3).fit(TinyModel(), loader())
    (trace,) = traces(tmp_path / "lightning_logs" / "version_0" / "kprof" / "train")
    assert labels(trace)["training_step"] == 1  # fit ended inside the window: its recorded step is saved


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_an_interrupted_fit_keeps_its_traces_and_a_later_fit_profiles_again(tmp_path, error):
    cb = kprof.ProfilerCallback(wait=1, warmup=1, active=3, repeat=2, summary=False)
    model = TinyModel(fail_at={7: error})  # second window: warm-up at batch 6, fails in its first recorded batch
    handler = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit if error is KeyboardInterrupt else RuntimeError):
            trainer(tmp_path, [cb], max_steps=12).fit(model, loader())
    finally:
        signal.signal(signal.SIGINT, handler)  # Lightning ignores Ctrl-C while it shuts down

    assert no_profiler_left()
    run_dir = tmp_path / "lightning_logs" / "version_0" / "kprof" / "train"
    files = traces(run_dir)
    assert len(files) == 2 and not list(run_dir.glob(f"*{PARTIAL}"))
    assert labels(files[0])["training_step"] == 3
    cut_short = labels(files[1])  # the window the error cut short: saved, readable, its failed step labelled
    assert cut_short["data_loading"] == cut_short["training_step"] == 1 and not cut_short["backward"]

    t = trainer(tmp_path, [cb], max_steps=6)
    t.fit(TinyModel(), loader())
    assert isinstance(t.profiler, PassThroughProfiler)
    assert len(traces(tmp_path / "lightning_logs" / "version_1" / "kprof" / "train")) == 1


def test_resume_from_checkpoint(tmp_path):
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=4, save_top_k=-1)
    cb = kprof.ProfilerCallback(wait=1, warmup=1, active=2, summary=False)
    trainer(tmp_path, [cb, ckpt], max_steps=4, enable_checkpointing=True).fit(TinyModel(), loader())
    (path,) = (tmp_path / "ckpt").glob("*.ckpt")
    assert not any("ProfilerCallback" in key for key in torch.load(path, weights_only=False)["callbacks"])

    model = TinyModel()
    cb = kprof.ProfilerCallback(logdir=tmp_path / "traces", run="resumed", wait=1, warmup=1, active=2, summary=False)
    second = trainer(tmp_path, [cb], max_steps=10, logger=CSVLogger(tmp_path, name="csv"), log_every_n_steps=1)
    second.fit(model, loader(), ckpt_path=path)
    assert model.training_steps == 6 and second.global_step == 10
    rows = csv.DictReader(open(Path(second.logger.log_dir) / "metrics.csv"))
    assert sorted(int(r["step"]) for r in rows if r.get("kprof/step_time_ms")) == list(range(6))
    assert len(traces(tmp_path / "traces" / "resumed" / "train")) == 1  # the schedule counts from the resumed batch


def test_evaluation_stages_get_their_own_run_folders(tmp_path, capsys):
    cb = kprof.ProfilerCallback(stages=("validate", "test", "predict"), wait=0, warmup=1, active=2, run="eval")
    t = trainer(tmp_path, [cb])
    t.validate(TinyModel(), loader(6))
    t.test(TinyModel(), loader(6))
    t.predict(TinyModel(), loader(6))

    root = tmp_path / "lightning_logs" / "version_0" / "eval"
    out = capsys.readouterr().out
    for stage, step in (("validate", "validation_step"), ("test", "test_step"), ("predict", "predict_step")):
        (trace,) = traces(root / stage)
        found = labels(trace)
        assert found[step] == found["data_loading"] == 2 and sum(found[s] for s in LIGHTNING_LABELS) == 2, found
        assert f"kprof: {stage} traces in {root / stage}" in out
    assert not (root / "train").exists()


def test_validation_inside_fit(tmp_path):
    cb = kprof.ProfilerCallback(stages=("validate",), wait=0, warmup=1, active=2, summary=False)
    fit = dict(max_epochs=2, limit_train_batches=4, limit_val_batches=3, num_sanity_val_steps=2)
    trainer(tmp_path, [cb], **fit).fit(TinyModel(), loader(), loader(6))
    root = tmp_path / "lightning_logs" / "version_0" / "kprof"
    assert len(traces(root / "validate")) == 2  # one window per validation loop, none for the sanity check
    assert not (root / "train").exists()

    both = kprof.ProfilerCallback(stages=("train", "validate"), summary=False)
    with pytest.warns(UserWarning, match="validation inside fit is not profiled while training is"):
        trainer(tmp_path, [both], **fit).fit(TinyModel(), loader(), loader(6))
    root = tmp_path / "lightning_logs" / "version_1" / "kprof"
    assert traces(root / "train") and not (root / "validate").exists()


def test_a_training_step_that_ran_validation_is_named_not_called_slow(tmp_path):
    """Lightning validates inside the training batch that ends the interval: the summary says so."""

    class SlowValidation(TinyModel):
        def validation_step(self, batch, batch_idx):
            time.sleep(0.02)
            super().validation_step(batch, batch_idx)

    cb = kprof.ProfilerCallback(wait=1, warmup=1, active=5, summary=False)
    trainer(tmp_path, [cb], max_steps=8, val_check_interval=4, limit_val_batches=4, num_sanity_val_steps=0).fit(
        SlowValidation(), loader(), loader(4)
    )
    summary = kprof.summarize(tmp_path / "lightning_logs" / "version_0" / "kprof" / "train")
    kinds = {d.kind: d.message for d in summary.diagnostics}
    assert "eval_in_step" in kinds and "slow_step" not in kinds, kinds
    # validation runs after batch 3's on_train_batch_end, so inside ProfilerStep#4's range
    assert "Step 4" in kinds["eval_in_step"] and "4 validation/test/predict steps" in kinds["eval_in_step"]


def test_disabled_by_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("KPROF", "0")
    cb = kprof.ProfilerCallback()
    t = trainer(tmp_path, [cb], max_steps=6)
    t.fit(TinyModel(), loader())
    assert not (tmp_path / "lightning_logs" / "version_0" / "kprof").exists()
    assert isinstance(t.profiler, PassThroughProfiler)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(wiat=1), TypeError, "unknown profiling option.*wiat"),
        (dict(active=0), ValueError, "active must be >= 1"),
        (dict(repeat="2"), TypeError, "repeat must be int"),
        (dict(run="a/b"), ValueError, "run must be a plain folder name"),
        (dict(stages="train"), TypeError, "stages must be a tuple"),
        (dict(stages=("training",)), ValueError, "stages must be a non-empty subset"),
        (dict(stages=()), ValueError, "stages must be a non-empty subset"),
        (dict(summary="yes"), TypeError, "summary must be True or False"),
    ],
)
def test_bad_input_fails_at_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        kprof.ProfilerCallback(**kwargs)


def test_lightnings_pytorch_profiler_is_refused_before_any_step(tmp_path):
    model = TinyModel()
    t = trainer(tmp_path, [kprof.ProfilerCallback()], max_steps=4, profiler="pytorch")
    with pytest.raises(ValueError, match=r"profiler='pytorch'"):
        t.fit(model, loader())
    assert model.training_steps == 0 and no_profiler_left()
    # PyTorchProfiler entered an idle torch.profiler on the trainer's first action (before any callback hook) and
    # cannot tear an idle one down: its __del__ would raise AssertionError. Drop it the way its teardown would.
    t.profiler.profiler = None
