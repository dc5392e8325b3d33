"""kprof_callbacks.analysis against real torch.profiler runs on CPU, checked with key_averages()."""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import pickle
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function, schedule, tensorboard_trace_handler

from kprof_callbacks.analysis import Summary, reader, reading, summarize
from kprof_callbacks.analysis import intervals as iv
from kprof_callbacks.analysis.tree import nest
from kprof_callbacks.cli import main

ACTIVE = 3
FIXTURES = Path(__file__).parent / "fixtures"


def _profile_mlp(run_dir: Path, *, with_stack: bool) -> dict:
    """Profile a small MLP training loop into `run_dir`; return key_averages() of the same profile."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(96, 16), torch.randint(0, 4, (96,)))
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    write = tensorboard_trace_handler(str(run_dir), worker_name="host_1")
    seen = {}

    def on_ready(prof) -> None:
        seen["ops"] = prof.key_averages()
        seen["shapes"] = prof.key_averages(group_by_input_shape=True)
        write(prof)

    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=ACTIVE, repeat=1),
        on_trace_ready=on_ready,
        record_shapes=True,
        profile_memory=True,
        with_stack=with_stack,
    ) as prof:
        for i, (x, y) in enumerate(loader):
            with record_function("kprof::forward"):
                # a second batch size every other step: two input-shape groups for the same ops
                loss = nn.functional.cross_entropy(model(x[: 16 - 8 * (i % 2)]), y[: 16 - 8 * (i % 2)])
            with record_function("backward"):
                loss.backward()
            opt.step()
            opt.zero_grad()
            loss.item()
            prof.step()
    return seen


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, dict]:
    """One profiled run (shapes, memory, Python stacks) and its key_averages()."""
    run_dir = tmp_path_factory.mktemp("log") / "mlp"
    return run_dir, _profile_mlp(run_dir, with_stack=True)


@pytest.fixture(scope="module")
def summary(run) -> Summary:
    return summarize(run[0])


def _trace(run_dir: Path) -> Path:
    (path,) = run_dir.glob("*.pt.trace.json")
    return path


def test_ops_match_key_averages(run, summary):
    averages = {e.key: e for e in run[1]["ops"]}
    assert len(summary.ops) > 20
    for op in summary.ops:
        ref = averages[op.name]
        assert op.calls == ref.count, op.name
        assert op.cpu_total_us == pytest.approx(ref.cpu_time_total, rel=1e-3, abs=0.01), op.name
        assert op.self_cpu_us == pytest.approx(ref.self_cpu_time_total, rel=1e-3, abs=0.01), op.name
        assert op.cpu_memory == ref.cpu_memory_usage, op.name
        assert op.self_cpu_memory == ref.self_cpu_memory_usage, op.name
    assert any(op.self_cpu_memory > 0 for op in summary.ops if op.name in ("aten::mm", "aten::addmm", "aten::empty"))


def test_ops_by_input_shape_match_key_averages(run, summary):
    averages = {(e.key, str(e.input_shapes).replace(" ", "")): e for e in run[1]["shapes"]}
    calls = {op.name: op.calls for op in summary.ops}
    for op in summary.ops_by_shape:
        calls[op.name] -= op.calls
        if "[[[" in op.input_shapes.replace(" ", ""):
            continue  # TensorList inputs: the trace has each tensor's shape, key_averages only `[]`
        ref = averages[(op.name, (op.input_shapes or "[]").replace(" ", ""))]
        assert op.calls == ref.count, (op.name, op.input_shapes)
        assert op.self_cpu_us == pytest.approx(ref.self_cpu_time_total, rel=1e-3, abs=0.01)
    assert set(calls.values()) == {0}
    addmm = {op.input_shapes for op in summary.ops_by_shape if op.name == "aten::addmm"}
    assert len(addmm) == 4  # two layers x two batch sizes


def test_steps_and_labels(run, summary):
    steps = json.loads(_trace(run[0]).read_text())["traceEvents"]
    ranges = {int(e["name"].split("#")[1]): e["dur"] for e in steps if e.get("name", "").startswith("ProfilerStep#")}
    assert [s.step for s in summary.steps] == sorted(ranges)
    for s in summary.steps:
        assert s.wall_us == pytest.approx(ranges[s.step], abs=0.002)  # CPU only: the host range is the step
        assert 0 < s.cpu_only_us <= s.wall_us
        assert 0 < s.dataloader_us < s.wall_us
        assert s.peak_memory > 0
        assert s.gpu_busy_us == s.kernel_us == s.comm_us == 0
    averages = {e.key: e for e in run[1]["ops"]}
    labels = {lb.name: lb for lb in summary.labels}
    for name in ("kprof::forward", "backward"):
        assert labels[name].count == ACTIVE
        assert labels[name].total_us == pytest.approx(averages[name].cpu_time_total, rel=1e-3)
        assert 0 < labels[name].step_share < 1
    assert not any(name.startswith("ProfilerStep") for name in labels)
    assert {d.kind for d in summary.diagnostics} >= {"no_gpu"}


def test_render_to_dict_to_pandas(summary):
    text = summary.render(top=5, sort="memory")
    assert "Top 5 operators by self CPU memory" in text and "kprof::forward" in text
    assert "Top 10 operators by self CPU time" in str(summary)  # no GPU: cuda sort falls back to CPU
    doc = json.loads(json.dumps(summary.to_dict()))
    assert len(doc["ops"]) == len(summary.ops) and doc["steps"][0]["step"] == summary.steps[0].step
    frames = summary.to_pandas()
    assert set(frames) >= {"steps", "ops", "ops_by_shape", "kernels", "labels", "ranks", "diagnostics"}
    assert frames["ops"]["calls"].sum() == sum(op.calls for op in summary.ops)
    assert list(frames["kernels"].columns) == ["name", "kind", "count", "total_us", "mean_us", "max_us"]
    with pytest.raises(ValueError, match="sort"):
        summary.render(sort="gpu")


def test_export_stacks(tmp_path, run, summary):
    out = summary.export_stacks(tmp_path / "cpu.folded")
    lines = out.read_text().splitlines()
    assert lines and all(re.fullmatch(r"[^;\n]+(;[^;\n]+)* \d+", line) for line in lines)
    assert any(".py(" in line for line in lines)  # Python frames from with_stack=True
    folded_mm = sum(int(line.rsplit(" ", 1)[1]) for line in lines if line.rsplit(" ", 1)[0].endswith(";aten::mm"))
    ref = {e.key: e for e in run[1]["ops"]}["aten::mm"].self_cpu_time_total
    n_mm = sum(1 for line in lines if line.rsplit(" ", 1)[0].endswith(";aten::mm"))
    assert abs(folded_mm - ref) <= n_mm  # one rounding to whole microseconds per line
    with pytest.raises(ValueError, match="metric"):
        summary.export_stacks(tmp_path / "x", metric="cuda")


def test_without_steps_and_old_field_names(tmp_path, run, summary):
    """A trace as older torch wrote it: `Operator` category, old arg spellings, no ProfilerStep, a bare list."""
    rename = {"cpu_op": "Operator", "cuda_runtime": "Runtime", "kernel": "Kernel"}
    events = []
    for e in json.loads(_trace(run[0]).read_text())["traceEvents"]:
        if e.get("name", "").startswith("ProfilerStep#"):
            continue
        args = e.get("args", {})
        for new, old in (("External id", "external id"), ("Input Dims", "Input dims")):
            if new in args:
                args[old] = args.pop(new)
        events.append(dict(e, cat=rename.get(e.get("cat"), e.get("cat"))) if "cat" in e else e)
    path = tmp_path / "old.json"
    path.write_text(json.dumps(events))
    old = summarize(path)
    assert [s.step for s in old.steps] == [-1]
    assert "all" in old.render()
    assert any(d.kind == "no_steps" for d in old.diagnostics)
    assert {(o.name, o.calls) for o in old.ops} == {(o.name, o.calls) for o in summary.ops}
    assert {(o.name, o.input_shapes, o.calls) for o in old.ops_by_shape} == {
        (o.name, o.input_shapes, o.calls) for o in summary.ops_by_shape
    }


def test_gzip_trace_reads_the_same(tmp_path, run, summary):
    run_dir = tmp_path / "gz"
    run_dir.mkdir()
    trace = _trace(run[0])
    (run_dir / (trace.name + ".gz")).write_bytes(gzip.compress(trace.read_bytes()))
    gz = summarize(run_dir)
    assert gz.ops == summary.ops
    assert gz.steps == summary.steps


def test_bad_files_each_get_one_line(tmp_path, run, summary, caplog):
    run_dir = tmp_path / "mixed"
    shutil.copytree(run[0], run_dir)
    trace = _trace(run_dir)
    good = trace.read_bytes()
    bad = {
        "truncated.1.pt.trace.json": good[: len(good) // 2],
        "truncatedgz.2.pt.trace.json.gz": gzip.compress(good)[:1000],
        "notatrace.3.pt.trace.json": b'{"hello": "world"}',
        "wrongtypes.4.pt.trace.json": b'{"traceEvents": [{"ph": "X", "ts": "soon"}]}',
        "empty.5.pt.trace.json": b"",
    }
    for name, data in bad.items():
        (run_dir / name).write_bytes(data)
    (run_dir / "host_1.6.pt.trace.json.partial").write_bytes(good[:100])
    (run_dir / "host_1.6.pt.trace.json.partial.raw").write_bytes(good[:100])  # the writer's other temp file
    with caplog.at_level(logging.WARNING):
        mixed = summarize(run_dir)
    reasons = {p.path.name: p.reason for p in mixed.problems}
    assert set(reasons) == {*bad, "host_1.6.pt.trace.json.partial"}
    for problem in mixed.problems:
        assert problem.path.parent == run_dir and "\n" not in problem.reason and str(problem) in caplog.text
    assert "truncated or corrupt JSON" in reasons["truncated.1.pt.trace.json"]
    assert "gzip" in reasons["truncatedgz.2.pt.trace.json.gz"]
    assert "not a torch.profiler trace" in reasons["notatrace.3.pt.trace.json"]
    assert "still being written" in reasons["host_1.6.pt.trace.json.partial"]
    assert "not a torch.profiler trace" in reasons["wrongtypes.4.pt.trace.json"]
    assert mixed.files == [trace]
    assert mixed.ops == summary.ops
    assert "Problems" in mixed.render()


def test_missing_empty_and_unreadable_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such"):
        summarize(tmp_path / "nope")
    with pytest.raises(ValueError, match="no trace files"):
        summarize(tmp_path)
    (tmp_path / "only.pt.trace.json").write_text("{")
    with pytest.raises(ValueError, match="nothing readable.*truncated"):
        summarize(tmp_path)


def test_logdir_of_runs_and_memory_snapshot(tmp_path, run):
    logdir = tmp_path / "log"
    for name in ("a", "b"):
        shutil.copytree(run[0], logdir / name)
    (logdir / "b" / "rank0_snapshot.pickle").write_bytes(b"\x80")
    (logdir / "empty").mkdir()
    runs = summarize(logdir)
    assert sorted(runs) == ["a", "b"]
    assert runs["a"].ops == runs["b"].ops
    assert runs["b"].memory_snapshots == [logdir / "b" / "rank0_snapshot.pickle"]
    assert "https://pytorch.org/memory_viz" in runs["b"].render()


def _cli(*argv: str) -> int:
    return main(["summary", *argv])


def test_cli(tmp_path, run, capsys):
    html, folded = tmp_path / "r.html", tmp_path / "s.folded"
    assert _cli(str(run[0]), "--top", "3", "--sort", "cpu", "--html", str(html), "--stacks", str(folded)) == 0
    out = capsys.readouterr().out
    assert "Top 3 operators by self CPU time" in out
    page = html.read_text()
    assert "<svg" in page and "kprof::forward" in page
    assert not re.search(r"<(script|link|img|iframe)\b", page) and not re.search(
        r"(src|href)\s*=\s*[\"']?https?:", page
    )
    assert folded.read_text().strip()
    assert _cli(str(run[0]), "--json") == 0
    assert json.loads(capsys.readouterr().out)["name"] == "mlp"
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.pt.trace.json").write_text("not json")
    assert _cli(str(tmp_path / "bad")) == 1
    assert "nothing readable" in capsys.readouterr().err
    assert _cli(str(tmp_path / "missing")) == 1
    with pytest.raises(SystemExit):
        _cli(str(run[0]), "--top", "0")


_RANK_WORKER = textwrap.dedent("""
    import faulthandler, sys, time
    faulthandler.dump_traceback_later(240, exit=True)  # a hung rank says where (imports too), ends before the test
    start = time.monotonic()
    def said(what):  # each phase's time on stderr: a rank the test kills shows how far it got
        print(f"{time.monotonic() - start:7.1f} s {what}", file=sys.stderr, flush=True)
    import datetime, os, torch, torch.distributed as dist
    from torch import nn
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler
    said("imported")
    rank, world, logdir, store = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=200))  # a rank that died fails the other's collective
    said("joined")
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    handler = tensorboard_trace_handler(logdir, worker_name=f"rank{rank}_host_{os.getpid()}")
    # iteration 1 (DDP rebuilds its buckets there) is the warm-up; steps 2-4 are recorded
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
                 on_trace_ready=handler) as prof:
        for _ in range(5):
            x = torch.randn(256 * (1 + 31 * rank), 32)  # rank 1 computes 32x more: the straggler
            model(x).sum().backward()
            opt.step(); opt.zero_grad(); prof.step()
    said("profiled")
    dist.barrier()  # both traces written before either rank tears gloo down
    dist.destroy_process_group()
    said("done")
    os._exit(0)  # a CUDA build of torch can hang in its own teardown at exit (seen on an H100 host), after this
