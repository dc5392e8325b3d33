"""Findings a user can trust: a window's first step or one outlier step does not decide a finding, each finding
shows the per-step evidence it used, and findings about ranks never contradict each other."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
from gpu_like import Trace

from kprof_callbacks.analysis import Summary, diagnostics, ranks, report, summarize
from kprof_callbacks.analysis.perstep import PerStep
from kprof_callbacks.analysis.tables import RankStats, StepSkew, StepStats


def _steps(wall_ms: list[float], loader_ms: list[float], numbers: list[int] | None = None) -> list[StepStats]:
    numbers = numbers or list(range(len(wall_ms)))
    return [
        StepStats(
            step=n,
            rank=None,
            worker="w",
            wall_us=w * 1e3,
            gpu_busy_us=0.0,
            gpu_idle_us=0.0,
            kernel_us=0.0,
            memcpy_us=0.0,
            memset_us=0.0,
            comm_us=0.0,
            cpu_only_us=w * 1e3,
            dataloader_us=d * 1e3,
            peak_memory=0,
        )
        for n, w, d in zip(numbers, wall_ms, loader_ms)
    ]


def _diagnose(steps: list[StepStats]) -> dict[str, str]:
    per_step = PerStep([], [], np.zeros((0, len(steps))), np.zeros((0, len(steps))), steps)
    found = diagnostics.diagnose(steps, [], diagnostics.Evidence(has_gpu=False), per_step)
    return {d.kind: d.message for d in found}


def test_data_loading_of_each_windows_first_step_is_not_a_finding():
    """A Lightning run on an in-memory TensorDataset: 8.77 and 12.6 ms in the first step of each window,
    under 0.7 ms elsewhere; the mean share was 13% ("raise num_workers"), the median share is 2%."""
    loader = [8.77, 0.49, 0.44, 12.6, 0.68, 0.48]
    found = _diagnose(_steps([40.0 + d for d in loader], loader, [3, 4, 5, 9, 10, 11]))
    assert "dataloader" not in found


def test_data_loading_of_most_steps_is_a_finding_with_each_steps_time():
    loader = [9.0, 8.5, 9.2, 0.5, 8.8, 9.1]
    found = _diagnose(_steps([40.0 + d for d in loader], loader, [3, 4, 5, 9, 10, 11]))
    message = found["dataloader"]
    assert message.startswith(
        "Data loading takes 18% of a step (median over 6 steps; 8.90 ms per step; by step "
        "3: 9.00 ms, 4: 8.50 ms, 5: 9.20 ms, 9: 500 us, 10: 8.80 ms, 11: 9.10 ms)"
    )


def _with_syncs(per_step_syncs: list[int]) -> dict[str, str]:
    steps = _steps([20.0] * len(per_step_syncs), [0.0] * len(per_step_syncs))
    steps = [dataclasses.replace(s, gpu_busy_us=s.wall_us, cpu_only_us=0.0) for s in steps]
    calls = np.array([per_step_syncs], dtype=np.float64)
    per_step = PerStep(["op"], ["cudaStreamSynchronize"], calls * 50.0, calls, steps)
    ev = diagnostics.Evidence(has_gpu=True, syncs=Counter({"cudaStreamSynchronize": sum(per_step_syncs)}))
    return {d.kind: d.message for d in diagnostics.diagnose(steps, [], ev, per_step)}


def test_a_sync_in_one_step_is_not_a_finding_and_one_in_every_step_is():
    assert "sync" not in _with_syncs([0, 0, 0, 3, 0, 0, 0, 0, 0])  # a loss logged once, say
    message = _with_syncs([1, 1, 2, 1, 1, 1])["sync"]
    assert message.startswith("1.2 host-GPU synchronizations per step (cudaStreamSynchronize x7; ")
    assert "by step 0: 1, 1: 1, 2: 2, 3: 1, 4: 1, 5: 1)" in message


def test_reads_of_cpu_tensors_in_every_step_are_not_syncs():
    """AdamW reads its CPU step counts with .item() twice per parameter each step; they wait for no GPU."""
    steps = [dataclasses.replace(s, gpu_busy_us=s.wall_us, cpu_only_us=0.0) for s in _steps([20.0] * 6, [0.0] * 6)]
    calls = np.full((1, 6), 296.0)
    per_step = PerStep(["op"], [diagnostics.SCALAR_READ], calls * 2.0, calls, steps)
    found = diagnostics.diagnose(steps, [], diagnostics.Evidence(has_gpu=True), per_step)
    assert "sync" not in {d.kind for d in found}


def test_a_slow_step_is_judged_against_how_much_the_steps_vary():
    """1.6x the median is slow among steady steps; among steps that vary by ~20% (a shared CPU) it is ordinary,
    and 2.4x is not. The longest and shortest steps are left out of the spread."""
    steady = [100.0, 101.0, 99.0, 100.0, 102.0, 98.0, 100.0, 101.0, 99.0]
    assert "slow_step" in _diagnose(_steps(steady + [160.0], [0.0] * 10))
    noisy = [100.0, 125.0, 80.0, 106.0, 132.0, 76.0, 95.0, 118.0, 88.0]
    assert "slow_step" not in _diagnose(_steps(noisy + [160.0], [0.0] * 10))
    message = _diagnose(_steps(noisy + [250.0], [0.0] * 10))["slow_step"]
    assert message.startswith("Step 9 took 250.0 ms, 2.4x the median 103.0 ms.")
    assert diagnostics.slow_threshold(np.array(steady + [400.0])) == diagnostics.SLOW_STEP_RATIO
    assert 1.6 < diagnostics.slow_threshold(np.array(noisy + [400.0])) < 1.75


def _rank(
    rank: int, compute_ms: float, late_ms: float, comm_ms: float = 60.0, overlap_ms: float = 5.0, host_ms: float = 0.0
) -> RankStats:
    return RankStats(
        rank=rank,
        worker=f"rank{rank}_host_1",
        steps=4,
        step_us=125e3,
        compute_us=compute_ms * 1e3,
        comm_us=comm_ms * 1e3,
        overlap_us=overlap_ms * 1e3,
        exposed_comm_us=(comm_ms - overlap_ms) * 1e3,
        collectives=120,
        late_us=late_ms * 1e3,
        host_only_us=host_ms * 1e3,
    )


def _skew(slowest: int, compute_ms: float, others_ms: float) -> list[StepSkew]:
    return [StepSkew(n, slowest, compute_ms * 1e3, others_ms * 1e3, (compute_ms - others_ms) * 1e3) for n in range(4)]


def test_the_rank_the_others_wait_for_is_named_once_and_consistently():
    """Two H100s, FSDP2, a host-bound step of 125 ms: rank 1 computes 2.7 ms (+26%) longer, but rank 0 is the one
    waited for, 92 ms a step. Rank 1 is no straggler: the others wait 5 ms (4% of the step) for it."""
    found = ranks.findings([_rank(0, 10.4, 91.7, host_ms=75.8), _rank(1, 13.1, 5.4, host_ms=9.0)], _skew(1, 13.1, 10.4))
    assert [(d.kind, d.message.split()[1]) for d in found] == [("late_rank", "0")]
    assert "Its host works while its GPU is idle 75.8 ms per step, against 9.00 ms on the others." in found[0].message
    table = report.ranks_table(dataclasses.replace(Summary.empty("r", "w"), ranks=[_rank(0, 10.4, 91.7, host_ms=75.8)]))
    assert "host only" in table.headers and "75.8 ms" in table.rows[0]
    # a rank that computes 30 ms longer and is waited for 32 ms: the straggler, with the measured wait
    found = ranks.findings([_rank(0, 40.0, 1.0), _rank(1, 70.0, 32.0)], _skew(1, 70.0, 40.0))
    assert [(d.kind, d.message.split()[1]) for d in found] == [("straggler", "1")]
    assert "the others wait 32.0 ms per step for it in the collectives (26% of the step)" in found[0].message
    # waited for 60 ms but computing only 20 ms longer: its time goes elsewhere, and only late_rank says so
    found = ranks.findings([_rank(0, 40.0, 1.0), _rank(1, 60.0, 60.0)], _skew(1, 60.0, 40.0))
    assert [d.kind for d in found] == ["late_rank"]


def test_a_late_rank_that_neither_computation_nor_host_explains_is_not_sent_to_its_data_loading():
    """Four H100s, FSDP2: rank 0 is waited for 23 ms a step, computes 1.6 ms longer and its host idles its GPU as
    long as the others' do: the wait built up at many collectives, and the advice is about its GPU, not its host."""
    ranks_ = [_rank(0, 138.0, 23.0, host_ms=1.52)] + [_rank(r, 136.4, 3.0, host_ms=1.50) for r in (1, 2, 3)]
    (found,) = ranks.findings(ranks_, _skew(0, 138.0, 136.4))
    assert found.kind == "late_rank" and found.message.startswith("Rank 0 ")
    assert "neither its computation explains it (it computes only 1.60 ms longer than they do)" in found.message
    assert "nor its host (its host works while its GPU is idle 1.52 ms per step, against 1.50 ms" in found.message
    assert "data loading" not in found.message and "clocks, temperature" in found.message


