"""``kprof.ProfilerCallback``: profile a Lightning ``Trainer`` by adding one callback.

A thin adapter over ``Session``, given the LightningModule as its model (time by module needs no extra argument):
every training batch is one profiler step, the trainer's own profiler actions
(training_step, backward, zero_grad, data loading) and the optimizer update become ``record_function`` labels
while a window records, traces land in the TensorBoard logger's version folder, and step time and throughput
reach TensorBoard and the trainer's other loggers. It never talks to ``torch.profiler`` itself.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.profilers import Profiler, PyTorchProfiler
from lightning.pytorch.trainer.states import RunningStage

from . import layout, scalars
from .checks import check_bool
from .config import ProfileConfig
from .session import Session

STAGES = ("train", "validate", "test", "predict")
# Stages that can run inside one trainer call, in the order their loops start.
_CALL_STAGES = {"fit": ("train", "validate"), "validate": ("validate",), "test": ("test",), "predict": ("predict",)}
OPTIMIZER_LABEL = "optimizer_step"
_EVAL_STAGES = {RunningStage.VALIDATING: "validate", RunningStage.TESTING: "test", RunningStage.PREDICTING: "predict"}


class ProfilerCallback(Callback):
    r"""Profile training with ``kprof.session``: ``Trainer(callbacks=[kprof.ProfilerCallback(wait=1, active=3)])``.

    Args:
        stages: which loops to profile, each in its own run folder: ``"train"`` (default), ``"validate"``,
            ``"test"``, ``"predict"``. A step is one batch of that loop; with gradient accumulation a training
            step is still one batch (the optimizer steps every ``accumulate_grad_batches`` of them).
            torch records one profiler at a time, so inside ``fit`` validation is profiled only when
            ``"train"`` is not; profile it with ``trainer.validate()`` otherwise.
        logdir: where traces go, as Lightning's own callbacks choose their folders: an explicit ``logdir`` wins
            (``<logdir>/<run>/<stage>``); else the TensorBoard logger's version folder
            (``lightning_logs/version_N/<run>/<stage>``, ``run`` defaulting to ``"kprof"``), so
            ``tensorboard --logdir lightning_logs`` shows the scalars and the traces of one version together;
            else ``<trainer.default_root_dir>/log/<run>/<stage>`` (``run`` defaulting to a timestamp shared by all
            ranks).
        summary: print a short summary of each profiled stage (top operators, labels, step time) on rank 0
            when the trainer call ends.
        flops_per_batch: the floating-point operations of one training batch (forward and backward, e.g.
            ``6 * parameters * tokens`` for a transformer), for achieved TFLOP/s and MFU (``kprof/tflops``,
            ``kprof/mfu``) against the device's dense peak (``mfu_dtype``, or ``peak_tflops`` yourself).
        \**options: the keywords of ``kprof.session`` (``skip_first, wait, warmup, active, repeat,
            record_shapes, profile_memory, with_stack, with_flops, activities, run, enabled, scalars, trigger``
            ...), validated here. ``scalars=True`` (default) records ``kprof/step_time_ms`` (the batch
            without kprof's own cost, which is ``kprof/profiler_ms``), ``kprof/throughput_samples_per_s`` and
            memory (``kprof/mem_*``, every ``memory_every`` batches) for every training batch: as TensorBoard
            scalars beside the traces (written off the training thread; the kprof tab's step-time chart reads them
            there), and through ``log_metrics`` for the trainer's other loggers (CSV, W&B, MLflow, ...).
    """

    def __init__(
        self,
        *,
        stages: Iterable[str] = ("train",),
        logdir: str | Path | None = None,
        summary: bool = True,
        flops_per_batch: float | None = None,
        **options: Any,
    ) -> None:
        self.stages = _check_stages(stages)
        self.summary = check_bool("summary", summary)
        self.flops_per_batch = scalars.check_flops("flops_per_batch", flops_per_batch, zero=False)
        self._logdir = logdir
        self.config = ProfileConfig.from_kwargs(logdir="log" if logdir is None else logdir, **options)
        self._reset()

    def _reset(self) -> None:
        self._run_dir: Path | None = None  # <root>/<run>: one folder per trainer call, a subfolder per stage
        self._call_stages: list[str] = []  # the stages profiled in this trainer call
        self._tb_root: Path | None = None  # what to pass to `tensorboard --logdir`
        self._tb_logger: TensorBoardLogger | None = None  # the logger whose version folder holds the traces
        self._labels: _ActionLabels | None = None
        self._session: Session | None = None
        self._stage: str | None = None
        self._ready: dict[str, Session] = {}  # created at setup (so a bad logdir fails there), started later
        self._used: dict[str, Session] = {}  # the last session of each stage this call, for the summary
        self._hooks: list[Any] = []
        self._loggers: list = []  # the trainer's loggers other than the TensorBoard one holding the traces

    # -- trainer call --------------------------------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._reset()
        if not self.config.enabled:
            return
        if isinstance(trainer.profiler, PyTorchProfiler):
            raise ValueError(
                "ProfilerCallback cannot run with Trainer(profiler='pytorch') (Lightning's PyTorchProfiler): torch "
                "records one profiler per process. Drop one of them; ProfilerCallback already labels Lightning's "
                "training_step, backward, optimizer step, zero_grad and data loading in its traces."
            )
        stages = [s for s in _CALL_STAGES.get(stage, ()) if s in self.stages]
        if stages == ["train", "validate"]:
            stages.pop()
            warnings.warn(
                "kprof: validation inside fit is not profiled while training is (torch records one profiler at a "
                "time); profile it with trainer.validate(...) or ProfilerCallback(stages=('validate',))",
                UserWarning,
                stacklevel=2,
            )
        if not stages:
            return
        self._call_stages = stages
        self._run_dir, self._tb_root, self._tb_logger = self._folders(trainer)
        self._ready[stages[0]] = Session(self._stage_config(stages[0]), model=pl_module)
        self._labels = _ActionLabels(trainer.profiler)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._close(trainer)
        if self._used:
            trainer.strategy.barrier("kprof_callbacks")  # every rank's traces are on disk before rank 0 reads them
            if self.summary and trainer.is_global_zero:
                self._print_summaries()
        self._ready.clear()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        """Close the session (a window cut short is still saved) so the traces are complete and a later fit works."""
        had_session = self._session is not None
        self._close(trainer, exception)
        self._ready.clear()
        if had_session and trainer.is_global_zero:
            print(f"kprof: {type(exception).__name__} stopped the run; traces written so far are in {self._run_dir}")

    # -- training ------------------------------------------------------------------------------------------------
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._open(trainer, "train"):
            return
        self._hooks = [opt.register_step_post_hook(self._end_optimizer_label) for opt in trainer.optimizers]
        # TensorBoard reads the session's own scalars beside the traces; every other logger gets them from us
        self._loggers = [lg for lg in trainer.loggers if lg is not self._tb_logger] if self.config.scalars else []

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._stage != "train":
            return
        with self._session._step_boundary(_batch_size(batch), self.flops_per_batch):  # all of it is kprof's cost
            self._sync_labels(trainer)
            if self._loggers and self._session.steps % max(1, trainer.log_every_n_steps) == 0:
                self._log(self._session.new_step_metrics())

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if self._labels is not None and trainer.profiler is self._labels:
            self._labels.open(OPTIMIZER_LABEL)  # the closure (forward, backward) is done: the update starts

    def _end_optimizer_label(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._labels is not None:
            self._labels.close(OPTIMIZER_LABEL)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._stage == "train":
            self._close(trainer)

    # -- evaluation: one route for the validate, test and predict loops ------------------------------------------
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        stage = _EVAL_STAGES.get(trainer.state.stage)  # None while sanity checking
        if stage is not None:
            self._open(trainer, stage)

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self._stage is not None and self._stage == _EVAL_STAGES.get(trainer.state.stage):
            with self._session._step_boundary(_batch_size(batch), None):
                self._sync_labels(trainer)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._stage is not None and self._stage == _EVAL_STAGES.get(trainer.state.stage):
            self._close(trainer)

    on_test_start = on_predict_start = on_validation_start
    on_test_batch_end = on_predict_batch_end = on_validation_batch_end
    on_test_end = on_predict_end = on_validation_end

    # -- sessions ------------------------------------------------------------------------------------------------
    def _open(self, trainer: pl.Trainer, stage: str) -> bool:
        """Enter a session for ``stage`` if it is profiled in this call and no other session is running."""
        if self._session is not None or stage not in self._call_stages:
            return False
        session = self._ready.pop(stage, None) or Session(
            self._stage_config(stage), continues=self._used.get(stage), model=trainer.lightning_module
        )
        session.start()
        self._session, self._stage = session, stage
        self._used[stage] = session
        self._sync_labels(trainer)
        return True

    def _close(self, trainer: pl.Trainer, exception: BaseException | None = None) -> None:
        """Leave the running session (passing on ``exception``), drop the labels and hooks, restore the profiler."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if self._labels is not None:
            self._labels.close_all()
            if trainer.profiler is self._labels:
                trainer.profiler = self._labels.inner
        session, self._session, stage, self._stage = self._session, None, self._stage, None
        if session is None:
            return
        session.stop(exception)
        if stage == "train" and self._loggers:
            self._log(session.new_step_metrics())  # the session's stop waited for the last CUDA events

    def _log(self, rows: list[tuple[int, dict[str, float]]]) -> None:
        """Step scalars to the trainer's other loggers (CSV, W&B, MLflow, ...): step N is ``ProfilerStep#N``."""
        for step, metrics in rows:
            for logger in self._loggers:
                logger.log_metrics(metrics, step=step)

    def _sync_labels(self, trainer: pl.Trainer) -> None:
        """Label actions only while a window runs: outside windows the trainer's own profiler is untouched."""
        recording = self._session is not None and self._session.recording
        if recording and trainer.profiler is self._labels.inner:
            trainer.profiler = self._labels
        elif not recording and trainer.profiler is self._labels:
            trainer.profiler = self._labels.inner

    def _stage_config(self, stage: str) -> ProfileConfig:
        scalars = self.config.scalars and stage == "train"  # step times of evaluation loops are not logged
        return dataclasses.replace(self.config, logdir=str(self._run_dir), run=stage, scalars=scalars)

    def _folders(self, trainer: pl.Trainer) -> tuple[Path, Path, TensorBoardLogger | None]:
        """``(<root>/<run>, what tensorboard --logdir takes, the TensorBoard logger holding them)``, on every rank."""
        tb = next((lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)), None)
        if self._logdir is None and tb is not None:
            version_dir = Path(trainer.strategy.broadcast(tb.log_dir))
            return version_dir / (self.config.run or "kprof"), Path(tb.root_dir), tb
        root = Path(self._logdir) if self._logdir is not None else Path(trainer.default_root_dir) / "log"
        return root / (self.config.run or layout.shared_run_name(root)), root, None

    def _print_summaries(self) -> None:
        from .tensorboard.launch import open_hint

        for stage, session in self._used.items():
            if not layout.contents(session.run_dir).traces:  # every rank's; a failed write was warned of
                print(f"kprof: no {stage} traces in {session.run_dir} (no profiling window was completed or saved)")
                continue
            try:
                text = str(session.summary())
            except Exception as exc:  # a summary is a convenience: never fail the run for it
                warnings.warn(f"kprof: could not summarize {session.run_dir}: {exc}", RuntimeWarning, stacklevel=2)
                continue
            print(f"kprof: {stage} traces in {session.run_dir}\n{text}")
        print("kprof: " + open_hint(self._tb_root))


