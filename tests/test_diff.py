"""kprof.diff: injected changes are found and named, noise is not called significant, slow steps are explained."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import kprof_callbacks as kprof
from kprof_callbacks import stats
from kprof_callbacks.analysis import diff, summarize
from kprof_callbacks.analysis.diff_inputs import parse_steps
from kprof_callbacks.analysis.fmt import kernel_name, ranges
from kprof_callbacks.cli import main

FIXTURES = Path(__file__).parent / "fixtures"


# --- synthetic traces ---------------------------------------------------------------------------------------------


def write_trace(
    path: Path, steps: list[dict[str, float]], *, kernels: list[dict[str, float]] | None = None, first: int = 0
) -> Path:
    """A torch.profiler-style chrome trace: step i runs the ops of ``steps[i]`` ({name: us}) back to back inside
    ``ProfilerStep#(first + i)``, and launches the kernels of ``kernels[i]`` ({name: us}) from a
    cudaLaunchKernel each."""
    events, t, corr = [], 0.0, 0
    for i, ops in enumerate(steps):
        start = t
        for name, dur in ops.items():
            events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": t, "dur": dur})
            t += dur + 1.0
        for name, dur in (kernels[i] if kernels else {}).items():
            corr += 1
            events.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "pid": 1,
                    "tid": 1,
                    "ts": t,
                    "dur": 2.0,
                    "args": {"correlation": corr},
                }
            )
            events.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": name,
                    "pid": 0,
                    "tid": 7,
                    "ts": t + 3.0,
                    "dur": dur,
                    "args": {"correlation": corr},
                }
            )
            t += 3.0 + dur
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{first + i}",
                "pid": 1,
                "tid": 1,
                "ts": start,
                "dur": t - start,
            }
        )
        t += 1.0
    path.write_text(json.dumps({"traceEvents": events}))
    return path


OPS = {f"aten::op{k}": base for k, base in enumerate(np.geomspace(20, 2000, 30))}
KERNELS = {f"kernel_{k}": base for k, base in enumerate(np.geomspace(5, 500, 12))}


def noisy_run(
    path: Path,
    rng: np.random.Generator,
    n: int,
    *,
    cv: float = 0.1,
    slower: dict | None = None,
    extra_kernel: str | None = None,
) -> Path:
    """`n` steps of OPS and KERNELS with lognormal noise; `slower` multiplies some ops; `extra_kernel` adds one."""
    steps, kernels = [], []
    for _ in range(n):
        steps.append({k: v * (slower or {}).get(k, 1.0) * rng.lognormal(0, cv) for k, v in OPS.items()})
        ks = {k: v * rng.lognormal(0, cv / 5) for k, v in KERNELS.items()}
        if extra_kernel:
            ks[extra_kernel] = 300.0 * rng.lognormal(0, cv / 5)
        kernels.append(ks)
    return write_trace(path, steps, kernels=kernels)


# --- the statistics --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("t", "df"), [(12.706, 1), (4.303, 2), (2.776, 4), (2.228, 10), (2.042, 30), (1.960, 1e6)])
def test_welch_p_matches_t_tables(t, df):
    """The incomplete-beta t distribution against tabulated two-sided 5% critical values."""
    x = np.array([df / (df + t * t)])
    assert stats._betainc(np.array([df / 2]), 0.5, x)[0] == pytest.approx(0.05, abs=2e-4)


def test_welch_p_edge_cases():
    same = np.ones((1, 4))
    assert stats.welch_p(same, same)[0] == 1.0  # no variance, no change
    assert stats.welch_p(same, same + 1)[0] == 0.0  # no variance, a change: certain
    assert stats.welch_p(same[:, :1], same[:, :1] + 1)[0] == 1.0  # one step a side: nothing can be told
    a = np.array([[1.0, 2.0, 3.0, 4.0]])
    assert 0.0 < stats.welch_p(a, a + 1.0)[0] < 1.0


def test_benjamini_hochberg():
    p = np.array([0.001, 0.008, 0.039, 0.041, 0.042, 0.06, 0.074, 0.205, 0.212, 0.216])
    assert stats.fdr_reject(p, 0.05).tolist() == [True, True] + [False] * 8  # the textbook example's 2 discoveries
    assert not stats.fdr_reject(np.array([]), 0.05).size


def test_parse_steps_and_ranges():
    assert parse_steps("2-4,7") == [2, 3, 4, 7]
    assert parse_steps(" 5 ") == [5]
    assert ranges([7, 2, 3, 4, 9, 10]) == "2-4,7,9-10"
    for bad in ("", "2-", "a", "4-2", "1,,2", "0-99999999999", "0-60000,100-60100"):  # the last two: too many steps
        with pytest.raises(ValueError, match="step"):
            parse_steps(bad)


def test_kernel_names_shortened_for_display():
    name = (
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
        "TensorListMetadata<2>, std::plus<float>, float>(at::native::(anonymous namespace)::TensorListMetadata<2>)"
    )
    assert kernel_name(name) == "multi_tensor_apply_kernel<TensorListMetadata<2>, std::plus<float>, float>"
    assert kernel_name("sm80_xmma_gemm_f32f32") == "sm80_xmma_gemm_f32f32"


# --- diffs of synthetic runs -----------------------------------------------------------------------------------------


def test_injected_change_is_found_and_named(tmp_path):
    rng = np.random.default_rng(0)
    a = noisy_run(tmp_path / "a.pt.trace.json", rng, 8)
    b = noisy_run(tmp_path / "b.pt.trace.json", rng, 8, slower={"aten::op25": 1.5}, extra_kernel="my_new_kernel")
    d = diff(a, b)
    found = {(c.kind, c.name): c for c in d.significant()}
    assert ("op", "aten::op25") in found and found[("op", "aten::op25")].status == "increased"
    assert found[("kernel", "my_new_kernel")].status == "new"
    assert found[("count", "kernels run")].change == pytest.approx(1.0)
    slowed = found[("op", "aten::op25")]
    assert slowed.low <= 0.5 * OPS["aten::op25"] * np.exp(0.1**2 / 2) <= slowed.high  # the true change (lognormal mean)
    assert found[("op", "cudaLaunchKernel")].a_calls + 1 == found[("op", "cudaLaunchKernel")].b_calls  # its launch
    # the host waited for the new kernel between operators, and the GPU idled longer: both are rows of their own
    assert found[("step", "Python / host between operators")].change == pytest.approx(300.0, rel=0.05)
    assert d.step_time.verdict == stats.SLOWER and d.step_time.speedup < 1
    assert [c.name for c in d.contributors()] == ["my_new_kernel"]
    ops = [c.name for c in d.contributors(("op",))]
    assert ops[0] == "aten::op25" and "cudaLaunchKernel" in ops
    assert "B is slower" in d.headline() and "kernel 'my_new_kernel'" in d.headline()
    reverse = diff(b, a)
    assert {(c.kind, c.name, c.status) for c in reverse.significant()} >= {
        ("kernel", "my_new_kernel", "gone"),
        ("op", "aten::op25", "decreased"),
    }
    assert reverse.step_time.verdict == stats.FASTER


def test_noise_rows_are_rarely_called_significant(tmp_path):
    """Over 20 seeds of the injected change, the rows that did not change make up few of the discoveries: Welch's
    test on lognormal rows keeps the false-discovery share near the control's 5% (8.4% measured)."""
    changed = {("op", "aten::op25"), ("kernel", "my_new_kernel"), ("count", "kernels run"), ("op", "cudaLaunchKernel")}
    changed |= {("step", "GPU idle"), ("step", "Python / host between operators")}
    shares = []
    for seed in range(20):
        rng = np.random.default_rng(seed)
        a = noisy_run(tmp_path / "a.pt.trace.json", rng, 8)
        b = noisy_run(tmp_path / "b.pt.trace.json", rng, 8, slower={"aten::op25": 1.5}, extra_kernel="my_new_kernel")
        found = {(c.kind, c.name) for c in diff(a, b).significant()}
        shares.append(len(found - changed) / len(found))
    assert np.mean(shares) <= 0.10