""")


def test_two_ranks_give_a_rank_table(tmp_path):
    logdir = tmp_path / "ddp"
    world = 2
    errs = [(tmp_path / f"rank{r}.err").open("wb") for r in range(world)]  # files: a full pipe cannot block a rank
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RANK_WORKER, str(r), str(world), str(logdir), str(tmp_path / "store")],
            stderr=errs[r],
            env=dict(os.environ, OMP_NUM_THREADS="1"),
        )
        for r in range(world)
    ]
    deadline = time.monotonic() + 280
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    for p, err in zip(procs, errs):
        if p.poll() is None:
            p.kill()
        p.wait()
        err.close()
    said = {r: (tmp_path / f"rank{r}.err").read_text(errors="replace")[-2000:] for r in range(world)}
    assert [p.returncode for p in procs] == [0] * world, said  # every rank's stderr: one that died first says why
    s = summarize(logdir)
    assert [(r.rank, r.steps) for r in s.ranks] == [(0, 3), (1, 3)]
    for r in s.ranks:
        assert r.comm_us > 0 and r.compute_us > 0
        assert 0 <= r.overlap_us <= min(r.comm_us, r.compute_us) + 1e-6
        assert r.exposed_comm_us == pytest.approx(r.comm_us - r.overlap_us)
    assert sorted({(st.rank, st.step) for st in s.steps}) == [(r, n) for r in (0, 1) for n in (2, 3, 4)]
    assert [k.step for k in s.step_skew] == [2, 3, 4]
    assert all(k.lag_us >= 0 for k in s.step_skew)
    assert s.ranks[1].compute_us > s.ranks[0].compute_us
    assert any(d.kind == "straggler" and d.message.startswith("Rank 1 ") for d in s.diagnostics)
    assert "Ranks (means per step)" in s.render() and "Slowest rank per step" in s.render()


def _brute(spans: list[tuple[int, int]]) -> np.ndarray:
    covered = np.zeros(200, bool)
    for a, b in spans:
        covered[a:b] = True
    return covered


def test_interval_arithmetic_against_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(50):
        sets = []
        for _ in range(2):
            a = rng.integers(0, 190, 12)
            sets.append((a, a + rng.integers(0, 10, 12)))
        ua, ub = iv.union(*sets[0]), iv.union(*sets[1])
        ca, cb = _brute(zip(*sets[0])), _brute(zip(*sets[1]))
        assert iv.total(ua) == ca.sum()
        assert np.all(ua[0][1:] > ua[1][:-1])  # disjoint, sorted, not touching
        assert iv.total(iv.intersect(ua, ub)) == (ca & cb).sum()
        assert iv.total(iv.subtract(ua, ub)) == (ca & ~cb).sum()
        assert iv.total(iv.merge(ua, ub)) == (ca | cb).sum()
        lo = rng.integers(0, 150, 5)
        hi = lo + rng.integers(0, 50, 5)
        assert iv.length_in(ua, lo, hi).tolist() == [int(ca[a:b].sum()) for a, b in zip(lo, hi)]


@pytest.mark.parametrize("trace", sorted(FIXTURES.glob("*.pt.trace.json.gz")), ids=lambda p: p.name)
def test_recorded_gpu_trace(trace):
    """GPU traces recorded on a device (tests/fixtures): the breakdown is consistent with the kernels."""
    s = summarize(trace)
    assert s.kernels and s.has_gpu
    for st in s.steps:
        assert 0 < st.gpu_busy_us <= st.wall_us + 1e-6
        assert st.gpu_idle_us == pytest.approx(st.wall_us - st.gpu_busy_us)
        assert max(st.kernel_us, st.memcpy_us, st.memset_us, st.comm_us) <= st.gpu_busy_us + 1e-6
    assert sum(op.self_cuda_us for op in s.ops) <= sum(k.total_us for k in s.kernels) + 1e-3


# key_averages() of the H100 run (torch 2.11+cu130) that wrote tests/fixtures/gpu_mlp_h100.pt.trace.json.gz: the
# MLP of test_gpu_profile_matches_key_averages, profiled in the same process. Transcribed from its table sorted by
# self CUDA time (the 25 rows printed; times in us to 3 decimals, memory as printed). aten::mean, aten::div and
# aten::mul launch their kernels from a same-name only child that key_averages folds into them.
H100_OPS = {  # name: (calls, self CUDA us, CUDA total us, CUDA Mem)
    "aten::addmm": (6, 72.354, 72.354, "391.50 KB"),
    "aten::mm": (9, 37.185, 37.185, "1.93 MB"),
    "aten::_foreach_add_": (3, 27.937, 27.937, "0 B"),
    "aten::sum": (6, 24.511, 24.511, "7.50 KB"),
    "aten::copy_": (6, 19.457, 19.457, "0 B"),
    "aten::mul": (6, 7.744, 7.744, "15.00 KB"),
    "aten::mean": (3, 6.657, 6.657, "1.50 KB"),
    "aten::_local_scalar_dense": (3, 4.288, 4.288, "0 B"),
    "aten::div": (3, 4.032, 4.032, "7.50 KB"),
}
H100_LABELS = {"Optimizer.step#SGD.step": (3, 27.937)}  # name: (calls, CUDA total us)
H100_KERNELS = {  # name as the table prints it (52 characters + "..."): (calls, self CUDA us) of each such activity
    "void sgemm_largek_lds64<true, false, 5, 5, 4, 4, 4, ...": [(3, 38.785)],
    "void at::native::(anonymous namespace)::multi_tensor...": [(3, 27.937)],
    "sm80_xmma_gemm_f32f32_f32f32_f32_nt_n_tilesize32x32x...": [(6, 22.305)],
    "void cutlass::Kernel2<cutlass_80_simt_sgemm_64x64_8x...": [(3, 17.761), (3, 9.280)],
    "Memcpy HtoD (Pageable -> Device)": [(3, 16.448)],
    "void at::native::reduce_kernel<256, 2, at::native::R...": [(3, 14.144)],
    "void at::native::reduce_kernel<128, 4, at::native::R...": [(3, 10.367)],
    "void at::native::reduce_kernel<512, 1, at::native::R...": [(3, 6.657)],
    "void cublasLt::splitKreduce_kernel<32, 16, int, floa...": [(3, 6.368), (3, 5.600)],
    "Memcpy DtoH (Device -> Pinned)": [(3, 4.288)],
    "void cublasLt::epilogue::impl::globalKernel<8, 32, f...": [(3, 4.224)],
    "void at::native::elementwise_kernel<128, 2, at::nati...": [(3, 4.032)],
}
H100_SELF_CUDA_TOTAL_US = 218.597


def _as_printed(name: str, nbytes: int | None = None) -> str:
    """A name or byte count the way key_averages' table prints it (profiler_util, name column width 55)."""
    if nbytes is None:
        return name if len(name) <= 55 else name[:52] + "..."
    for unit, size in (("GB", 1024**3), ("MB", 1024**2), ("KB", 1024)):
        if abs(nbytes) >= size:
            return f"{nbytes / size:.2f} {unit}"
    return f"{nbytes} B"