class _ActionLabels(Profiler):
    """Stands in for ``trainer.profiler`` during profiling windows: runs it, and labels the actions kprof shows."""

    def __init__(self, inner: Profiler) -> None:
        super().__init__()
        self.inner = inner
        self._open: dict[str, torch.profiler.record_function] = {}
        self._names: dict[str, str | None] = {}

    def start(self, action_name: str) -> None:
        self.inner.start(action_name)
        label = self._label(action_name)
        if label is not None:
            self.open(label)

    def stop(self, action_name: str) -> None:
        label = self._label(action_name)
        if label is not None:
            self.close(label)
        elif action_name.rpartition(".")[2] == OPTIMIZER_LABEL:
            self.close(OPTIMIZER_LABEL)  # the optimizer skipped its step (e.g. AMP found inf gradients)
        self.inner.stop(action_name)

    def summary(self) -> str:
        return self.inner.summary()

    def open(self, label: str) -> None:
        if label not in self._open:
            record = torch.profiler.record_function(label)
            record.__enter__()
            self._open[label] = record

    def close(self, label: str) -> None:
        record = self._open.pop(label, None)
        if record is not None:
            record.__exit__(None, None, None)

    def close_all(self) -> None:
        for label in reversed(list(self._open)):
            self.close(label)

    def _label(self, action_name: str) -> str | None:
        try:
            return self._names[action_name]
        except KeyError:
            label = self._names[action_name] = _label_for(action_name)
            return label