def test_a_broad_shift_is_blamed_on_the_machine(tmp_path):
    rng = np.random.default_rng(6)
    a = noisy_run(tmp_path / "a.pt.trace.json", rng, 6, cv=0.05)
    b = noisy_run(tmp_path / "b.pt.trace.json", rng, 6, cv=0.05, slower={k: 1.3 for k in OPS})
    assert any("usually the machine" in n for n in diff(a, b).notes)
    c = noisy_run(tmp_path / "c.pt.trace.json", rng, 6, cv=0.05, slower={"aten::op3": 1.3})
    assert not any("usually the machine" in n for n in diff(a, c).notes)


def test_identical_runs_give_nothing_significant(tmp_path):
    run = noisy_run(tmp_path / "a.pt.trace.json", np.random.default_rng(1), 6)
    d = diff(run, run)
    assert not d.significant() and d.step_time.verdict == stats.SAME
    assert all(c.change == 0 and c.status == "unchanged" for c in d.changes)


def test_noise_is_rarely_called_significant(tmp_path):
    """Same distribution on both sides, 5 steps each, 44 rows (30 ops, 12 kernels, counts): some row is called
    significant in at most ~5% of seeded trials (Benjamini-Hochberg over the rows; without it nearly every trial
    would report one), and so is the step time (the rank test)."""
    trials, rows, step, uncorrected = 100, 0, 0, 0
    for seed in range(trials):
        rng = np.random.default_rng(100 + seed)
        d = diff(noisy_run(tmp_path / "a.pt.trace.json", rng, 5), noisy_run(tmp_path / "b.pt.trace.json", rng, 5))
        rows += bool(d.significant())
        step += d.step_time.verdict != stats.SAME
        uncorrected += any(c.p_value < 0.05 for c in d.changes)
    assert rows <= 0.08 * trials, f"{rows} of {trials} noise-only diffs called a row significant"
    assert step <= 0.08 * trials, f"{step} of {trials} noise-only diffs called the step time faster or slower"
    assert uncorrected >= 0.5 * trials  # the rows really are noisy: the correction is what keeps them quiet


