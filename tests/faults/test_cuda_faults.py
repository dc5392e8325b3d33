"""Fault 10: CUDA activity (CUPTI) requested where no CUDA device can be profiled."""

from __future__ import annotations

import json

import pytest
import torch
from torch.profiler import ProfilerActivity

import kprof_callbacks as kprof

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="simulates a machine without a usable CUDA device")

FALLBACK = "kprof: CUDA activity was requested but no CUDA device is usable; profiling CPU activity only"


@pytest.mark.parametrize(
    "activities", [[ProfilerActivity.CPU, ProfilerActivity.CUDA], [ProfilerActivity.CUDA]], ids=["cpu+cuda", "cuda"]
)
def test_cuda_activity_without_cuda_falls_back_to_cpu_with_one_warning(tmp_path, train, told, check_traces, activities):
    """CUDA activity asked for on a CPU-only machine: one warning, every window profiled on the CPU, valid traces."""
    with told() as messages:
        with kprof.session(tmp_path, run="r", wait=0, warmup=1, active=2, repeat=3, activities=activities) as s:
            for _ in range(3):  # one window each, written before the next starts
                train(s, 3)
                s.flush()
    assert messages == [FALLBACK]
    traces = check_traces(tmp_path)
    assert len(traces) == 3
    for path in traces:
        events = json.loads(path.read_text())["traceEvents"]
        assert any(e.get("name") == "aten::addmm" and e.get("cat") == "cpu_op" for e in events)


def test_cuda_activity_through_the_lightning_callback_falls_back_with_one_warning(tmp_path, fit, told, check_traces):
    """ProfilerCallback(activities=[CUDA]) on a CPU-only machine: one warning, fit profiled on the CPU."""
    callback = kprof.ProfilerCallback(
        logdir=tmp_path,
        run="r",
        wait=1,
        warmup=1,
        active=2,
        repeat=2,
        activities=[ProfilerActivity.CUDA],
        summary=False,
    )
    with told() as messages:
        trainer = fit([callback], steps=8)
    assert trainer.global_step == 8
    assert messages == [FALLBACK]
    assert len(check_traces(tmp_path)) == 2
