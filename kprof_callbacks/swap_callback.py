"""``kprof.SwapCallback``: swap kprof's kernel layers into a Lightning model, with one callback.

Lightning calls ``setup`` before ``configure_model``, before a checkpoint is restored and before the strategy
builds the optimizers and wraps the model (DDP, FSDP): swapping there means the optimizer holds the swapped layers'
parameters, ``fit(ckpt_path=...)`` restores into them (the swapped layers keep the torch layers' state_dict keys,
so checkpoints load with and without the callback), and every rank swaps the same layers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info

from .checks import check_bool
from .kernels import check_impl
from .swap import swap


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
        if getattr(pl_module, "kprof_swap_report", None) is not None:  # a second trainer call: swapped already
            return
        swap(pl_module, self.mapping, inplace=True, fallback=self.fallback, impl=self.impl)
        self.report = pl_module.kprof_swap_report
        rank_zero_info(str(self.report))
        for logger in trainer.loggers:
            logger.log_hyperparams({"kprof_swap/swapped": len(self.report.swapped),
                                    "kprof_swap/skipped": len(self.report.skipped)})

    def state_dict(self) -> dict[str, Any]:
        return {}  # nothing to restore: the swap is redone from the model at every setup
