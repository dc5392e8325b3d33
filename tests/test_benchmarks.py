"""The benchmark scripts run end to end in their tiny --quick mode, so they cannot rot between GPU runs."""

import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch

RUN_ALL = Path(__file__).resolve().parent.parent / "benchmarks" / "run_all.py"


@pytest.mark.slow
@pytest.mark.serial
def test_run_all_quick_produces_every_table_and_the_targets(tmp_path):
    out = tmp_path / "results.json"
    done = subprocess.run(
        [sys.executable, str(RUN_ALL), "--quick", "--out", str(out)], capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    results = json.loads(out.read_text())
    for name in ("overhead", "lightning", "summary", "diff", "kernels"):
        assert results[name]["returncode"] == 0 and results[name]["result"], name
    measured = {row["target"].split(":")[0] for row in results["targets"]}
    assert {"launch-bound", "compute-bound"} <= measured
    assert any(t["target"].startswith("summary of") for t in results["targets"])
    assert "## targets" in done.stdout


sys.path.insert(0, str(RUN_ALL.parent))
from kprof_callbacks import bench  # noqa: E402

import _isolated  # noqa: E402
from _isolated import Isolated, rounds  # noqa: E402


def test_isolated_calls_run_each_in_a_new_pinned_process_with_their_own_environment(monkeypatch):
    monkeypatch.delenv("KPROF_PROBE", raising=False)
    isolated = Isolated(preload=("json",), cores=1)
    pids = {isolated(os.getpid) for _ in range(3)}
    assert len(pids) == 3 and os.getpid() not in pids
    assert isolated(os.getenv, "KPROF_PROBE", env={"KPROF_PROBE": "set"}) == "set"
    assert isolated(os.getenv, "KPROF_PROBE") is None  # the previous call's environment died with it
    assert isolated(os.sched_getaffinity, 0) == set(isolated.cores) == {min(os.sched_getaffinity(0))}
    with pytest.raises(ZeroDivisionError):  # the child's exception reaches the caller
        isolated(divmod, 1, 0)
    with pytest.raises(RuntimeError, match="exit code 3"):
        isolated(os._exit, 3)
    isolated.timeout = 1
    with pytest.raises(TimeoutError):
        isolated(time.sleep, 30)


def test_isolated_torch_runs_as_many_threads_as_it_has_cores():
    """A thread pool sized for the whole machine, pinned to a few cores, runs a tiny CPU step hundreds of times slower
    (2 threads on 1 core: 1 ms -> 208 ms a step here); run_all.py --quick took minutes on the 16-core H100 host."""
    isolated = Isolated(preload=("torch",), cores=1)
    assert isolated(torch.get_num_threads) == 1


def test_largest_keeps_the_biggest_shape_of_each_dtype():
    sizes = {
        "f": [(torch.float32, (4, 4)), (torch.float32, (8, 2, 3)), (torch.bfloat16, (2, 2)), (torch.float32, (3, 3))]
    }
    assert bench.largest(sizes) == {"f": [(torch.float32, (8, 2, 3)), (torch.bfloat16, (2, 2))]}


def _row(op, dtype, shape, ms, eager, compiled, liger, gbps=None, copy_gbps=None, spec_gbps=None):
    return {
        "op": op,
        "dtype": dtype,
        "shape": list(shape),
        "pass": "fwd+bwd",
        "ms": ms,
        "eager_ms": eager,
        "compile_ms": compiled,
        "liger_ms": liger,
        "triton_ms": float("nan"),
        "gbps": gbps,
        "copy_gbps": copy_gbps,
        "spec_gbps": spec_gbps,
        "bytes": None,
    }


def test_bench_rows_compare_with_the_fastest_other_liger_included():
    nan = float("nan")
    row = _row(
        "rms_norm",
        "bfloat16",
        (8, 8),
        ms=0.5,
        eager=0.9,
        compiled=0.7,
        liger=0.4,
        gbps=2000.0,
        copy_gbps=2500.0,
        spec_gbps=3350.0,
    )
    assert bench.best_other_ms(row) == 0.4
    cells = [c.strip() for c in bench.format_row(row).split("|")[1:-1]]
    header = [c.strip() for c in bench.TABLE_HEADER.splitlines()[0].split("|")[1:-1]]
    got = dict(zip(header, cells, strict=True))
    assert (got["% of copy"], got["% of spec"], got["liger ms"], got["kprof × best other"]) == (
        "80.0",
        "59.7",
        "0.4000",
        "0.80",
    )
    assert got["triton ms"] == got["triton × best other"] == "—"
    no_liger = bench.format_row({**row, "liger_ms": nan, "spec_gbps": None})  # Liger absent, device not in peaks.py
    assert "| 1.40 | — |" in no_liger and "| 80.0 | — |" in no_liger


def test_run_all_marks_each_kernel_target_on_the_largest_forward_backward_row():
    from run_all import _kernel_targets

    nan = float("nan")
    rows = [
        _row("rms_norm", "bfloat16", (16, 8), ms=1.0, eager=2.0, compiled=1.5, liger=0.9, gbps=85.0, copy_gbps=100.0),
        _row("rms_norm", "bfloat16", (4, 8), ms=1.0, eager=9.0, compiled=9.0, liger=9.0, gbps=10.0, copy_gbps=100.0),
        {**_row("rms_norm", "bfloat16", (64, 8), ms=1.0, eager=9.0, compiled=9.0, liger=9.0), "pass": "fwd"},
        _row("swiglu", "float32", (16, 8), ms=1.0, eager=3.0, compiled=1.04, liger=nan, gbps=1.0, copy_gbps=1.0),
    ]
    marks = {
        target.split(": ", 1)[1]: (measured, ok)
        for target, measured, ok in _kernel_targets(rows)
        if target.startswith("rms_norm")
    }
    assert marks == {
        ">= 80% of copy bandwidth": ("85%", True),
        ">= 1.0x the best of eager, torch.compile and Liger": ("0.90x", False),
    }
    swiglu = {target.split(": ", 1)[1]: ok for target, _, ok in _kernel_targets(rows) if target.startswith("swiglu")}
    assert swiglu == {">= 1.05x compile": False, ">= 1.0x the best of eager, torch.compile and Liger": True}


def test_rounds_stop_when_the_next_would_pass_the_budget(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(_isolated, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    assert list(rounds(4, None)) == [1, 2, 3, 4]
    done = []
    for number in rounds(10, 25.0):
        done.append(number)
        now[0] += 10.0  # after round 2 (20 s), a third would end at 30 s: past the budget
    assert done == [1, 2]
    assert list(rounds(3, 0.0)) == [1]  # one round always runs


def test_window_end_breakdown_groups_samples_under_the_deepest_disable_profiler_frame():
    from window_end import breakdown, short

    assert (
        short("torch::profiler::impl::(anonymous namespace)::build_tree<std::vector<int>> (libtorch_cpu.so)")
        == "impl::build_tree"
    )
    root = "profile.__exit__ (torch/profiler.py:10);torch::autograd::profiler::disableProfiler (libtorch_cpu.so)"
    folded = [
        f"{root};ns::State::finalizeTrace (libtorch_cpu.so);ns::RecordQueue::getRecords (libtorch_cpu.so);x (a.so) 6",
        f"{root};ns::State::finalizeTrace (libtorch_cpu.so);ns::RecordQueue::getRecords (libtorch_cpu.so) 2",
        f"{root};ns::State::finalizeTrace (libtorch_cpu.so);ns::KinetoEvent::KinetoEvent (libtorch_cpu.so) 2",
        f"{root} 1",
        "train_step (loop.py:3);at::addmm (libtorch_cpu.so) 40",  # not inside the window end: left out
    ]
    total, parts = breakdown(folded)
    assert total == 11
    assert parts == {
        "State::finalizeTrace > RecordQueue::getRecords": 8,
        "State::finalizeTrace > KinetoEvent::KinetoEvent": 2,
        "(in disableProfiler itself)": 1,
    }


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="Liger-Kernel's kernels run on CUDA only")
@pytest.mark.parametrize("name", ["layer_norm", "rms_norm", "swiglu"])
def test_liger_column_times_the_same_op(name):
    """Liger's function stands in for the same op as the reference (same eps), and its column is filled."""
    pytest.importorskip(
        "liger_kernel", reason="the bench extra (pip install 'kprof-callbacks[bench]') is not installed"
    )
    op = next(o for o in bench.OPS if o.name == name)
    inputs = op.make((64, 256), torch.float32, "cuda")
    torch.testing.assert_close(bench.liger(op, "cuda")(*inputs), op.reference(*inputs), rtol=1e-4, atol=1e-5)
    rows = bench.run_benchmarks(
        [op],
        {bench.family(op): [(torch.float32, (64, 256))]},
        "cuda",
        compile_ref=False,
        triton=False,
        warmup=1,
        iters=2,
        on_row=lambda rows: None,
    )
    assert all(row["liger_ms"] > 0 for row in rows) and len(rows) == 2


def test_host_overhead_quick_times_every_layer_with_the_impl_asked_for(capsys):
    import host_overhead

    assert host_overhead.main(["--quick", "--device", "cpu", "--impl", "torch"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "->" in line]
    assert "kprof impl='torch'" in out and len(rows) == 2 * len(host_overhead.pairs("cpu", False))
    assert len(host_overhead.pairs("cpu", False, "triton")) == len(host_overhead.pairs("cpu", False)) - 2
    with pytest.raises(SystemExit):  # Triton's host time only means something on CUDA
        host_overhead.main(["--quick", "--device", "cpu", "--impl", "triton"])


def test_gemm_floor_quick_times_the_gemms_against_both_linear_gelus(capsys):
    import gemm_floor

    assert gemm_floor.main(["--quick", "--device", "cpu"]) == 0
    rows = {line.split("|")[1].strip(): line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")}
    names = ("GEMMs alone", "eager Linear+GELU", "kprof bias_gelu after the GEMM")
    assert set(names) <= set(rows)
    for line in map(rows.get, names):  # fwd ms, fwd+bwd ms and the ratio to the GEMMs alone, each a measured number
        assert all(float(cell) > 0 for cell in line.strip(" |").split("|")[1:]), line


def test_calibration_quick_rates_every_detector_on_noise_and_on_its_effect(tmp_path, capsys):
    import calibration

    out = tmp_path / "calibration.json"
    assert calibration.main(["--quick", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert {"device", "date", "versions", "trials", "rows"} <= set(doc) and doc["trials"] == 40
    names = [d.name for d in calibration.DETECTORS]
    assert [(r["detector"], r["noise_sigma"]) for r in doc["rows"]] == [
        (name, sigma) for name in names for sigma in calibration.NOISE
    ]
    for row in doc["rows"]:
        assert row["false_positive_ci"][0] <= row["false_positive_rate"] <= row["false_positive_ci"][1]
        if row["noise_sigma"] == 0.05:  # a GPU step's noise: every detector near its targets even in 40 trials
            assert row["false_positive_rate"] <= 0.1, row
            assert row["detection_rate"] >= 0.9 or row["meets_targets"] is None, row  # None: detection published
    assert "| slow-step trigger | 15% |" in capsys.readouterr().out
    # --only runs some rows with the seeds they have in the full run, so its rows are the full run's
    part = tmp_path / "part.json"
    assert calibration.main(["--quick", "--only", "GPU idle, slow step", "--out", str(part)]) == 0
    drop = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    picked = [r for r in doc["rows"] if r["detector"] in ("GPU idle", "slow step")]
    assert drop(json.loads(part.read_text())["rows"]) == drop(picked)
    with pytest.raises(SystemExit, match="no detector named"):
        calibration.main(["--quick", "--only", "slow stpe"])