def test_the_overlap_finding_gives_fsdp_advice_on_fsdp_runs():
    steps = [dataclasses.replace(s, rank=s.step % 2, comm_us=60e3) for s in _steps([125.0] * 4, [0.0] * 4)]
    per_step = PerStep([], [], np.zeros((0, 4)), np.zeros((0, 4)), steps)
    ranked = [_rank(0, 40.0, 0.0), _rank(1, 40.0, 0.0)]
    for fsdp, advice in ((False, "DDP overlaps gradient all-reduce"), (True, "FSDP hides a block's all-gather")):
        found = diagnostics.diagnose(steps, ranked, diagnostics.Evidence(has_gpu=False), per_step, fsdp=fsdp)
        assert advice in next(d.message for d in found if d.kind == "overlap")


def _launch_bound(**evidence) -> str:
    steps = [
        dataclasses.replace(s, gpu_busy_us=s.wall_us / 2, gpu_idle_us=s.wall_us / 2, cpu_only_us=0.0)
        for s in _steps([20.0] * 4, [0.0] * 4)
    ]
    per_step = PerStep([], [], np.zeros((0, 4)), np.zeros((0, 4)), steps)
    ev = diagnostics.Evidence(has_gpu=True, kernels=400, kernel_us=1600.0, waited_kernels=300, **evidence)
    return {d.kind: d.message for d in diagnostics.diagnose(steps, [], ev, per_step)}["launch_bound"]