def test_h100_trace_matches_its_key_averages(tmp_path):
    """A real GPU trace, summarized on CPU: per-op and per-kernel CUDA time as key_averages() gave, GPU findings."""
    s = summarize(FIXTURES / "gpu_mlp_h100.pt.trace.json.gz")
    ops = {op.name: op for op in s.ops}
    for name, (calls, self_cuda, cuda_total, memory) in H100_OPS.items():
        op = ops[name]
        assert (op.calls, _as_printed(name, op.cuda_memory)) == (calls, memory), name
        assert op.self_cuda_us == pytest.approx(self_cuda, abs=1e-3), name
        assert op.cuda_total_us == pytest.approx(cuda_total, abs=1e-3), name
    labels = {label.name: (label.count, label.cuda_total_us) for label in s.labels}
    for name, (calls, cuda_total) in H100_LABELS.items():
        assert labels[name] == (calls, pytest.approx(cuda_total, abs=1e-3)), name
    kernels: dict[str, list] = {}
    for k in s.kernels:
        kernels.setdefault(_as_printed(k.name), []).append((k.count, k.total_us))
    for name, rows in H100_KERNELS.items():
        (ours_calls, ours_us), (calls, us) = zip(*sorted(kernels[name])), zip(*sorted(rows))
        assert ours_calls == calls and ours_us == pytest.approx(us, abs=1e-3), name
    assert sum(k.total_us for k in s.kernels) == pytest.approx(H100_SELF_CUDA_TOTAL_US, abs=1e-3)
    assert sum(op.self_cuda_us for op in s.ops) == pytest.approx(H100_SELF_CUDA_TOTAL_US, abs=1e-3)

    s.export_stacks(tmp_path / "cuda.folded", metric="self_cuda")  # every kernel under a host op, none lost
    lines = (tmp_path / "cuda.folded").read_text().splitlines()
    assert not [line for line in lines if line.startswith("(no host op)")]
    assert any(line.startswith("ProfilerStep*;aten::mean;void at::native::reduce_kernel<512, 1,") for line in lines)

    # each step: one 64x256 float32 batch copied from pageable memory, and two host waits (that copy, loss.item())
    found = {d.kind: d.message for d in s.diagnostics}
    pageable = "3 host<->device copies from pageable memory (192.0 KB, 16.4 us in 3 steps)"
    assert found["pageable_memcpy"].startswith(pageable)
    assert found["sync"].startswith("2.0 host-GPU synchronizations per step (cudaStreamSynchronize x6; 3 in reads")