def _label_for(action_name: str) -> str | None:
    """Trace label for a Lightning profiler action, e.g. ``[Strategy]DDPStrategy.backward`` -> ``backward``."""
    hook = action_name.rpartition(".")[2]
    if hook in ("training_step", "validation_step", "test_step", "predict_step", "backward"):
        return hook
    if hook == "optimizer_zero_grad":
        return "zero_grad"
    if action_name.startswith("[_") and hook.endswith("_next"):  # [_TrainingEpochLoop].train_dataloader_next
        return "data_loading"
    return None


def _check_stages(stages: Iterable[str]) -> tuple[str, ...]:
    if isinstance(stages, str) or not isinstance(stages, Iterable):
        raise TypeError(f"stages must be a tuple of stage names such as ('train', 'validate'), got {stages!r}")
    stages = tuple(stages)
    unknown = [s for s in stages if s not in STAGES]
    if unknown or not stages:
        raise ValueError(f"stages must be a non-empty subset of {STAGES}, got {stages!r}")
    return stages


def _batch_size(batch: Any) -> int | None:
    """Leading size of the first tensor in ``batch`` (a tensor, or one inside lists, tuples, dicts), if any."""
    while not isinstance(batch, torch.Tensor):
        if isinstance(batch, Mapping):
            batch = next(iter(batch.values()), None)
        elif isinstance(batch, (list, tuple)) and batch:
            batch = batch[0]
        else:
            return None
    return int(batch.shape[0]) if batch.dim() else None
