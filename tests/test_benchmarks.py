"""The benchmark scripts run end to end in their tiny --quick mode, so they cannot rot between GPU runs."""

import json
import math
import os
import shutil
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
from kprof_callbacks.bench import ops as bench_ops  # noqa: E402
from kprof_callbacks.bench import timing as bench_timing  # noqa: E402

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
    assert bench_ops.largest(sizes) == {"f": [(torch.float32, (8, 2, 3)), (torch.bfloat16, (2, 2))]}


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
    assert bench_timing.best_other_ms(row) == 0.4
    cells = [c.strip() for c in bench_timing.format_row(row).split("|")[1:-1]]
    header = [c.strip() for c in bench_timing.TABLE_HEADER.splitlines()[0].split("|")[1:-1]]
    got = dict(zip(header, cells, strict=True))
    assert (got["% of copy"], got["% of spec"], got["liger ms"], got["kprof × best other"]) == (
        "80.0",
        "59.7",
        "0.4000",
        "0.80",
    )
    assert got["triton ms"] == got["triton × best other"] == "—"
    no_liger = bench_timing.format_row({**row, "liger_ms": nan, "spec_gbps": None})  # no Liger, device unknown
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
    op = next(o for o in bench_ops.OPS if o.name == name)
    inputs = op.make((64, 256), torch.float32, "cuda")
    torch.testing.assert_close(bench_ops.liger(op, "cuda")(*inputs), op.reference(*inputs), rtol=1e-4, atol=1e-5)
    rows = bench_timing.run_benchmarks(
        [op],
        {bench_ops.family(op): [(torch.float32, (64, 256))]},
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
    assert len(host_overhead.pairs("cpu", False, "triton")) == len(host_overhead.pairs("cpu", False)) - 3
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


@pytest.mark.slow
@pytest.mark.serial
def test_multi_gpu_quick_runs_every_example_on_four_gloo_ranks_and_checks_its_claims(tmp_path, capsys):
    import multi_gpu

    assert multi_gpu.main(["--quick", "--logdir", str(tmp_path / "log"), "--out", str(tmp_path / "out")]) == 0
    docs = {p.name: json.loads(p.read_text()) for p in (tmp_path / "out").glob("*.json")}
    assert sorted(docs) == ["ddp-cpu.json", "fsdp2-cpu.json", "hsdp-cpu.json"]
    runs = {r["run"]: r for doc in docs.values() for r in doc["rows"]}
    assert sorted(runs) == sorted(r.name for r in multi_gpu.runs(True, tmp_path / "log"))
    for doc in docs.values():
        assert len(doc["commit"]) == 40 and doc["date"] and "gloo" in doc["device"] and "--quick" in doc["command"]
        assert doc["versions"]["torch"] == torch.__version__
    for name, r in runs.items():
        assert r["claims"]["every rank"] == "ok" and r["ranks"] == (2 if name == "lightning-2" else 4)
        assert r["timeline"]["ranks"] == r["ranks"] and r["timeline"]["collectives"] > 0
        if name == "hsdp-straggler":  # gloo names no process group: HSDP's two levels cannot be matched apart
            assert r["claims"]["straggler named"].startswith("not judged: gloo traces name no process group")
        elif name.endswith("-straggler"):
            assert r["claims"]["straggler named"] == "ok" and any(n.startswith("Rank 2 ") for n in r["named"])
            assert r["others_wait_for_rank2_ms"] > 0  # the others waited for its longer compute at the collectives
    assert {c["collective"] for c in runs["hsdp"]["collectives"]} == {"all_gather", "reduce_scatter", "all_reduce"}
    assert "all_reduce" not in {c["collective"] for c in runs["fsdp2"]["collectives"]}
    out = capsys.readouterr().out
    assert all(f"\n{name} " in out for name in runs)  # the table at the end


def test_multi_gpu_keeps_nvlink_multicast_off_in_every_child(tmp_path, monkeypatch, capsys):
    import multi_gpu

    seen, real = [], subprocess.run

    def fake_run(argv, env=None, **kwargs):
        if env is None:  # git, for the commit
            return real(argv, **kwargs)
        seen.append(env)
        return subprocess.CompletedProcess(argv, 1, "", "no such GPU")

    monkeypatch.setattr(multi_gpu.subprocess, "run", fake_run)
    assert multi_gpu.main(["--quick", "--logdir", str(tmp_path)]) == 1  # every launch failed, and says so
    assert len(seen) == len(multi_gpu.runs(True, tmp_path))
    assert all(e["NCCL_NVLS_ENABLE"] == "0" and e["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1" for e in seen)
    assert "failed: exit 1: no such GPU" in capsys.readouterr().out


def test_loss_bench_rows_time_every_contender_that_runs_and_check_against_float64(capsys):
    """kprof bench's fused-loss rows on the CPU: kprof and both eager losses timed (compile off, Liger and CCE are
    CUDA only), the speedup over the faster eager loss, a table row per size with the header's cells; --check passes."""
    from kprof_callbacks.bench import loss as bench_loss

    seen = []
    rows = bench_loss.run_rows([(64, 16, 301)], "cpu", False, 1, 2, lambda done: seen.append(len(done)))
    (row,) = rows
    assert seen == [1] and row["shape"] == [64, 16, 301] and row["ms"] > 0
    assert row["eager_fp32_ms"] > 0 and row["eager_bf16_ms"] > 0 and math.isnan(row["liger_ms"])
    assert row["best_torch_x"] == min(row["eager_fp32_ms"], row["eager_bf16_ms"]) / row["ms"]
    cells = bench_loss.format_row(row).split("|")[1:-1]
    assert len(cells) == len(bench_loss.TABLE_HEADER.splitlines()[0].split("|")[1:-1])
    assert bench_loss.check("cpu")
    assert "FAIL" not in capsys.readouterr().out


@pytest.mark.slow
def test_real_model_quick_times_bare_loops_and_checks_training(tmp_path):
    """benchmarks/real_model.py on the tiny GPT: torch, torch with bf16 logits and the swapped model, each as a bare
    loop and through compare, and the training check, written with its provenance."""
    out = tmp_path / "real.json"
    done = subprocess.run(
        [sys.executable, str(RUN_ALL.parent / "real_model.py"), "--quick", "--modes", "bf16", "--train-check", "4",
         "--out", str(out)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads(out.read_text())
    assert [r["variant"] for r in record["rows"]] == ["torch", "torch-bf16-logits", "kprof"]
    assert all(r["bare_ms"] > 0 and r["kprof_ms"] > 0 for r in record["rows"])
    assert record["rows"][0]["harness_x"] == record["rows"][0]["kprof_ms"] / record["rows"][0]["bare_ms"]
    assert record["training"]["tracks"] and len(record["training"]["loss"]["kprof"]) == 4
    assert record["command"].startswith("python benchmarks/real_model.py --quick")


def test_memory_benchmark_quick_explains_the_peak_and_sees_checkpointing(tmp_path):
    import memory

    out = tmp_path / "memory.json"
    assert memory.main(["--quick", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert {"commit", "date", "device", "command"} <= set(doc)
    base, ckpt = doc["baseline"], doc["checkpointed"]
    assert base["explained"] == base["highest_peak"] > 0 and base["within_tolerance"]
    assert list(base["measured_by_step"]) == [str(s) for s in base["steps"]]  # the allocator read in the same steps
    assert base["where"].split(".")[0] in {"blocks", "lm_head", "wte", "wpe", "ln_f"}  # the model's modules named
    assert ckpt["shares"].get("activations", 0) < base["shares"]["activations"] / 2
    assert doc["diff"]["activations_row"]["status"] == "decreased" and doc["diff"]["reverse_gate_5pct"]


@pytest.mark.slow
def test_memory_view_quick_draws_the_view_for_a_saved_and_a_foreign_snapshot(tmp_path):
    import memory_view

    out = tmp_path / "memory_view.json"
    assert memory_view.main(["--quick", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["case"] for r in rows] == list(memory_view.CASES)  # the last one: the summary the plugin kept
    assert all(r["reader_mb_per_s"] > 0 and r["entries"] > 1000 for r in rows)
    if shutil.which("chromium"):
        assert all(r["drawn"] for r in rows)


def test_module_overhead_quick_measures_the_module_view_in_and_after_a_window(tmp_path):
    import module_overhead

    out = tmp_path / "module_overhead.json"
    result = module_overhead.main(["--quick", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    mlp, gpt = result["rows"]
    assert (mlp["model"], mlp["module_calls"], gpt["model"], gpt["module_calls"]) == ("mlp", 13, "gpt", 30)
    assert all(r["step_ms"] > 0 and len(r["inside"]) == 3 for r in (mlp, gpt))
    assert set(result["verdicts"]) == {"mlp", "gpt"} and "gpt: in a window" in module_overhead.render(result)
    assert {"date", "device", "versions", "command", "commit"} <= set(result)


@pytest.mark.parametrize("mode", ["eager", "compiled", "reduce-overhead"])
def test_attribution_checks_are_met_on_the_runs_recorded_on_an_h100(mode):
    """The benchmark's own figures and checks, on the small GPT of tests/fixtures/attribution recorded on an H100."""
    import attribution

    from kprof_callbacks.analysis import summarize

    got = attribution.figures(summarize(Path(__file__).parent / "fixtures" / "attribution" / mode))
    met = attribution.checks(mode, got, gpu=True)
    assert all(met.values()) and len(met) == (3 if mode == "eager" else 5), met
    assert got["loss_head_in"] == "lm_head" and abs(got["modules_vs_busy"]) < 0.02


@pytest.mark.slow
def test_attribution_quick_runs_eager_compiled_and_a_graph_break_on_the_cpu(tmp_path):
    import attribution

    out = tmp_path / "attribution.json"
    result = attribution.main(["--quick", "--out", str(out)])
    rows = {r["mode"]: r for r in result["rows"]}
    assert set(rows) == {"eager", "compiled", "graph break"}
    assert rows["graph break"]["checks"]["graph break counted"] is True
    assert rows["compiled"]["graphs_per_step"] == 1 and rows["eager"]["graphs_per_step"] == 0
    assert rows["compiled"]["checks"]["no recompilation (module hooks come and go)"] is True
    names = {name for name, _, _ in rows["eager"]["top_modules"]}
    assert {"", "blocks", "lm_head", "(optimizer)"} <= names
    assert json.loads(out.read_text())["command"] == "python benchmarks/attribution.py --quick --out " + str(out)


_SUITE_LOG = """\
created: 56/56 workers
FAILED tests/test_x.py::test_y
===== 1 failed, 1649 passed, 39 skipped, 488 warnings, 2 errors in 209.36s (0:03:29) =====
---- the tests marked serial (cores 56-63, 2 lane(s), run beside the others) ----
================ 3 passed, 1690 deselected in 120.10s (0:02:00) ================
---- the second lane: run_all.py --quick ----
collected 1693 items / 1692 deselected / 1 selected
"""


def test_gpu_suite_reads_each_part_and_a_part_cut_off_fails(tmp_path):
    import gpu_suite

    parts = gpu_suite.parts(_SUITE_LOG)
    assert [(p["part"], p["passed"], p["failed"], p["skipped"], p["deselected"], p["seconds"]) for p in parts] == [
        ("parallel (56 workers)", 1649, 3, 39, 0, 209.36),  # errors count as failures
        ("serial", 3, 0, 0, 1690, 120.1),
        ("serial, second lane", 0, 1, 0, 0, None),  # no summary line: killed or cut off
    ]
    small = "=== 1650 passed, 39 skipped in 300.0s ===\n=== 4 passed, 1689 deselected in 90.0s ===\ntest_gpu.sh rc=0\n"
    assert [(p["part"], p["passed"], p["failed"]) for p in gpu_suite.parts(small)] == [
        ("parallel", 1650, 0),
        ("serial", 4, 0),  # a small host's serial part follows unannounced; a line after the parts is no part
    ]
    green = tmp_path / "green.log"
    green.write_text("created: 12/12 workers\n=== 1650 passed, 39 skipped in 300.0s ===\n")
    (tmp_path / "red.log").write_text(_SUITE_LOG)
    out = tmp_path / "suite.json"
    runs = [["--run", str(tmp_path / name), "H100", "a" * 40, "320"] for name in ("green.log", "red.log")]
    assert gpu_suite.main(["--out", str(out), "--versions", "torch=2.11", *sum(runs, [])]) == 1
    doc = json.loads(out.read_text())
    assert doc["green_runs"] == [1] and doc["versions"] == {"torch": "2.11"} and len(doc["rows"]) == 4