def test_only_reads_that_call_a_sync_count_as_reads_of_gpu_tensors(tmp_path):
    """The H100 trace with 100 reads of CPU tensors (no runtime call under them) added to each step: still the three
    loss.item() calls that waited for the GPU."""
    doc = json.loads(gzip.decompress((FIXTURES / "gpu_mlp_h100.pt.trace.json.gz").read_bytes()))
    events = doc["traceEvents"]
    op = next(e for e in events if e.get("cat") == "cpu_op" and e["name"] == "aten::_local_scalar_dense")
    for step in [e for e in events if e.get("name", "").startswith("ProfilerStep#")]:
        events += [dict(op, ts=step["ts"] + 1 + 0.01 * i, dur=0.005) for i in range(100)]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "w.pt.trace.json").write_text(json.dumps(doc))
    found = {d.kind: d.message for d in summarize(tmp_path / "run").diagnostics}
    assert "(cudaStreamSynchronize x6; 3 in reads of GPU tensors" in found["sync"]


def _torch_parents(thread: np.ndarray, start: np.ndarray, end: np.ndarray) -> list[int]:
    """torch's own stack pass (profiler_util.EventList._populate_cpu_children), written out literally."""
    parent = [-1] * start.size
    for t in set(thread.tolist()):
        stack: list[int] = []
        for i in sorted(np.flatnonzero(thread == t).tolist(), key=lambda k: (start[k], -end[k])):
            while stack and (start[i] >= end[stack[-1]] or end[i] > end[stack[-1]]):
                stack.pop()
            if stack:
                parent[i] = stack[-1]
            stack.append(i)
    return parent