def test_launch_bound_advice_follows_how_the_model_runs():
    eager = _launch_bound(device_us=40_000.0)
    assert "fuse ops with torch.compile" in eager and "10.0 ms a step" in eager
    compiled = _launch_bound(device_us=40_000.0, compiled_calls=12)
    assert "the model is compiled (3 compiled regions and graph calls a step)" in compiled
    assert 'torch.compile(mode="reduce-overhead")' in compiled and "10.0 ms a step" in compiled
    graphs = _launch_bound(device_us=40_000.0, graph_us=36_000.0, compiled_calls=12)
    assert "already replay from CUDA graphs (90% of GPU time)" in graphs
    assert "reduce-overhead" not in graphs and "torch.compile" not in graphs


def _kernels(kernel_us: float, launch_every_us: float, loader_us: float = 0.0) -> Trace:
    """3 steps of 60 kernels of ``kernel_us``, one launched every ``launch_every_us`` (each starts 5 us after its
    launch, or when the one before it ends), after ``loader_us`` of data loading."""
    t, step = Trace(), 60 * max(launch_every_us, kernel_us) + loader_us + 100
    for n in range(3):
        at = 1000.0 + n * step
        t.label(f"ProfilerStep#{n + 1}", at, step)
        free = at + loader_us
        for k in range(60):
            launched = at + loader_us + 10 + k * launch_every_us
            t.op("aten::mul", launched, 2)
            free = max(launched + 5, free) + 1
            t.launch(launched + 1, "elementwise_kernel", free, kernel_us)
            free += kernel_us
    return t


def test_kernels_started_on_an_idle_gpu_are_launch_bound_whatever_their_length(tmp_path):
    """An eager GPT-2 on an H100: its kernels run 20 us and more, yet each waits for its launch (the GPU idle 70% of
    a step) and compile is the advice; tiny kernels queued back to back behind a long wait for data are no launches
    the GPU waits for."""
    host_bound = {d.kind: d.message for d in summarize(_kernels(30.0, 100.0).write(tmp_path / "a").parent).diagnostics}
    assert host_bound["launch_bound"].startswith("Launch-bound: 99% of 180 kernels started on an idle GPU")
    assert "fuse ops with torch.compile" in host_bound["launch_bound"]
    queued = summarize(_kernels(3.0, 1.0, loader_us=300.0).write(tmp_path / "b").parent)
    assert "gpu_idle" in {d.kind for d in queued.diagnostics}
    assert "launch_bound" not in {d.kind for d in queued.diagnostics}


def _loss_head(share: float) -> dict[str, str]:
    steps = [
        dataclasses.replace(s, gpu_busy_us=s.wall_us, gpu_idle_us=0.0, cpu_only_us=0.0)
        for s in _steps([10.0] * 5, [0.0] * 5)
    ]
    ev = diagnostics.Evidence(has_gpu=True)
    ev.loss_head.gpu_us.update({(s.rank, s.worker, s.step): share * s.gpu_busy_us for s in steps})
    ev.loss_head.logits[(4096, 50304)] = Counter({4: 1, 2: 1})
    ev.loss_head.rows.update({"lm_head": 2.0, "": 1.0})
    per_step = PerStep([], [], np.zeros((0, 5)), np.zeros((0, 5)), steps)
    return {d.kind: d.message for d in diagnostics.diagnose(steps, [], ev, per_step)}


def test_the_loss_head_is_a_finding_when_it_holds_a_large_share_of_the_gpu_time():
    assert "loss_head" not in _loss_head(0.08)
    message = _loss_head(0.31)["loss_head"]
    assert message.startswith("The loss head takes 31% of GPU time (median over 5 steps; 3.10 ms of 10.0 ms a step")
    assert "in lm_head, (model)" in message
    assert "[4096, 50304] in fp32 (786.0 MB) and bf16/fp16 (393.0 MB)" in message
    assert "kprof.kernels.linear_cross_entropy" in message
