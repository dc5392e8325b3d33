"""The examples users copy from run as documented (CPU), and say what they promise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kprof_callbacks import peaks
from kprof_callbacks.analysis import diff

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _run(args: list[str], cwd: Path, timeout: float = 300) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_plain_loop_trains_and_summarizes(tmp_path):
    out = _run([sys.executable, str(EXAMPLES / "plain_loop.py")], tmp_path)
    losses = [float(line.split("loss")[1]) for line in out.splitlines() if line.startswith("step") and "loss" in line]
    assert losses[-1] < losses[0]
    assert len(list((tmp_path / "log" / "plain-loop").glob("*.pt.trace.json"))) == 2
    assert "Findings" in out and "tensorboard --logdir log" in out


@pytest.mark.slow
def test_torchrun_ddp_loop_writes_one_trace_per_rank_and_a_ranks_table(tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    out = _run([str(torchrun), "--nproc_per_node=2", str(EXAMPLES / "ddp_loop.py")], tmp_path)
    traces = sorted(p.name for p in (tmp_path / "log" / "ddp-loop").glob("*.pt.trace.json"))
    assert [t.split("_")[0] for t in traces] == ["rank0", "rank1"]
    assert out.count("Steps (rank 0)") == 1  # only rank 0 prints
    # The tables are always there; whether a straggler or a communication finding fires depends on which of two
    # CPU processes the OS scheduler slows down (tests/test_analysis.py checks those findings on a forced straggler).
    ranks = out.split("Ranks (means per step)")[1].split("\n\n")[0].splitlines()
    assert [row.split()[0] for row in ranks[3:]] == ["0", "1"]
    assert "Slowest rank per step (by compute)" in out


def test_diff_runs_names_what_autocast_changed(tmp_path):
    out = _run([sys.executable, str(EXAMPLES / "diff_runs.py")], tmp_path)
    assert "kprof diff: B against A" in out and "Step time:" in out
    # bf16 autocast adds casts and their backward. Which rows make the printed top 8 depends on the device (on the
    # H100, GPU kernels rank there too and the casts did not show), so they are looked up in the whole diff.
    result = diff(tmp_path / "log" / "diff-fp32", tmp_path / "log" / "diff-bf16")
    new_ops = {c.name for c in result.changes if c.kind == "op" and c.status == "new"}
    assert "ToCopyBackward0" in new_ops, sorted(new_ops)
    assert (tmp_path / "log" / "diff.html").exists()


def test_lightning_gpt_swaps_its_layers_and_reports_throughput(tmp_path):
    """SwapCallback + ProfilerCallback(flops_per_batch=) on the GPT: kprof's layers train, TFLOP/s is reported."""
    out = _run([sys.executable, str(EXAMPLES / "lightning_gpt.py"), "--root", str(tmp_path), "--steps", "20"], tmp_path)
    assert out.rstrip().endswith("layers: kprof_callbacks.kernels.layernorm")
    assert "(median over steps 0-19" in out and "TFLOP/s" in out and "from the FLOPs the program gave per step" in out
    if torch.cuda.is_available() and peaks.peak_tflops(torch.cuda.get_device_name(), "bf16"):
        assert "Model FLOPs utilization" in out  # a GPU in kprof's table of dense peaks gets MFU, not just TFLOP/s
    assert list((tmp_path / "lightning_logs" / "version_0" / "kprof" / "train").glob("*.pt.trace.json"))