def test_call_tree_matches_torch_nesting_rules():
    """Nested, partially overlapping and zero-length events on several threads."""
    rng = np.random.default_rng(1)
    for _ in range(200):
        n = int(rng.integers(1, 80))
        thread, start = rng.integers(0, 3, n), rng.integers(0, 40, n)
        end = start + rng.integers(0, 12, n)
        tree = nest(thread, start, end, np.arange(n))  # distinct names: nothing folded
        assert tree.parent.tolist() == _torch_parents(thread, start, end)
        for i, p in enumerate(tree.parent.tolist()):
            assert tree.depth[i] == (tree.depth[p] + 1 if p >= 0 else 0)


def test_call_tree_folds_single_same_name_children_like_torch():
    """torch drops a child named like its parent when it is the parent's only child (_remove_dup_nodes)."""
    #          A0 [0,10] > A1 [1,9] > A2 [1,8] > B3 [2,3], B4 [4,5];  C5 [20,30] > C6 [21,25], D7 [26,27]
    start = np.array([0, 1, 1, 2, 4, 20, 21, 26])
    end = np.array([10, 9, 8, 3, 5, 30, 25, 27])
    name = np.array([0, 0, 0, 1, 1, 2, 2, 3])
    tree = nest(np.zeros(8, np.int64), start, end, name)
    assert tree.keep.tolist() == [True, False, False, True, True, True, True, True]
    assert tree.parent[[3, 4, 6, 7]].tolist() == [0, 0, 5, 5]
    assert (end - start - tree.children_sum((end - start).astype(float))).tolist()[0] == 10 - 2