def test_step_selections_of_one_run(tmp_path):
    """Steps 4-7 of one run got slower in one op; the selections name it, and checked before anything is read."""
    rng = np.random.default_rng(3)
    steps = [
        {k: v * rng.lognormal(0, 0.05) * (3.0 if k == "aten::op10" and i >= 4 else 1.0) for k, v in OPS.items()}
        for i in range(8)
    ]
    run = tmp_path / "run"
    run.mkdir()
    write_trace(run / "w.1.pt.trace.json", steps[:4], first=10)
    write_trace(run / "w.2.pt.trace.json", steps[4:], first=14)
    d = diff(f"{run}@steps=10-13", f"{run}@steps=14-17")
    assert (d.a.steps, d.b.steps) == ([10, 11, 12, 13], [14, 15, 16, 17])
    assert [(c.name, c.status) for c in d.significant()] == [("aten::op10", "increased")]
    assert any("one run" in n for n in d.notes) and not d.diagnostics
    with pytest.raises(ValueError, match="steps 18-19 not in run .*profiled steps: 10-17"):
        diff(f"{run}@steps=10", f"{run}@steps=18-19")
    with pytest.raises(ValueError, match="overlap .*steps 12"):
        diff(f"{run}@steps=10-12", f"{run}@steps=12-14")
    with pytest.raises(ValueError, match="bad step selection"):
        diff(f"{run}@steps=1-x", run)
    with pytest.raises(FileNotFoundError, match="b: no such"):
        diff(run, tmp_path / "nope")
    with pytest.raises(TypeError, match="a must be"):
        diff(3, run)
    with pytest.raises(ValueError, match="confidence"):
        diff(run, run, confidence=1.0)


def test_ranks_are_samples_of_the_same_steps(tmp_path):
    """In a two-rank run a selected step is taken on both ranks; rank 1's slower op shows in the per-step means."""
    run = tmp_path / "ddp"
    run.mkdir()
    for rank, mm in ((0, 100.0), (1, 300.0)):
        write_trace(run / f"rank{rank}_host_{rank}.1.pt.trace.json", [{"aten::mm": mm, "aten::add": 10.0}] * 6)
    d = diff(f"{run}@steps=0-2", f"{run}@steps=3-5")
    assert (d.a.steps, d.a.samples, d.b.samples) == ([0, 1, 2], 6, 6)
    mm = next(c for c in d.changes if c.name == "aten::mm")
    assert (mm.a, mm.b, mm.significant) == (200.0, 200.0, False)
    assert "6 samples over ranks" in d.render()


