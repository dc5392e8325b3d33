"""Memory growth across steps and model FLOPs utilization: the detector on known series, real loops that leak (and
ones that do not), the allocation sites of a snapshot, the dense peak table, and the scalars a session writes."""

from __future__ import annotations

import collections
import gzip
import mmap
import pickle
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import kprof_callbacks as kprof
from kprof_callbacks import layout, peaks, scalars
from kprof_callbacks.analysis import reader, trends
from kprof_callbacks.analysis.growth import growth
from kprof_callbacks.analysis.trends import growing_sites
from kprof_callbacks.history import KEEP_STEPS
from kprof_callbacks.metrics import EARLY_MEMORY_STEPS

FIXTURES = Path(__file__).parent / "fixtures"

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
STEPS = np.arange(0, 300, 2)  # memory sampled every 2 steps


def _noise(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 3.0, STEPS.size)


@pytest.mark.parametrize("seed", range(5))
def test_a_steady_leak_is_found_with_its_rate(seed):
    found = growth(STEPS, 500 + 2.0 * STEPS + _noise(seed))
    assert found is not None and found.low <= 2.0 <= found.high and abs(found.mb_per_step - 2.0) < 0.05


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("shape", ["steady", "warm-up growth", "one plateau", "two plateaus", "sawtooth"])
def test_no_growth_is_named_where_there_is_none(seed, shape):
    base = {
        "steady": np.full(STEPS.size, 800.0),
        "warm-up growth": np.minimum(300 + 20.0 * STEPS, 900.0),  # grows for the first 30 steps, then flat
        "one plateau": np.where(STEPS < 140, 800.0, 1200.0),  # the caching allocator reserves a bigger segment
        "two plateaus": 800.0 + 300.0 * (STEPS >= 100) + 300.0 * (STEPS >= 200),
        "sawtooth": 800.0 + 40.0 * ((STEPS // 2) % 4),  # gradient accumulation: up for 4 steps, then freed
    }[shape]
    assert growth(STEPS, base + _noise(seed)) is None


def _run(tmp_path, keep_mb: float, device: str, steps: int = 120, **options):
    kept = []
    with kprof.session(tmp_path, run="r", wait=5, warmup=1, active=1, memory_every=2, **options) as s:
        for _ in range(steps):
            if keep_mb:  # on the CPU fresh pages: memory earlier tests freed would take a kept tensor unseen
                kept.append(_resident(keep_mb) if device == "cpu" else torch.ones(int(keep_mb * 2**18), device=device))
            s.step()
    return s.summary()


def _growth_findings(summary) -> list[str]:
    return [d.message for d in summary.diagnostics if d.kind == "memory_growth"]


def test_a_loop_that_keeps_a_tensor_every_step_is_named_and_a_steady_one_is_not(tmp_path):
    (message,) = _growth_findings(_run(tmp_path / "leak", 1.0, "cpu"))
    assert "the process's resident memory" in message
    rate = float(message.split("Memory grows ")[1].split(" MB per step")[0])
    assert 0.95 <= rate <= 1.6  # 1 MB kept a step, plus what the host allocator keeps beside it
    assert _growth_findings(_run(tmp_path / "steady", 0.0, "cpu")) == []


def test_memory_scalars_are_written_every_step_at_first_then_every_memory_every_steps(tmp_path):
    summary = _run(tmp_path, 0.0, "cpu", steps=EARLY_MEMORY_STEPS + 10)
    (series,) = summary.series.values()
    rss = series[layout.MEMORY_TAGS["rss"]]
    expected = list(range(EARLY_MEMORY_STEPS)) + list(range(EARLY_MEMORY_STEPS + 1, EARLY_MEMORY_STEPS + 10, 2))
    assert rss.steps.tolist() == expected and (rss.values > 10).all()
    assert series[layout.STEP_TIME_TAG].steps.tolist() == list(range(EARLY_MEMORY_STEPS + 10))


def _resident(mb: float) -> mmap.mmap:
    """``mb`` of new resident memory (tensors freed by earlier tests would be reused by malloc without a trace)."""
    block = mmap.mmap(-1, int(mb * 2**20))
    block.write(b"\1" * len(block))
    return block


@pytest.fixture
def resident_mb(monkeypatch) -> list[float]:
    """The resident memory the session samples, set by the test (``resident_mb[0]``, MB): on a machine short of
    memory (a loaded GPU host swapping) the process's real RSS drops pages it holds, and a leak's rate with them."""
    rss, held = layout.MEMORY_TAGS["rss"], [500.0]
    sample = scalars.MemoryProbe.sample
    monkeypatch.setattr(scalars.MemoryProbe, "sample", lambda self: {**sample(self), rss: held[0]})
    return held


def test_the_resident_memory_sampled_is_the_processs():
    probe = scalars.MemoryProbe(None)
    before = probe.sample()[layout.MEMORY_TAGS["rss"]]
    block = _resident(64)
    assert probe.sample()[layout.MEMORY_TAGS["rss"]] - before >= 63
    block.close()
    probe.close()


@pytest.mark.parametrize("steps, mb", [(40, 2.0), (60, 4.0)])
def test_a_clear_leak_is_found_in_a_short_run(tmp_path, resident_mb, steps, mb):
    """2 MB a step for 40 steps, 4 MB a step for 60 (the default memory_every=5): every early step is sampled."""
    with kprof.session(tmp_path, run="r", wait=steps - 2, warmup=1, active=1) as s:
        for _ in range(steps):
            resident_mb[0] += mb
            s.step()
    (message,) = _growth_findings(s.summary())
    assert f"Memory grows {mb:.2f} MB per step" in message and "the process's resident memory" in message


def test_a_short_run_that_keeps_nothing_has_no_growth(tmp_path):
    with kprof.session(tmp_path, run="r", wait=38, warmup=1, active=1) as s:
        for _ in range(40):
            torch.ones(2**19).sum()
            s.step()
    assert _growth_findings(s.summary()) == []


def _state_bytes(obj, seen: set[int]) -> int:
    """Bytes held by ``obj`` and what it refers to through containers and attributes (code, modules, classes,
    threads and torch's own objects left out: the session's state, not the interpreter's)."""
    if id(obj) in seen or callable(obj) or isinstance(obj, (types.ModuleType, threading.Thread, torch.Tensor)):
        return 0
    if type(obj).__module__.startswith(("torch", "threading", "_thread", "queue")):
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(_state_bytes(k, seen) + _state_bytes(v, seen) for k, v in obj.items())
    elif isinstance(obj, (list, tuple, set, frozenset, collections.deque)):
        size += sum(_state_bytes(x, seen) for x in obj)
    elif hasattr(obj, "__dict__"):
        size += _state_bytes(vars(obj), seen)
    return size


def test_a_quarter_million_steps_keep_the_sessions_state_flat(tmp_path, monkeypatch):
    """Everything the session does at a step boundary except torch's own ``prof.step()`` (the profiler's C++ state
    is torch's), with the slow-step trigger, memory samples and scalars: its state stops growing once its history is
    full (``history.KEEP_STEPS``), so a leak detector reading the process's memory never sees kprof. 250,000 steps
    within 256 KB: about a byte a step, less than any object or array slot kept per step."""
    monkeypatch.setattr(scalars.EventFile, "writer", lambda self, rows: lambda: None)  # no 250k events on disk
    with kprof.session(tmp_path, run="r", wait=10**7, trigger="slow_step", peak_tflops=1.0) as s:
        s._recorder.prof.step = lambda: None
        timer = s._metrics.timer
        for _ in range(KEEP_STEPS):
            s.step(samples=8, flops=1e9)
        full = _state_bytes(s, set())
        for _ in range(250_000):
            timer.end()
            s._bookkeeping(8, 1e9)
            timer.start()
        assert s.steps == KEEP_STEPS + 250_000
        grown = _state_bytes(s, set()) - full
    assert grown < 2**18, f"the session's state grew {grown} bytes over 250,000 steps"


@cuda
def test_a_cuda_leak_is_found_at_its_exact_rate_and_its_site_named(tmp_path):
    summary = _run(tmp_path, 1.0, "cuda", memory_snapshot=True)
    (message,) = _growth_findings(summary)
    assert "CUDA memory allocated" in message and "Memory grows 1.00 MB per step" in message
    assert "test_memory_mfu.py" in message and "in _run" in message


def test_growing_sites_name_the_programs_own_frame_of_allocations_still_alive(tmp_path):
    def frames(line: int) -> list[dict]:
        return [
            {"filename": "/usr/lib/python3/site-packages/torch/nn/modules/linear.py", "line": 125, "name": "f"},
            {"filename": "/home/me/train.py", "line": line, "name": "train"},
        ]

    trace = [{"action": "alloc", "addr": 1 + i, "size": 2**20, "frames": frames(10)} for i in range(15)]  # warm-up
    for i in range(20):
        trace.append({"action": "alloc", "addr": 100 + i, "size": 2**20, "frames": frames(42)})  # kept
        trace.append({"action": "alloc", "addr": 1000 + i, "size": 2**22, "frames": frames(50)})  # freed
        trace.append({"action": "free_completed", "addr": 1000 + i, "size": 2**22})
    path = tmp_path / "w.memory_snapshot.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [trace]}))
    assert growing_sites([path]) == "train.py:42 in train (20 blocks, 20.0 MB)"


def _flops_run(tmp_path, run: str, flops: float, sleep: float = 0.0, **options):
    with kprof.session(tmp_path, run=run, wait=5, **options) as s:
        for _ in range(30):
            time.sleep(sleep)
            s.step(flops=flops)
    return s


def _mfu_findings(s) -> list:
    return [d for d in s.summary().diagnostics if d.kind.startswith("mfu")]


def test_mfu_against_the_peak_given_and_tflops_without_one(tmp_path):
    flops = 4e9
    s = _flops_run(tmp_path, "given", flops, sleep=0.002, peak_tflops=50.0)  # ~2 TFLOP/s: ~4% of 50
    (series,) = s.summary().series.values()
    tflops, mfu = series[layout.TFLOPS_TAG], series[layout.MFU_TAG]
    times = np.array(s.step_times)
    assert np.allclose(tflops.values, flops / times / 1e12, rtol=1e-5) and np.allclose(mfu.values, tflops.values / 50)
    assert series[layout.PEAK_TAG].values.tolist() == [50.0]
    (finding,) = _mfu_findings(s)
    assert finding.kind == "mfu" and finding.severity == "info"
    assert finding.message.startswith("Model FLOPs utilization") and "dense peak of 50.0 TFLOP/s" in finding.message

    if torch.cuda.is_available():
        pytest.skip("the unknown-device case needs a device missing from the table")
    with pytest.warns(RuntimeWarning, match="pass peak_tflops="):
        s = _flops_run(tmp_path, "unknown", flops)
    (finding,) = _mfu_findings(s)
    assert "No MFU" in finding.message and "peak_tflops=" in finding.message


def test_mfu_above_100_percent_is_a_warning_that_the_flops_are_wrong(tmp_path):
    """peak_tflops=1 and FLOPs that are wrong used to read 'Model FLOPs utilization 35887%'."""
    s = _flops_run(tmp_path, "given", 1e12, sleep=0.002, peak_tflops=1.0)  # ~500 TFLOP/s against a peak of 1
    (finding,) = _mfu_findings(s)
    assert finding.kind == "mfu_impossible" and finding.severity == "warning"
    assert finding.message.startswith("Model FLOPs utilization ")
    assert "against a dense peak of 1.0 TFLOP/s" in finding.message
    assert "the FLOPs given per step are likely wrong" in finding.message
    if torch.cuda.is_available():
        pytest.skip("the unknown-device case needs a device missing from the table")
    with pytest.warns(RuntimeWarning, match="pass peak_tflops="):
        s = _flops_run(tmp_path, "unknown", 1e17, sleep=0.002)  # ~5e4 TFLOP/s: no GPU does that
    (finding,) = _mfu_findings(s)
    assert finding.kind == "mfu_impossible" and f"tops out at {peaks.HIGHEST_TFLOPS:g} TFLOP/s" in finding.message


@pytest.mark.parametrize(
    "name, dtype, peak",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4),  # SXM: dense, half of the datasheet's 1,979 "with sparsity"
        ("NVIDIA H100 PCIe", "bf16", 756.0),
        ("NVIDIA H100 NVL", "fp8", 1670.5),
        ("NVIDIA H200", "tf32", 494.7),
        ("NVIDIA GH200 480GB", "bf16", 989.4),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
        ("NVIDIA B200", "bf16", 2250.0),
        ("NVIDIA L40S", "fp16", 362.05),
        ("NVIDIA L4", "bf16", 121.0),
        ("NVIDIA A100-SXM4-40GB", "fp8", None),  # Ampere has no fp8
        ("NVIDIA GeForce RTX 4090", "bf16", None),
    ],
)
def test_the_dense_peak_table(name, dtype, peak):
    assert peaks.peak_tflops(name, dtype) == peak