def test_folded_duplicates_report_kernels_like_torch():
    """GPU time per event after folding, against torch's own EventList (_build_tree) on random call trees.

    torch moves a folded child's kernels to the survivor, replacing the survivor's own (`_remove_dup_nodes`).
    """
    from torch.autograd.profiler_util import EventList, FunctionEvent

    rng = np.random.default_rng(2)
    folds = 0
    for _ in range(200):
        n = int(rng.integers(1, 40))
        thread, name, start = rng.integers(0, 2, n), rng.integers(0, 2, n), rng.integers(0, 30, n)
        end = start + rng.integers(0, 15, n)
        kernel_us = rng.integers(0, 5, n).astype(float)
        events = []
        for i in sorted(range(n), key=lambda k: (start[k], -end[k])):  # torch's event order
            ev = FunctionEvent(i, f"op{name[i]}", int(thread[i]), int(start[i]), int(end[i]), use_device="cuda")
            if kernel_us[i]:
                ev.append_kernel("k", 0, kernel_us[i])
            events.append(ev)
        ref = EventList(events, use_device="cuda")
        ref._build_tree()
        tree = nest(thread, start, end, name)
        self_cuda = tree.lift_kernels(kernel_us)
        cuda = tree.subtree_sum(self_cuda)
        assert sorted(e.id for e in ref) == np.flatnonzero(tree.keep).tolist()
        for e in ref:
            assert (self_cuda[e.id], cuda[e.id]) == (e.self_device_time_total, e.device_time_total)
        folds += int((~tree.keep).sum())
    assert folds > 100


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_gpu_profile_matches_key_averages(tmp_path):
    """On a GPU: kernel and per-op CUDA times against key_averages(); copies and syncs are diagnosed."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    write = tensorboard_trace_handler(str(tmp_path / "gpu"), worker_name="host_1")
    seen = {}

    def on_ready(prof) -> None:
        seen["ops"] = prof.key_averages()
        write(prof)

    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        profile_memory=True,
        schedule=schedule(wait=1, warmup=1, active=ACTIVE, repeat=1),
        on_trace_ready=on_ready,
    ) as prof:
        for _ in range(2 + ACTIVE):
            x = torch.randn(64, 256).to("cuda")  # pageable host memory
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            loss.item()  # a synchronization every step
            prof.step()
    s = summarize(tmp_path / "gpu")
    ref = {e.key: e for e in seen["ops"]}
    assert s.kernels and s.has_gpu
    for k in s.kernels:
        assert k.count == ref[k.name].count, k.name
        assert k.total_us == pytest.approx(ref[k.name].self_device_time_total, rel=1e-3, abs=0.01), k.name
    for op in s.ops:
        assert op.calls == ref[op.name].count, op.name
        assert op.self_cuda_us == pytest.approx(ref[op.name].self_device_time_total, rel=1e-3, abs=0.01), op.name
        assert op.cuda_total_us == pytest.approx(ref[op.name].device_time_total, rel=1e-3, abs=0.01), op.name
        assert op.cuda_memory == ref[op.name].device_memory_usage, op.name
    for st in s.steps:
        assert 0 < st.kernel_us <= st.gpu_busy_us <= st.wall_us
        assert st.memcpy_us > 0 and st.peak_memory > 0
    assert {"pageable_memcpy", "sync"} <= {d.kind for d in s.diagnostics}


def test_scaled_trace_reads_as_a_longer_profile_of_the_same_mix(tmp_path):
    """benchmarks/traces.py scale (the big benchmark traces): each copy adds the same steps, calls and kernel time."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        import traces
    finally:
        sys.path.pop(0)
    source = FIXTURES / "gpu_small.pt.trace.json.gz"
    one = summarize(source)
    out = traces.scale(source, tmp_path / "big.pt.trace.json", mb=0.7)
    copies = round(out.stat().st_size / len(gzip.decompress(source.read_bytes())))
    three = summarize(out)
    assert copies >= 3 and len(three.steps) == copies * len(one.steps)
    assert len({s.step for s in three.steps}) == len(three.steps)  # step numbers moved, not repeated
    assert {o.name: o.calls for o in three.ops} == {o.name: copies * o.calls for o in one.ops}
    for k1, k3 in zip(sorted(one.kernels, key=lambda k: k.name), sorted(three.kernels, key=lambda k: k.name)):
        assert k3.count == copies * k1.count and k3.total_us == pytest.approx(copies * k1.total_us, rel=1e-6)