def test_logdir_of_runs_is_refused(tmp_path):
    for name in ("x", "y"):
        (tmp_path / name).mkdir()
        write_trace(tmp_path / name / "w.1.pt.trace.json", [{"aten::mm": 10.0}] * 3)
    with pytest.raises(ValueError, match="holds 2 runs"):
        diff(tmp_path, tmp_path / "x")


def test_exports(tmp_path):
    rng = np.random.default_rng(4)
    d = diff(
        noisy_run(tmp_path / "a.pt.trace.json", rng, 4),
        noisy_run(tmp_path / "b.pt.trace.json", rng, 4, slower={"aten::op29": 2.0}),
    )
    doc = json.loads(json.dumps(d.to_dict()))
    assert doc["step_time"]["verdict"] == d.step_time.verdict
    # 2x with 4 steps a side and 10% noise: p = 0.002, significant against 46 rows only beside the step's GPU idle
    # time, which grew as much (p = 0.001): two discoveries let the false-discovery control keep both
    assert [(c["name"], c["verdict"]) for c in doc["changes"][:2]] == [
        ("aten::op29", "increased"),
        ("GPU idle", "increased"),
    ]
    frames = d.to_pandas()
    assert set(frames) == {"step_time", "changes", "diagnostics"}
    assert len(frames["changes"]) == len(d.changes) and "verdict" in frames["changes"].columns
    html = d.to_html(tmp_path / "d.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and "aten::op29" in html and "<script" not in html and "http" not in html
    text = str(d)
    assert "Operators (self CPU time per step)" in text and "aten::op29" in text and "95% CI" in text
    assert "99.78% CI (FDR-adjusted)" in text  # 1 - R q/m with 2 of 46 rows kept: 1 - 2 x 0.05/46


# --- statistics that agree with themselves ---------------------------------------------------------------------------


def test_one_step_a_side_is_too_few_steps_with_no_interval(tmp_path):
    """It used to read "speedup 1.590x [95% CI 1.590x-1.590x]", with zero-width intervals on every row."""
    a = write_trace(tmp_path / "a.pt.trace.json", [{"aten::mm": 100.0, "aten::add": 10.0}])
    b = write_trace(tmp_path / "b.pt.trace.json", [{"aten::mm": 60.0, "aten::add": 10.0}])
    d = diff(a, b)
    t = d.step_time
    assert (t.verdict, t.low, t.high, t.change_interval, t.min_steps) == (stats.TOO_FEW, None, None, None, 4)
    assert not t.significant and t.speedup == pytest.approx(t.a_median_us / t.b_median_us)  # one step each
    mm = next(c for c in d.changes if c.name == "aten::mm")
    assert mm.verdict == "too few steps" and np.isnan(mm.low) and not mm.significant
    text = d.render()
    assert "too few steps for a verdict (1 against 1; the rank test needs 4 a side at 95%)" in text
    assert "CI " not in text.split("Step time:")[1].split("\n")[0]  # no interval on the step-time line
    assert any("needs at least 4 steps a side" in n and "t-test needs 2 a side" in n for n in d.notes)
    doc = json.loads(json.dumps(d.to_dict(), allow_nan=False))
    assert doc["step_time"]["low"] is None and doc["step_time"]["verdict"] == "too few steps"


def test_every_rows_interval_excludes_zero_exactly_when_its_verdict_is_a_change(tmp_path):
    """The interval shown is Welch's at the level the false-discovery control used: "178.5 ms -> 66.7 ms
    [-185.7, -41.9 ms] no significant change" (an uncorrected interval beside a corrected verdict) cannot happen."""
    checked = 0
    for seed in range(30):
        rng = np.random.default_rng(500 + seed)
        slower = {"aten::op25": 1.3, "aten::op12": 1.15} if seed % 2 else None
        d = diff(
            noisy_run(tmp_path / "a.pt.trace.json", rng, 6),
            noisy_run(tmp_path / "b.pt.trace.json", rng, 6, slower=slower),
        )
        kept = sum(c.p_value <= (1 - d.row_confidence) * (1 + 1e-9) for c in d.changes if not c.presence_changed)
        assert d.row_confidence == pytest.approx(1 - max(kept, 1) * 0.05 / len(d.changes))
        for c in d.changes:
            if c.presence_changed:
                continue
            excludes = c.low > 0 or c.high < 0
            assert excludes == (c.significant or c.verdict.startswith("no significant change (under")), c
            checked += 1
    assert checked > 1000


def test_a_new_row_says_what_it_adds_and_whether_it_is_steady(tmp_path):
    """It used to read "NEW ToCopyBackward0 0 -> 24 calls/step: new, not significant"."""
    base = {"aten::mm": 100.0}
    a = write_trace(tmp_path / "a.pt.trace.json", [base] * 6)
    steady = [{**base, **{"ToCopyBackward0": 34.0}} for _ in range(6)]
    once = [base] * 5 + [{**base, "aten::sporadic": 50.0}]
    d = diff(a, write_trace(tmp_path / "b.pt.trace.json", steady))
    new = next(c for c in d.changes if c.name == "ToCopyBackward0")
    assert (new.status, new.significant, new.verdict) == ("new", True, "new: 1 calls/step, +34.0 us per step")
    d = diff(a, write_trace(tmp_path / "c.pt.trace.json", once))
    sporadic = next(c for c in d.changes if c.name == "aten::sporadic")
    assert (sporadic.status, sporadic.significant) == ("new", False)
    assert sporadic.verdict == "new in 1 of 6 steps, not steady (0.167 calls/step, +8.3 us per step)"
    gone = next(
        c for c in diff(write_trace(tmp_path / "d.pt.trace.json", steady), a).changes if c.name == "ToCopyBackward0"
    )
    assert gone.verdict == "gone: 1 calls/step, -34.0 us per step"


def test_an_outlier_step_that_moves_the_mean_is_named_beside_the_verdict(tmp_path):
    """ "speedup 1.731x" next to "the mean step time changed by +178 ms": B's typical step is faster, one long step
    makes its mean slower, and the report says which step."""
    rng = np.random.default_rng(8)
    a = [{"aten::mm": 1000.0 * rng.lognormal(0, 0.05)} for _ in range(8)]
    b = [{"aten::mm": 800.0 * rng.lognormal(0, 0.05)} for _ in range(8)]
    b[5] = {"aten::mm": 9000.0}  # a GC pause, say
    d = diff(write_trace(tmp_path / "a.pt.trace.json", a), write_trace(tmp_path / "b.pt.trace.json", b))
    t = d.step_time
    assert t.verdict == stats.FASTER and t.speedup > 1.1 and d.mean_step_change_us > 700
    assert t.note.startswith("The mean step time changed by +")
    assert "while the typical step moved the other way" in t.note
    assert "step 5 of B took 9.00 ms" in t.note and "(an outlier); without it the mean changed by -" in t.note
    assert t.note in d.headline() and "B is faster" in d.headline()


# --- recorded and real traces -----------------------------------------------------------------------------------


def test_recorded_h100_traces_name_the_changed_activation():
    """The two H100 fixtures are MLPs with GELU (gpu_small) and ReLU (gpu_mlp_h100): the diff says so."""
    d = diff(FIXTURES / "gpu_small.pt.trace.json.gz", FIXTURES / "gpu_mlp_h100.pt.trace.json.gz")
    status = {(c.kind, c.name): c.status for c in d.changes}
    assert status[("op", "aten::gelu")] == "gone" and status[("op", "aten::relu")] == "new"
    gone = [c for c in d.changes if c.kind == "kernel" and c.status == "gone"]
    assert any("GeluCUDAKernelImpl" in c.name for c in gone)
    assert any(c.significant for c in gone)
    counts = {c.name: c for c in d.changes if c.kind == "count"}
    assert counts["host-GPU syncs (cuda*Synchronize, cudaMemcpy)"].a == 2.0  # .item() and the pageable copy
    assert "GPU activities (GPU time per step)" in d.render()


def _train(logdir: Path, run: str, *, extra: bool, slow_step: int | None = None) -> Path:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with kprof.session(logdir, run=run, wait=0, warmup=1, active=8) as s:
        for i in range(9):
            with s.region("forward"):
                loss = model(torch.randn(32, 64)).square().mean()
            if extra:
                with s.region("extra"):
                    torch.linalg.matrix_exp(torch.randn(64, 64))
            if i == slow_step:
                with s.region("checkpoint"):
                    time.sleep(0.6)
            time.sleep(0.03)  # steps of 30 ms or more: a busy runner's hiccups of tens of ms stay moderate outliers
            loss.backward()
            opt.step()
            opt.zero_grad()
            s.step()
    return s.run_dir


def test_real_cpu_runs_name_the_added_work(tmp_path):
    a = _train(tmp_path, "a", extra=False)
    b = _train(tmp_path, "b", extra=True)
    d = diff(a, b)
    status = {(c.kind, c.name): c.status for c in d.changes}
    # new by presence; whether it is also significant depends on how much its time varies on a loaded machine (its
    # first call is slow), which the seeded synthetic tests above pin down instead
    assert status[("label", "extra")] == status[("op", "aten::linalg_matrix_exp")] == "new"
    assert (d.a.samples, d.b.samples) == (8, 8)


def test_summary_explains_the_slow_step(tmp_path):
    """A slow step gets a finding naming what grew in it, against the worker's other steps."""
    s = summarize(_train(tmp_path, "slow", extra=False, slow_step=5))
    (finding,) = [d for d in s.diagnostics if d.kind == "slow_step"]
    print(finding.message)
    assert finding.message.startswith("Step 5 took")  # numbered from 0, as ProfilerStep#N
    assert "What grew in it, against the median of the " in finding.message  # 7 other steps, less any noisy one
    assert "label 'checkpoint' +6" in finding.message  # ~600 ms of sleep


def test_slow_step_names_a_kernel_that_grew(tmp_path):
    kernels = [{"void at::native::big_kernel<float>(float*, int)": 100.0, "small": 5.0} for _ in range(6)]
    kernels[4] = {"void at::native::big_kernel<float>(float*, int)": 900.0, "small": 5.0}
    path = write_trace(tmp_path / "t.pt.trace.json", [{"aten::mm": 50.0}] * 6, kernels=kernels)
    (finding,) = [d for d in summarize(path).diagnostics if d.kind == "slow_step"]
    assert finding.message.startswith("Step 4 took")
    grew = "against the median of the 5 other steps (extra 800 us): kernel 'big_kernel<float>' +800 us"
    assert grew in finding.message
    assert "Python / host between operators +800 us" in finding.message  # the host waited for it outside any op


def test_slow_step_with_nothing_to_blame(tmp_path):
    """Time spent between ops (no op, label or kernel grew) is named as such: the step's own row."""
    steps = [{"aten::mm": 100.0, "aten::add": 50.0}] * 6
    path = write_trace(tmp_path / "t.pt.trace.json", steps)
    events = json.loads(path.read_text())["traceEvents"]
    for e in events:  # stretch step 3's range by 1 ms of nothing
        if e["name"] == "ProfilerStep#3":
            e["dur"] += 1000.0
        elif e["ts"] > events[[x["name"] for x in events].index("ProfilerStep#3")]["ts"] + 160:
            e["ts"] += 1000.0
    path.write_text(json.dumps({"traceEvents": events}))
    (finding,) = [d for d in summarize(path).diagnostics if d.kind == "slow_step"]
    assert "(extra 1.00 ms): Python / host between operators +900 us." in finding.message


# --- the command line --------------------------------------------------------------------------------------------


def _cli(*argv: str) -> int:
    return main(["diff", *argv])


def test_cli(tmp_path, capsys):
    rng = np.random.default_rng(5)
    a = noisy_run(tmp_path / "a.pt.trace.json", rng, 5)
    b = noisy_run(tmp_path / "b.pt.trace.json", rng, 5, slower={"aten::op20": 2.0})
    assert _cli(str(a), str(b), "--top", "3", "--html", str(tmp_path / "d.html")) == 0
    out = capsys.readouterr().out
    assert "aten::op20" in out and (tmp_path / "d.html").exists()
    assert _cli(str(a), str(b), "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in doc["changes"] if c["significant"]] == ["aten::op20"]
    assert _cli(f"{a}@steps=0-1", f"{a}@steps=7") == 1
    assert "step 7 not in" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _cli(str(a), str(b), "--confidence", "2")


def test_the_empty_step_a_cut_short_window_ends_with_is_no_step(tmp_path):
    """torch opens ProfilerStep#N at the loop's last step() and closes it when the session stops: nothing ran in it."""
    path = write_trace(tmp_path / "t.pt.trace.json", [{"aten::mm": 500.0}] * 4, kernels=[{"k": 300.0}] * 4)
    doc = json.loads(path.read_text())
    end = max(e["ts"] + e["dur"] for e in doc["traceEvents"])
    doc["traceEvents"] += [  # on a GPU the profiler's stop synchronizes in it; with stacks, its Python frames show
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4", "pid": 1, "tid": 1, "ts": end + 5, "dur": 30},
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaDeviceSynchronize",
            "pid": 1,
            "tid": 1,
            "ts": end + 8,
            "dur": 9,
        },
        {
            "ph": "X",
            "cat": "python_function",
            "name": "profiler.py(120): stop",
            "pid": 1,
            "tid": 1,
            "ts": end + 6,
            "dur": 20,
        },
    ]
    path.write_text(json.dumps(doc))
    walls = [s.wall_us for s in summarize(path).per_step.steps]
    assert len(walls) == 4 and min(walls) > 500  # was 5 steps, the last 30 us
    doc["traceEvents"].append(  # an operator in it: a real step, however short
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": end + 10, "dur": 5}
    )
    path.write_text(json.dumps(doc))
    assert len(summarize(path).per_step.steps) == 5


def test_a_windows_first_step_is_not_charged_the_gpus_backlog(tmp_path):
    """The host ran ahead: step 0's kernel waited 5 ms in the queue behind steps from before the window, so step 0's
    time starts when its kernel did (steps 1.. already start where the previous one ended); its operator is still
    its own."""
    path = write_trace(tmp_path / "t.pt.trace.json", [{"aten::mm": 50.0}] * 4, kernels=[{"k": 1000.0}] * 4)
    doc = json.loads(path.read_text())
    for e in doc["traceEvents"]:
        if e["cat"] == "kernel":
            e["ts"] += 5000.0  # every kernel 5 ms late: the GPU ran them back to back after the backlog
    path.write_text(json.dumps(doc))
    s = summarize(path)
    walls = [step.wall_us for step in s.per_step.steps]
    assert walls == pytest.approx([1000.0] * 4, abs=60), walls
    assert s.per_step.steps[0].gpu_idle_us < 60  # the GPU was never idle in it
    row = [(k, n) for k, n in zip(s.per_step.kind, s.per_step.name)].index(("op", "aten::mm"))
    assert s.per_step.calls[row].tolist() == [1, 1, 1, 1]


def _windows(folder: Path, step_us: float, first_us: float, windows=((3, 5), (11, 5))) -> Path:
    """A run of profiling windows ((first step number, steps), one trace file each): every window's first step
    takes ``first_us``, the others ``step_us``."""
    folder.mkdir(parents=True)
    for k, (first, n) in enumerate(windows):
        ops = [{"aten::mm": first_us if i == 0 else step_us} for i in range(n)]
        write_trace(folder / f"host_{100 + k}.{k}.pt.trace.json", ops, first=first)
    return folder


def test_each_windows_first_step_is_left_out_of_the_step_time_test(tmp_path):
    """The first step of a window holds the profiler's start (and on a GPU the backlog before the window): with 2 of
    10 steps a side 40% long, B 10% slower is judged on the other 8 steps a side."""
    a = _windows(tmp_path / "a", 1000.0, 1400.0)
    b = _windows(tmp_path / "b", 1100.0, 1540.0)
    d = diff(a, b)
    t = d.step_time
    assert (t.window_starts, t.a_steps, t.b_steps) == ((2, 2), 8, 8)
    assert t.verdict == stats.SLOWER and t.a_median_us == pytest.approx(1001, abs=2), t
    assert "Each window's first step is left out (2 of A's, 2 of B's)" in str(d)
    few = diff(_windows(tmp_path / "c", 1000.0, 1400.0, ((3, 3),)), _windows(tmp_path / "d", 1100.0, 1540.0, ((3, 3),)))
    assert few.step_time.window_starts == (0, 0) and few.step_time.a_steps == 3  # 2 a side would be too few