@pytest.mark.parametrize(
    "name, tbps",
    [
        ("NVIDIA H100 80GB HBM3", 3.35),
        ("NVIDIA H100 PCIe", 2.0),
        ("NVIDIA H200", 4.8),
        ("NVIDIA GH200 480GB", 4.0),
        ("NVIDIA A100-SXM4-80GB", 2.039),
        ("NVIDIA A100-SXM4-40GB", 1.555),
        ("NVIDIA L40S", 0.864),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_the_memory_bandwidth_table(name, tbps):
    assert peaks.memory_tbps(name) == tbps


def test_bad_flops_and_mfu_options_fail_before_anything_runs(tmp_path):
    with pytest.raises(ValueError, match="mfu_dtype"):
        kprof.session(tmp_path, mfu_dtype="int8")
    with pytest.raises(ValueError, match="peak_tflops"):
        kprof.session(tmp_path, peak_tflops=0.0)
    with pytest.raises(ValueError, match="flops_per_batch"):
        kprof.ProfilerCallback(flops_per_batch=-1)
    with kprof.session(tmp_path, run="r") as s:
        with pytest.raises(ValueError, match="flops must be"):
            s.step(flops=float("nan"))


def test_matrix_product_flops_are_counted_from_recorded_shapes(tmp_path):
    """with_flops=True: the trace's mm/addmm shapes give the FLOPs (torch's own count), MFU against the given peak."""
    linear = torch.nn.Linear(64, 32)
    x = torch.randn(8, 64)
    with kprof.session(tmp_path, run="r", wait=0, warmup=1, active=3, with_flops=True, peak_tflops=1.0) as s:
        for _ in range(4):
            linear(x).sum().backward()  # forward addmm (8x64 @ 64x32), backward mm for the weight gradient
            s.step()
    summary = s.summary()
    (finding,) = [d.message for d in summary.diagnostics if d.kind == "matmul_flops"]
    per_step = 2 * 8 * 64 * 32 * 2  # the forward product and the weight gradient's (no input gradient needed)
    assert f"Matrix products: {per_step:.4g} FLOP per profiled step" in finding
    wall_s = sum(st.wall_us for st in summary.steps) / 1e6
    assert (
        f"{3 * per_step / wall_s / 1e12:.3g} TFLOP/s" in finding
        and "of 1.0 TFLOP/s, the dense peak (counted" in finding
    )


H100 = "NVIDIA H100 80GB HBM3"


def _matmul_message(by_dtype: dict[str, float], gpu: str) -> str:
    found = trends.findings({}, [], collections.Counter(by_dtype), 1e6, 10, None, gpu)
    return next(d.message for d in found if d.kind == "matmul_flops")


def test_a_trace_kprof_did_not_record_gets_mfu_from_its_gpu_and_the_products_dtype(tmp_path):
    """The H100 fixture (fp32 products), and the same trace with its products' inputs made bf16: the peak comes from
    the GPU the trace names in the products' dtype, read in pieces as in one go; fp32 could be TF32, so no MFU."""
    source = FIXTURES / "gpu_small.pt.trace.json.gz"
    fp32 = next(d.message for d in kprof.summarize(source).diagnostics if d.kind == "matmul_flops")
    assert f"fp32 products on the {H100} run at its fp32 peak, or at its TF32 peak" in fp32
    run = tmp_path / "bf16"
    run.mkdir()
    path = run / "w.pt.trace.json"  # "float" is spelled so only in input types
    path.write_bytes(gzip.decompress(source.read_bytes()).replace(b'"float"', b'"c10::BFloat16"'))
    messages = []
    for chunk in (reader.CHUNK_BYTES, 20_000):  # one piece, then many
        with pytest.MonkeyPatch.context() as m:
            m.setattr(reader, "CHUNK_BYTES", chunk)
            assert len(reader.plan(path).pieces) == (1 if chunk > 20_000 else 13)
            found = kprof.summarize(run).diagnostics
        messages.append(next(d.message for d in found if d.kind == "matmul_flops"))
    assert messages[0] == messages[1] and f"TFLOP/s, the bf16 dense peak of the {H100} the trace names" in messages[0]
    assert f"of {peaks.peak_tflops(H100, 'bf16'):.1f} TFLOP/s" in messages[0]


def test_mixed_dtypes_or_an_unknown_gpu_give_no_mfu():
    assert "of 989.4 TFLOP/s, the bf16 dense peak of the" in _matmul_message({"bf16": 1e12}, H100)
    assert "no dense peak to give MFU against" in _matmul_message({"bf16": 9e11, "fp32": 1e11}, H100)
    assert "no dense peak to give MFU against" in _matmul_message({"bf16": 1e12}, "")  # no GPU named, or several
    assert "the Some GPU 9000 is not in kprof's table" in _matmul_message({"fp16": 1e12}, "Some GPU 9000")


@pytest.mark.parametrize(
    "op, dims, expected",
    [
        ("aten::mm", "[[8, 64], [64, 32]]", 2 * 8 * 64 * 32),
        ("aten::addmm", "[[32], [8, 64], [64, 32], [], []]", 2 * 8 * 64 * 32),
        ("aten::bmm", "[[4, 8, 16], [4, 16, 5]]", 2 * 4 * 8 * 16 * 5),
        ("aten::baddbmm", "[[4, 8, 5], [4, 8, 16], [4, 16, 5], [], []]", 2 * 4 * 8 * 16 * 5),
        ("aten::mm", "[[8, 64], [63, 32]]", 0),  # shapes that do not multiply
        ("aten::mm", "not json", 0),
    ],
)
def test_product_flops_from_recorded_shapes(op, dims, expected):
    from kprof_callbacks.analysis.flops import product_flops

    assert product_flops(op, dims) == expected
