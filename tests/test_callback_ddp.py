"""kprof.ProfilerCallback under DDP: two CPU processes (gloo), launched the way users launch them (a script)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import Counter

import kprof_callbacks as kprof

SCRIPT = textwrap.dedent(
    """
    import sys

    import lightning as L
    import torch
    from lightning.pytorch.loggers import TensorBoardLogger
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import kprof_callbacks as kprof


    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)


    if __name__ == "__main__":
        root = sys.argv[1]
        x = torch.randn(256, 16, generator=torch.Generator().manual_seed(0))
        trainer = L.Trainer(
            accelerator="cpu", devices=2, strategy="ddp", max_steps=6, default_root_dir=root,
            logger=TensorBoardLogger(root), enable_progress_bar=False, enable_model_summary=False,
            enable_checkpointing=False, callbacks=[kprof.ProfilerCallback(wait=1, warmup=1, active=2)],
        )
        trainer.fit(Model(), DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8))
    """
)


def test_ddp_every_rank_writes_its_trace_into_one_folder_and_rank0_alone_prints(tmp_path):
    script = tmp_path / "fit_ddp.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]

    run_dir = tmp_path / "lightning_logs" / "version_0" / "kprof" / "train"
    files = sorted(run_dir.glob("*.pt.trace.json"))
    assert [f.name.split("_")[0] for f in files] == ["rank0", "rank1"]
    for f in files:
        events = json.loads(f.read_text())["traceEvents"]
        found = Counter(e["name"] for e in events if e.get("cat") == "user_annotation")
        assert found["training_step"] == found["backward"] == found["optimizer_step"] == 2, found
    assert done.stdout.count("kprof: train traces in") == 1  # the summary comes from rank 0 only
    assert len(kprof.summarize(run_dir).ranks) == 2
