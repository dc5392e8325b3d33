"""kprof.SwapCallback: a Lightning fit trains the swapped layers, checkpoints load with and without the callback,
ckpt_path resume works, and every DDP rank swaps the same layers."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kprof_callbacks as kprof
from kprof_callbacks import kernels


class Net(L.LightningModule):
    """Pre-norm MLP block: a LayerNorm and a GELU for the callback to swap."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.norm, self.up, self.act, self.down = nn.LayerNorm(16), nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 1)
        self.optimized: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(self.norm(x))))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self):
        self.optimized = [id(p) for p in self.parameters()]  # what the optimizer got, for the test
        return torch.optim.SGD(self.parameters(), lr=0.1)


def data() -> DataLoader:
    x = torch.randn(24, 16, generator=torch.Generator().manual_seed(0))  # 3 batches an epoch
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)


def trainer(tmp_path, callbacks, **kwargs) -> L.Trainer:
    options = dict(
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        max_steps=6,
    )
    return L.Trainer(callbacks=callbacks, **{**options, **kwargs})


def test_the_fit_trains_the_swapped_layers_and_the_optimizer_holds_their_parameters(tmp_path, capsys):
    model, callback = Net(), kprof.SwapCallback()
    before = model.norm.weight.detach().clone()
    trainer(tmp_path, [callback]).fit(model, data())
    assert isinstance(model.norm, kernels.LayerNorm) and isinstance(model.act, kernels.GELU)
    assert model.optimized == [id(p) for p in model.parameters()]
    assert not torch.equal(model.norm.weight, before)  # trained
    assert "kprof.swap: 2 swapped" in capsys.readouterr().err + str(callback.report)


def test_checkpoints_load_with_and_without_the_callback_and_resume(tmp_path):
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=3, save_top_k=-1)
    swapped = Net()
    trainer(tmp_path, [kprof.SwapCallback(), ckpt], enable_checkpointing=True).fit(swapped, data())
    path = tmp_path / "ckpt" / "epoch=0-step=3.ckpt"  # the end of epoch 0: the resumed fit replays epoch 1
    plain = Net()
    plain.load_state_dict(torch.load(path, weights_only=False)["state_dict"])  # strict: same keys as torch's layers
    assert isinstance(plain.norm, nn.LayerNorm)

    resumed = Net()
    trainer(tmp_path, [kprof.SwapCallback()]).fit(resumed, data(), ckpt_path=path)
    assert isinstance(resumed.norm, kernels.LayerNorm)
    torch.testing.assert_close(resumed.norm.weight, swapped.norm.weight)  # steps 4-6 again, from the same state


class BuiltInConfigureModel(Net):
    """Net whose layers are made in configure_model (as for FSDP / meta-device init): none exist at setup."""

    def __init__(self) -> None:
        L.LightningModule.__init__(self)
        self.optimized: list[int] = []
        self.norm = None

    def configure_model(self) -> None:
        if self.norm is None:  # Lightning asks for it to be idempotent: it runs for every trainer call
            torch.manual_seed(0)
            self.norm, self.up, self.act, self.down = nn.LayerNorm(16), nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 1)


def test_layers_built_in_configure_model_are_swapped_before_the_optimizer_is_made(tmp_path):
    """It said "kprof.swap: 0 swapped, 0 skipped" and the torch layers trained, with no warning."""
    model, callback = BuiltInConfigureModel(), kprof.SwapCallback()
    trainer(tmp_path, [callback]).fit(model, data())
    assert isinstance(model.norm, kernels.LayerNorm) and isinstance(model.act, kernels.GELU)
    assert model.optimized == [id(p) for p in model.parameters()]
    assert str(callback.report).startswith("kprof.swap: 2 swapped")
    assert "configure_model" not in vars(model)  # the hook is the class's own again
    swapped = model.norm
    trainer(tmp_path, [callback]).fit(model, data())  # a later trainer call swaps nothing twice
    assert model.norm is swapped and model.optimized == [id(p) for p in model.parameters()]


def test_a_model_with_nothing_to_swap_gets_a_warning(tmp_path):
    class Plain(Net):
        def __init__(self) -> None:
            super().__init__()
            self.norm, self.act = nn.Identity(), nn.ReLU()

    with pytest.warns(UserWarning, match="found no layer to swap in Plain"):
        trainer(tmp_path, [kprof.SwapCallback()]).fit(Plain(), data())


def test_bad_arguments_fail_when_the_callback_is_built():
    with pytest.raises(TypeError, match="fallback"):
        kprof.SwapCallback(fallback="yes")
    with pytest.raises(ValueError, match="impl"):
        kprof.SwapCallback(impl="fortran")


DDP = textwrap.dedent(
    """
    import os
    import sys
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    sys.path.insert(0, sys.argv[2])
    from test_swap_callback import Net, data
    import kprof_callbacks as kprof

    if __name__ == "__main__":
        model = Net()
        trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=4, default_root_dir=sys.argv[1],
                            logger=False, enable_progress_bar=False, enable_model_summary=False,
                            enable_checkpointing=False, callbacks=[kprof.SwapCallback()])
        trainer.fit(model, data())
        kinds = " ".join(f"{type(m).__module__}.{type(m).__name__}" for m in (model.norm, model.act))
        line = f"rank {trainer.global_rank}: {kinds} {model.norm.weight.sum().item():.6f}\\n"  # swapped, trained
        os.write(1, line.encode())  # one write: both ranks share the pipe, and print's text and newline can interleave
    """
)


def test_ddp_every_rank_swaps_and_trains_the_same_layers(tmp_path):
    script = tmp_path / "swap_ddp.py"
    script.write_text(DDP)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path), str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = sorted(line for line in done.stdout.splitlines() if line.startswith("rank "))
    assert [line.split(":")[0] for line in lines] == ["rank 0", "rank 1"], done.stderr[-3000:]
    assert {line.split(": ")[1] for line in lines} == {lines[0].split(": ")[1]}  # same layers, same weights
    assert (
        lines[0]
        .split(": ")[1]
        .startswith("kprof_callbacks.kernels.layernorm.LayerNorm kprof_callbacks.kernels.gelu.GELU")
    )
