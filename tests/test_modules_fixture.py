"""Time by module on traces recorded on a GPU (tests/fixtures/record_attribution.py): a small GPT eager, compiled
and replayed from CUDA graphs. Skipped where the fixtures have not been recorded yet."""

from __future__ import annotations

from pathlib import Path

import pytest

from kprof_callbacks.analysis import file_analysis, model_findings, reader, summarize

FIXTURES = Path(__file__).parent / "fixtures" / "attribution"
MODES = ("eager", "compiled", "reduce-overhead")
HOW = {"eager": "eager", "compiled": "compiled", "reduce-overhead": "CUDA graphs"}


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
    for name in ("blocks.0.attn", "blocks.1.mlp", "lm_head"):
        assert rows[(name, "forward")].gpu_us > 0 and rows[(name, "backward")].gpu_us > 0, name
    assert rows[("(optimizer)", "")].gpu_us > 0


def test_compiled_kernels_are_attributed_and_the_mode_is_read_from_the_trace(run):
    mode, folder = run
    s = summarize(folder)
    unattributed = sum(r.gpu_us for r in s.modules if r.name == "(unattributed)")
    assert unattributed <= 0.05 * sum(step.gpu_busy_us for step in s.steps)
    graphs = s.compiled.get("graphs", {})
    if mode != "eager":
        matched = sum(g["matched_us"] for g in graphs.values()) / sum(g["gpu_us"] for g in graphs.values())
        assert matched >= 0.95 and s.compiled["graphs_per_step"] == 1 and s.compiled["breaks_per_step"] == 0
        assert any("models.py:" in r.line and "x = self.drop(self.wte(idx) + self.wpe(pos))" in r.line for r in s.lines)
    (trace,) = s.files
    evidence = file_analysis.analyze(reader.read_trace(trace)).evidence
    assert model_findings.mode(evidence) == HOW[mode]
    assert evidence.loss_head.gpu_us  # from recorded shapes (eager) or from the record (compiled)
