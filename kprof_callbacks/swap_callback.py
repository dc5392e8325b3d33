"""``kprof.SwapCallback``: swap kprof's kernel layers into a Lightning model, with one callback.

Lightning calls ``setup`` before ``configure_model``, before a checkpoint is restored and before the strategy
builds the optimizers and wraps the model (DDP, FSDP): swapping there means the optimizer holds the swapped layers'
parameters, ``fit(ckpt_path=...)`` restores into them (the swapped layers keep the torch layers' state_dict keys,
so checkpoints load with and without the callback), and every rank swaps the same layers. A model that builds its
layers in ``configure_model`` is swapped right after that hook instead, still before any of those.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.model_helpers import is_overridden

from .checks import check_bool
from .kernels import check_impl
from .swap import DEFAULT_LAYERS, swap


class SwapCallback(Callback):
    """Swap torch layers for kprof's kernel layers when the trainer sets the model up.

    Args:
        mapping: torch layer type -> kernel layer, as ``kprof.swap`` takes it (None: ``swap``'s default layers).
        fallback: keep a torch layer (with a warning) where its kernel cannot be built, instead of failing the fit.
        impl: the implementation the kernel layers run (None: by device; "cuda", "cpp", "triton", "torch").
    """

    def __init__(self, mapping: Mapping | None = None, fallback: bool = True, impl: str | None = None) -> None:
        self.mapping = mapping
        self.fallback = check_bool("fallback", fallback)
        self.impl = check_impl(impl)
        self.report = None  # the last swap's kprof.swap report

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if is_overridden("configure_model", pl_module):  # the layers do not exist yet: swap once they do
            configure_model = pl_module.configure_model

            def configure_then_swap() -> None:
                try:
                    configure_model()
                finally:
                    vars(pl_module).pop("configure_model", None)  # the class's own hook again
                self._swap(trainer, pl_module)

            pl_module.configure_model = configure_then_swap
            return
        self._swap(trainer, pl_module)

    def _swap(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if getattr(pl_module, "kprof_swap_report", None) is not None:  # a second trainer call: swapped already
            return
        swap(pl_module, self.mapping, inplace=True, fallback=self.fallback, impl=self.impl)
        self.report = pl_module.kprof_swap_report
        rank_zero_info(str(self.report))
        if not (self.report.swapped or self.report.skipped):
            layers = ", ".join(sorted(t.__name__ for t in (DEFAULT_LAYERS if self.mapping is None else self.mapping)))
            rank_zero_warn(
                f"kprof.SwapCallback found no layer to swap in {type(pl_module).__name__} (it looks for "
                f"{layers}): the torch layers train as they are. Layers made after configure_model, "
                "e.g. in forward, are not seen"
            )
        for logger in trainer.loggers:
            logger.log_hyperparams(
                {"kprof_swap/swapped": len(self.report.swapped), "kprof_swap/skipped": len(self.report.skipped)}
            )

    def state_dict(self) -> dict[str, Any]:
        return {}  # nothing to restore: the swap is redone from the model at every setup