# -- reading big files: in pieces, in worker processes -------------------------------------------------------------
def _scaled(tmp_path: Path, mb: float, name: str = "big") -> Path:
    """The H100 fixture repeated to about ``mb`` MB (benchmarks/traces.py scale)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        import traces
    finally:
        sys.path.pop(0)
    run_dir = tmp_path / name
    run_dir.mkdir()
    return traces.scale(FIXTURES / "gpu_small.pt.trace.json.gz", run_dir / "gpuhost_1.1.pt.trace.json", mb=mb)


def _whole_file_summary(path: Path, monkeypatch) -> dict:
    with monkeypatch.context() as m:
        m.setattr(reader, "_HEAD_BYTES", 8)  # "traceEvents" is never found: each file is decoded in one go
        return summarize(path).to_dict()


def test_pieces_and_workers_read_what_one_whole_decode_reads(tmp_path, monkeypatch):
    """A trace cut into ~40 pieces, read in this process and in 3 worker processes (and gzipped), gives the summary
    of the file decoded in one go; the pieces were really used (progress counts each one)."""
    path = _scaled(tmp_path, mb=1.5)
    gz = path.with_name("gpuhost_1.2.pt.trace.json.gz")
    gz.write_bytes(gzip.compress(path.read_bytes()))
    whole = _whole_file_summary(path, monkeypatch)
    monkeypatch.setattr(reader, "CHUNK_BYTES", 40_000)
    monkeypatch.setattr(reading, "_POOL_BYTES", 0)
    monkeypatch.setattr(reading, "_JOB_BYTES", 1)
    assert len(reader.plan(path).pieces) > 30 and len(reader.plan(gz).pieces) > 30
    for source in (path, gz):
        for jobs in (1, 3):
            done = []
            got = summarize(source, jobs=jobs, progress=lambda n, total: done.append((n, total)))
            assert got.to_dict() | {"name": whole["name"], "files": whole["files"]} == whole, (source.name, jobs)
            assert len(done) > 30 and done[-1] == (source.stat().st_size, source.stat().st_size)


@pytest.mark.parametrize("jobs", [4, 8], ids=["whole files", "pieces"])
def test_two_files_in_workers_are_analyzed_like_in_one_process(tmp_path, monkeypatch, jobs):
    """With at least half as many files as processes, each process reads whole files; with fewer, the files' pieces
    are spread over the processes. Either way the summary is the one this process makes alone."""
    path = _scaled(tmp_path, mb=0.5)
    other = path.with_name("rank1_gpuhost_2.1.pt.trace.json")
    shutil.copy(path, other)
    here = summarize(path.parent).to_dict()
    monkeypatch.setattr(reader, "CHUNK_BYTES", 100_000)
    monkeypatch.setattr(reading, "_POOL_BYTES", 0)
    monkeypatch.setattr(reading, "_JOB_BYTES", 1)
    submitted = []
    submit = reading.Workers.submit

    def recorded(self, fn, *args):
        submitted.append(fn)
        return submit(self, fn, *args)

    monkeypatch.setattr(reading.Workers, "submit", recorded)
    assert summarize(path.parent, jobs=jobs).to_dict() == here
    assert (reading._read_whole in submitted) == (jobs == 4)


def test_a_whole_file_task_with_helpers_reads_what_it_reads_alone(tmp_path, monkeypatch):
    """A process that reads a whole file (a rank's, say) with a helper process of its own decodes its pieces in both
    and analyzes the file as it does alone."""
    path = _scaled(tmp_path, mb=0.5)
    alone = reading._read_whole(path, 1)
    monkeypatch.setattr(reader, "CHUNK_BYTES", 50_000)
    monkeypatch.setattr(reading, "_POOL_BYTES", 0)
    monkeypatch.setattr(reading, "_JOB_BYTES", 1)
    pieces = mock.Mock(wraps=reading._read_in)
    monkeypatch.setattr(reading, "_read_in", pieces)
    helped = reading._read_whole(path, 2)
    assert pieces.called and pickle.dumps(helped) == pickle.dumps(alone)


def test_a_file_that_does_not_cut_cleanly_is_decoded_whole(tmp_path, monkeypatch):
    """An event whose args hold a list of objects laid out like events: a cut lands inside it, the piece does not
    decode, and the file is decoded in one go instead, with the same result."""
    path = _scaled(tmp_path, mb=0.3)
    text = path.read_bytes()
    odd = b'"args": {\n      "odd": [{"a": 1},\n  {"b": 2}],'
    text = text.replace(b'"args": {', odd, 200)
    path.write_bytes(text)
    whole = _whole_file_summary(path, monkeypatch)
    monkeypatch.setattr(reader, "CHUNK_BYTES", 10_000)
    assert summarize(path).to_dict() == whole


def test_not_utf8_names_the_offset_of_the_bad_byte(tmp_path):
    path = tmp_path / "w.1.pt.trace.json"
    text = b'{"traceEvents": [{"ph": "X", "name": "aten::mm\xff", "cat": "cpu_op", "ts": 1, "dur": 2}]}'
    path.write_bytes(text)
    with pytest.raises(ValueError, match=f"not UTF-8: byte 0xff at offset {text.index(bytes([0xFF]))}"):
        summarize(path)


@pytest.mark.parametrize("kind", ["char device", "fifo"])
def test_a_path_that_is_no_file_or_folder_is_one_line(tmp_path, capsys, kind):
    path = Path("/dev/null") if kind == "char device" else tmp_path / "fifo"
    if kind == "fifo":
        os.mkfifo(path)
    assert main(["summary", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.strip() == f"kprof summary: {path} is neither a trace file nor a folder"


def test_a_worker_that_dies_fails_its_task_and_is_replaced():
    from kprof_callbacks.analysis.workers import WorkerError, Workers

    with Workers(2) as workers:
        assert workers.submit(os.getpid).result(timeout=120) != os.getpid()
        with pytest.raises(WorkerError, match="worker process ended.*_exit"):
            workers.submit(os._exit, 3).result(timeout=120)
        assert workers.submit(len, "abc").result(timeout=120) == 3
        with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):  # never sent: fails, never hangs
            workers.submit(len, lambda: 0).result(timeout=120)
        assert workers.submit(len, "ab").result(timeout=120) == 2
        with pytest.raises(ZeroDivisionError):
            workers.submit(divmod, 1, 0).result(timeout=120)
        later = [workers.submit(pow, 2, k) for k in range(8)]
        workers.wait(later)  # this process runs some of them itself
        assert [f.result() for f in later] == [2**k for k in range(8)]


@pytest.mark.timeout(120)  # a deadlock shows as a hang
def test_workers_take_the_next_task_while_they_run_one():
    """Two tasks in a worker's hands at once: big arguments and results (past any pipe's capacity) cross both ways
    without a deadlock, and a worker that dies leaves the task queued behind its own to its replacement."""
    from kprof_callbacks.analysis.workers import WorkerError, Workers

    big = 8 << 20
    with Workers(2) as workers:  # one worker; .result() leaves every task to it
        back = [workers.submit(bytes, big) for _ in range(3)]
        out = [workers.submit(len, b"x" * big) for _ in range(3)]
        assert [len(f.result(timeout=120)) for f in back] + [f.result(timeout=120) for f in out] == [big] * 6
        died, behind = workers.submit(os._exit, 3), [workers.submit(os.getpid) for _ in range(2)]
        with pytest.raises(WorkerError, match="_exit"):
            died.result(timeout=120)
        assert {f.result(timeout=120) for f in behind} - {os.getpid(), None}
    with Workers(3) as workers:  # a second task only while the queue has one for every process: few big tasks spread
        nap = "__import__('time').sleep(0.5) or __import__('os').getpid()"  # a builtin: the worker imports nothing
        slow = [workers.submit(eval, nap) for _ in range(2)]
        assert len({f.result(timeout=120) for f in slow}) == 2


@pytest.mark.skipif(sys.platform != "linux" or os.confstr("CS_GNU_LIBC_VERSION") is None, reason="glibc's mallopt")
def test_analysis_processes_take_freed_memory_again_without_page_faults():
    """After keep_freed_memory() (the CLI's analysis and every worker), an array freed and allocated again costs no
    page faults; glibc's default hands a 20 MB block back to the system and faults it in anew each time."""
    script = textwrap.dedent(
        """
        import resource, sys
        import numpy as np
        from kprof_callbacks.analysis.workers import keep_freed_memory
        if sys.argv[1] == "kept":
            keep_freed_memory()
        faults = []
        for mb in (20, 8, 20, 12, 8):  # arrays of the sizes a summary makes, each freed at once
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            np.ones(mb << 17)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        print(*faults)
        """
    )
    faults = {}
    for mode in ("kept", "default"):
        done = subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True, timeout=120)
        faults[mode] = [int(n) for n in done.stdout.split()]
    assert faults["kept"][0] > 100 and max(faults["kept"][1:]) < faults["kept"][0] / 10, faults
    assert sum(faults["default"][1:]) > faults["default"][0], faults  # the default does fault again


