"""Time by module on traces recorded on a GPU (tests/fixtures/record_attribution.py): a small GPT eager, compiled
and replayed from CUDA graphs. Skipped where the fixtures have not been recorded yet.

What these traces (an H100, torch 2.11) hold that hand-built ones missed: module ranges of category ``cpu_op``,
runtime calls written under another pid than their operators (the exporting process's), Triton launches as operators
named after their kernel (``triton_poi_fused_...``, with ``kernel_name``/``kernel_file``) around a ``cuLaunchKernel``,
``## Call CompiledFxGraph None ##`` ranges, kernels replayed under one ``cudaGraphLaunch``, ``Fwd thread id`` 0 on
forward operators and 1 on autograd nodes."""

from __future__ import annotations

from pathlib import Path

import pytest

from kprof_callbacks.analysis import file_analysis, model_findings, reader, summarize

FIXTURES = Path(__file__).parent / "fixtures" / "attribution"
MODES = ("eager", "compiled", "reduce-overhead")
HOW = {"eager": "eager", "compiled": "compiled", "reduce-overhead": "CUDA graphs"}
MODULES = ("blocks.0", "blocks.0.attn", "blocks.0.mlp", "blocks.1", "blocks.1.attn", "blocks.1.mlp", "lm_head")
COMPILE, REDUCE_OVERHEAD = "fuse ops with torch.compile", 'mode="reduce-overhead"'


@pytest.fixture(params=MODES)
def run(request) -> tuple[str, Path]:
    folder = FIXTURES / request.param
    if not any(folder.glob("*.pt.trace.json.gz")):
        pytest.skip(f"{folder} not recorded (python tests/fixtures/record_attribution.py {FIXTURES})")
    return request.param, folder


def test_module_rows_add_up_to_the_gpu_busy_time(run):
    mode, folder = run
    s = summarize(folder)
    busy = sum(step.gpu_busy_us for step in s.steps)
    assert sum(r.gpu_us for r in s.modules if r.depth == 0) == pytest.approx(busy, rel=0.05)
    rows = {(r.name, r.direction): r for r in s.modules}
    model = rows[("", "forward")].gpu_us + rows[("", "backward")].gpu_us
    assert model + rows[("(optimizer)", "")].gpu_us >= 0.95 * busy  # not "(outside modules)", not unattributed
    for name in MODULES:
        assert rows[(name, "forward")].gpu_us > 0 and rows[(name, "backward")].gpu_us > 0, name
    assert rows[("(optimizer)", "")].gpu_us > 0


def test_compiled_kernels_are_attributed_and_the_mode_is_read_from_the_trace(run):
    mode, folder = run
    s = summarize(folder)
    unattributed = sum(r.gpu_us for r in s.modules if r.name == "(unattributed)")
    assert unattributed <= 0.05 * sum(step.gpu_busy_us for step in s.steps)
    graphs = s.compiled.get("graphs", {})
    if mode != "eager":
        assert set(graphs) == {"GPT.forward (forward)", "GPT.forward (backward)"}
        matched = sum(g["matched_us"] for g in graphs.values()) / sum(g["gpu_us"] for g in graphs.values())
        assert matched >= 0.95 and s.compiled["graphs_per_step"] == 1 and s.compiled["breaks_per_step"] == 0
        assert any("models.py:" in r.line and "x = self.drop(self.wte(idx) + self.wpe(pos))" in r.line for r in s.lines)
    (trace,) = s.files
    evidence = file_analysis.analyze(reader.read_trace(trace)).evidence
    assert model_findings.mode(evidence) == HOW[mode]
    assert evidence.loss_head.gpu_us  # from recorded shapes (eager) or from the record (compiled)


def test_the_loss_head_is_named_with_its_logits(run):
    mode, folder = run
    (head,) = [d.message for d in summarize(folder).diagnostics if d.kind == "loss_head"]
    share = float(head.removeprefix("The loss head takes ").partition("%")[0])
    assert share >= 100 * model_findings.LOSS_HEAD_SHARE and "; in lm_head)" in head
    assert "logits [512, 16384] in " in head and "[128, 16384]" not in head and "[1, 16384]" not in head


def test_the_advice_fits_how_the_model_runs(run):
    mode, folder = run
    findings = {d.kind: d.message for d in summarize(folder).diagnostics}
    advice = " ".join(findings.values())
    if mode == "eager":
        assert COMPILE in findings["launch_bound"]
    elif mode == "compiled":  # the GPU waits for launches: its second step takes 6.9 ms for 0.34 ms of GPU work
        assert "the model is compiled" in findings["launch_bound"] and REDUCE_OVERHEAD in findings["launch_bound"]
        assert COMPILE not in advice
    else:
        assert "reduce-overhead" not in advice and COMPILE not in advice