def test_a_run_over_100_mb_shows_a_progress_bar_on_stderr(tmp_path, monkeypatch, capsys):
    path = _scaled(tmp_path, mb=0.5)
    monkeypatch.setattr(reader, "CHUNK_BYTES", 50_000)
    summarize(path, progress=True)
    assert capsys.readouterr().err == ""  # under PROGRESS_BYTES: no bar
    monkeypatch.setattr(reading, "PROGRESS_BYTES", 100_000)
    summarize(path, progress=True)
    err = capsys.readouterr().err
    assert f"summarizing {path.name}" in err and "100%" in err and f"{path.stat().st_size / 1024:.0f}k" in err


@pytest.mark.parametrize("command", ["summary", "diff"])
def test_cli_report_to_a_folder_or_a_full_disk_is_one_line(tmp_path, run, capsys, monkeypatch, command):
    sides = [str(run[0])] * (2 if command == "diff" else 1)
    assert main([command, *sides, "--html", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"kprof {command}: --html {tmp_path}: is a folder; name the file to write, e.g. {tmp_path / 'report.html'}\n"
    )
    out = tmp_path / "report.html"

    def disk_full(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", disk_full)
    assert main([command, *sides, "--html", str(out)]) == 1
    assert capsys.readouterr().err == f"kprof {command}: could not write {out}: No space left on device\n"
    assert list(tmp_path.iterdir()) == []  # no half-written report left behind
