"""Time by module on traces laid out as a GPU writes them, with times we choose: eager modules with their backward
tied through sequence numbers, compiled graph calls matched to the record of their kernels, CUDA graph replays,
and the per-step module rows kprof.diff tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gpu_like import HOST_PID, Trace, record

from kprof_callbacks.analysis import Summary, diff, file_analysis, graphs, model_findings, reader, summarize
from kprof_callbacks.analysis.modules import ModuleStats


def _rows(s: Summary) -> dict[tuple[str, str], ModuleStats]:
    return {(m.name, m.direction): m for m in s.modules}


# How traces lay out module ranges and runtime calls: the CPU build (torch 2.13) writes the ranges as user
# annotations; torch 2.11 on a GPU as operators (cpu_op), and its runtime calls under the pid of the process that
# exported the trace (kprof exports in a forked child), not under the pid of the operators that made them.
LAYOUTS = {"cpu-build": ("user_annotation", HOST_PID), "torch-2.11-gpu": ("cpu_op", HOST_PID + 35)}


def _eager(t: Trace, at: float, spin_us: float = 30.0, ranges: str = "user_annotation") -> None:
    """One step at ``at``: module ``a`` (a 50 us GEMM) and ``b`` (``spin_us`` of a kernel) inside the model, their
    backward on the autograd thread (tid 2, naming forward thread 1), an optimizer step and a stray fill; module
    ranges of category ``ranges``."""
    t.label(f"ProfilerStep#{int(at // 1000)}", at, 1000)
    t.op("kprof.module:", at + 10, 390, cat=ranges)
    t.op("kprof.module:a", at + 20, 180, cat=ranges)
    t.op("aten::addmm", at + 30, 30, seq=int(at) + 5)
    t.launch(at + 40, "gemm_a", at + 100, 50)
    t.op("kprof.module:b", at + 210, 180, cat=ranges)
    t.op("aten::mul", at + 220, 20, seq=int(at) + 6)
    t.launch(at + 225, "spin_kernel", at + 230, spin_us)
    t.op("autograd::engine::evaluate_function: MulBackward0", at + 500, 60, tid=2, seq=int(at) + 6, fwd=1)
    t.op("aten::mul", at + 510, 10, tid=2)
    t.launch(at + 512, "mul_kernel", at + 600, 40, tid=2)
    t.op("autograd::engine::evaluate_function: AddmmBackward0", at + 570, 20, tid=2, seq=int(at) + 5, fwd=1)
    t.op("aten::mm", at + 572, 10, tid=2)
    t.launch(at + 573, "gemm_b", at + 650, 20, tid=2)
    t.label("Optimizer.step#SGD.step", at + 700, 100)
    t.op("aten::add_", at + 710, 10)
    t.launch(at + 711, "add_kernel", at + 720, 10)
    t.op("aten::ones_like", at + 850, 10)
    t.launch(at + 851, "fill_kernel", at + 860, 5)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_eager_modules_forward_and_backward_add_up_to_the_gpu_time(tmp_path, layout):
    ranges, runtime_pid = LAYOUTS[layout]
    t = Trace(runtime_pid)
    _eager(t, 1000.0, ranges=ranges)
    s = summarize(t.write(tmp_path / "run").parent)
    rows = _rows(s)
    expected = {
        ("a", "forward"): 50,
        ("b", "forward"): 30,
        ("b", "backward"): 40,  # MulBackward0 carries b's aten::mul's sequence number
        ("a", "backward"): 20,
        ("", "forward"): 80,
        ("", "backward"): 60,
        ("(optimizer)", ""): 10,
        ("(outside modules)", "forward"): 5,
    }
    assert {k: rows[k].gpu_us for k in expected} == expected
    busy = s.steps[0].gpu_busy_us
    assert sum(r.gpu_us for r in s.modules if r.depth == 0) == pytest.approx(busy)
    assert rows[("b", "forward")].share == pytest.approx(30 / busy)
    assert rows[("a", "forward")].calls == 1 and rows[("a", "backward")].calls == 1
    assert rows[("a", "forward")].cpu_us == 180 and rows[("", "forward")].self_cpu_us == 390 - 2 * 180
    text = s.render()
    assert "Top modules by GPU time" in text and "  a  " in text


def test_a_backward_node_of_an_unknown_forward_thread_is_outside_the_modules(tmp_path):
    t = Trace()
    _eager(t, 1000.0)
    for e in t.events:
        if e["name"].startswith("autograd::engine::evaluate_function") and e["args"]["Sequence number"] == 1006:
            e["args"]["Sequence number"] = 99  # its forward operator is not in the trace
    rows = _rows(summarize(t.write(tmp_path / "run").parent))
    assert rows[("(outside modules)", "backward")].gpu_us == 40
    assert ("b", "backward") not in rows


RECORD = record(
    [
        {
            "compile_id": "0/0",
            "function": "Net.forward",
            "backward": False,
            "kernels": [
                ("triton_poi_fused_0", False, {0: 2}, {0: 1}),
                ("extern_kernels.mm", True, {1: 1}, {1: 1}),
                ("triton_per_fused_1", False, {1: 1, 2: 1}, {1: 1}),
                ("triton_poi_fused_0", False, {2: 1}, {2: 1}),
            ],
        },
        {
            "compile_id": "0/0",
            "function": "Net.forward",
            "backward": True,
            "kernels": [
                ("triton_poi_fused_2", False, {2: 1}, {2: 1}),
                ("extern_kernels.mm", True, {1: 1}, {1: 1}),
                ("extern_kernels.mm", True, {1: 1}, {1: 1}),
                ("triton_red_fused_3", False, {0: 1}, {0: 1}),
            ],
        },
    ],
    ["emb", "proj", "head"],
    [("/home/u/net.py:10", "x = self.emb(i)"), ("/home/u/net.py:11", "y = self.proj(x)"), ("/home/u/net.py:12", "z")],
)
FORWARD = [("triton_poi_fused_0", 10), ("sm90_xmma_gemm_bf16", 100), ("triton_per_fused_1", 20)]
FORWARD += [("triton_poi_fused_0", 6), ("triton_poi_not_recorded_9", 7)]
BACKWARD = [("triton_poi_fused_2", 10), ("sm90_gemm_a", 60), ("sm90_gemm_b", 60), ("splitk_reduce", 4)]
BACKWARD += [("triton_red_fused_3", 8)]


def _compiled(replay: bool, steps: int = 1, runtime_pid: int = HOST_PID) -> Trace:
    """Steps of a compiled Net: its forward graph call in a Torch-Compiled Region, its backward in the autograd
    node CompiledFunctionBackward; kernels launched one by one, or (``replay``) replayed from a CUDA graph; runtime
    calls under ``runtime_pid``."""
    t = Trace(runtime_pid)
    for n in range(steps):
        at = 10_000.0 * (n + 1)
        t.label(f"ProfilerStep#{n + 1}", at, 5000)
        t.op("Torch-Compiled Region: 0/0", at + 10, 400)
        t.op("CompiledFunction", at + 20, 380, seq=10 + n)
        for tid, graph_at, call, kernels in ((1, at + 30, "abc", FORWARD), (2, at + 810, "def", BACKWARD)):
            if tid == 2:
                t.op(
                    "autograd::engine::evaluate_function: CompiledFunctionBackward", at + 800, 400, 2, seq=10 + n, fwd=1
                )
            t.op(f"## Call CompiledFxGraph {call} ##", graph_at, 300, tid)
            corr = t.graph_launch(graph_at + 5, tid) if replay else None
            gpu = at + 500 + (tid - 1) * 1000
            for k, (name, dur) in enumerate(kernels):
                t.launch(graph_at + 10 + 5 * k, name, gpu, dur, tid, corr=corr)
                gpu += dur + 1
    return t


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("replay", [False, True], ids=["launched", "cuda-graph"])
def test_compiled_kernels_go_to_the_modules_and_lines_of_their_recorded_calls(tmp_path, replay, layout):
    s = summarize(_compiled(replay, runtime_pid=LAYOUTS[layout][1]).write(tmp_path / "run", RECORD).parent)
    rows = _rows(s)
    # forward: the first triton_poi_fused_0 (10 us) is emb's, the GEMM between it and triton_per_fused_1 is the
    # extern mm call (proj), triton_per_fused_1 half proj half head, the second triton_poi_fused_0 head's
    assert rows[("emb", "forward")].gpu_us == 10
    assert rows[("proj", "forward")].gpu_us == 100 + 10
    assert rows[("head", "forward")].gpu_us == 10 + 6
    # backward: three kernels between two Triton ones go, in order, to the two extern mm calls (both proj)
    assert rows[("proj", "backward")].gpu_us == 124
    assert rows[("head", "backward")].gpu_us == 10 and rows[("emb", "backward")].gpu_us == 8
    assert rows[("(unattributed)", "")].gpu_us == 7  # a kernel no recorded call names
    lines = {(r.line, r.direction): r.gpu_us for r in s.lines}
    assert lines[("u/net.py:11 y = self.proj(x)", "backward")] == 124
    graphs_seen = s.compiled["graphs"]
    assert graphs_seen["Net.forward (forward)"] == {"calls": 1, "gpu_us": 143.0, "matched_us": 136.0}
    assert "## Call CompiledFxGraph def ## Net.forward (backward)" in {o.name for o in s.ops}
    evidence = file_analysis.analyze(reader.read_trace(s.files[0])).evidence
    assert model_findings.mode(evidence) == ("CUDA graphs" if replay else "compiled")


def test_the_per_step_table_has_module_rows_that_diff_tests(tmp_path):
    def run(name: str, spin_us: float) -> Path:
        t = Trace()
        for k in range(6):
            _eager(t, 1000.0 * (k + 1), spin_us * (1 + 0.01 * (k % 3)))
        return t.write(tmp_path / name).parent

    d = diff(run("a", 30.0), run("b", 60.0))
    changes = {(c.kind, c.name): c for c in d.changes}
    assert changes[("module", "b")].status == "increased"
    assert changes[("module", "b")].change == pytest.approx(30.3, abs=0.5)
    assert changes[("module", "a")].status == "unchanged"
    assert "module 'b'" in d.render()


def test_repeated_instances_are_one_row_in_the_per_step_table(tmp_path):
    t = Trace()
    t.label("ProfilerStep#1", 0, 1000)
    for k in range(4):
        t.label(f"kprof.module:blocks.{k}.mlp", 10 + 100 * k, 50)
        t.op("aten::mm", 12 + 100 * k, 5)
        t.launch(13 + 100 * k, "gemm", 500 + 20 * k, 10 + k)
    s = summarize(t.write(tmp_path / "run").parent)
    modules = {
        n: s.per_step.time_us[i, 0] for i, (k, n) in enumerate(zip(s.per_step.kind, s.per_step.name)) if k == "module"
    }
    assert modules == {"(model)": 46, "blocks": 46, "blocks.*": 46, "blocks.*.mlp": 46}
    assert "blocks.* (4)" in s.render() and "blocks.*.mlp (4)" in s.render()


def test_an_instance_is_the_recorded_graph_it_shares_most_triton_kernels_with():
    call = graphs.Call
    a = graphs.Graph(
        "0/0", "f", False, (call("triton_a", False, (), (), (), False), call("triton_b", False, (), (), (), False))
    )
    b = graphs.Graph(
        "1/0", "g", False, (call("triton_a", False, (), (), (), False), call("triton_c", False, (), (), (), False))
    )
    rec = graphs.Record((a, b), (), ())
    assert graphs.best_graph(rec, ["triton_a", "gemm", "triton_c"]) == 1
    assert graphs.best_graph(rec, ["triton_a", "triton_b"]) == 0
    assert graphs.best_graph(rec, ["triton_a"], compile_id="1/0") == 1  # a tie: the compile id around it decides
    assert graphs.best_graph(rec, ["gemm"]) == -1


def test_kernels_between_triton_ones_take_the_extern_calls_between_them_in_order():
    def c(name: str, extern: bool = False) -> graphs.Call:
        return graphs.Call(name, extern, (), (), (), False)

    calls = [c("triton_x"), c("mm", True), c("sdpa", True), c("triton_y"), c("triton_x"), c("mm", True)]
    names = ["triton_x", "k1", "k2", "k3", "triton_y", "triton_x", "k4", "k5"]
    assert graphs.align(calls, names).tolist() == [0, 1, 1, 2, 3, 4, 5, 5]
    assert graphs.align(calls, ["triton_y", "triton_x", "triton_x"]).tolist() == [3, 4, -1]  # no third call of it
    # the trace holds the end of an instance (launched before it), or its start: the calls next to the match
    assert graphs.align(calls, ["k5", "triton_y"]).tolist() == [2, 3]
    calls = [c("triton_x"), c("a", True), c("b", True), c("c", True), c("d", True)]
    assert graphs.align(calls, ["triton_x", "k1", "k2"]).tolist() == [0, 1, 2]


def test_kernels_launched_before_the_trace_go_by_the_record(tmp_path):
    """On a busy GPU a window opens while kernels launched before it still run (the rest of a CUDA graph's replay):
    no launch in the trace names them, and they go by the record to their modules, not to "(unattributed)"."""
    t = _compiled(True)
    for k, (name, us) in enumerate(BACKWARD[2:]):  # sm90_gemm_b, splitk_reduce, triton_red_fused_3
        t.launch(0.0, name, 10_100.0 + 100 * k, us, corr=10_000 + k)
    rows = _rows(summarize(t.write(tmp_path / "run", RECORD).parent))
    assert rows[("proj", "backward")].gpu_us == 124 + 60 + 4 and rows[("emb", "backward")].gpu_us == 8 + 8
    assert rows[("(unattributed)", "")].gpu_us == 7


def test_a_record_that_cannot_be_read_is_a_note_not_a_failure(tmp_path):
    folder = tmp_path / "run"
    _compiled(False).write(folder, RECORD)
    (folder / "host_1.kprof-graphs.json").write_text("{not json")
    s = summarize(folder)
    assert _rows(s)[("(unattributed)", "")].gpu_us == pytest.approx(sum(d for _, d in FORWARD + BACKWARD))
    assert any("not usable" in n for n in s.compiled["notes"])
    assert np.isclose(sum(r.gpu_us for r in s.modules if r.depth == 0), s.steps[0].gpu_busy_us)


TOKENS, VOCAB, WIDTH = 4096, 50304, 768
HEAD = [  # (operator, input shapes, input types, thread, kernel us): the head's forward, then its backward
    ("aten::mm", [[TOKENS, WIDTH], [WIDTH, VOCAB]], ["c10::BFloat16", "c10::BFloat16"], 1, 300),
    ("aten::_to_copy", [[TOKENS, VOCAB], [], []], [], 1, 100),
    ("aten::_log_softmax", [[TOKENS, VOCAB], [], []], ["float", "Scalar", "Scalar"], 1, 150),
    ("aten::nll_loss_forward", [[TOKENS, VOCAB], [TOKENS], [], [], []], [], 1, 20),
    ("aten::nll_loss_backward", [[], [TOKENS, VOCAB], [TOKENS], [], [], [], []], [], 2, 50),
    ("aten::_log_softmax_backward_data", [[TOKENS, VOCAB], [TOKENS, VOCAB], [], []], [], 2, 150),
    ("aten::mm", [[TOKENS, VOCAB], [VOCAB, WIDTH]], ["c10::BFloat16", "c10::BFloat16"], 2, 300),
    ("aten::mm", [[VOCAB, TOKENS], [TOKENS, WIDTH]], ["c10::BFloat16", "c10::BFloat16"], 2, 300),
]


def test_the_loss_head_is_found_from_recorded_shapes(tmp_path):
    t = Trace()
    for n in range(3):
        at = 10_000.0 * (n + 1)
        t.label(f"ProfilerStep#{n + 1}", at, 9000)
        t.label("kprof.module:blocks.0", at + 10, 100)
        t.op("aten::addmm", at + 20, 50, **{"Input Dims": [[3072], [TOKENS, WIDTH], [WIDTH, 3072]]})
        t.launch(at + 30, "gemm", at + 100, 2000)
        t.label("kprof.module:lm_head", at + 200, 100)
        for k, (op, dims, types, tid, us) in enumerate(HEAD):
            t.op(op, at + 210 + 100 * k, 50, tid, **{"Input Dims": dims, "Input type": types})
            t.launch(at + 220 + 100 * k, "head_kernel", at + 3000 + 400 * k, us, tid)
    s = summarize(t.write(tmp_path / "run").parent)
    (found,) = [d for d in s.diagnostics if d.kind == "loss_head"]
    head = sum(us for *_, us in HEAD)
    assert found.message.startswith(f"The loss head takes {round(100 * head / (head + 2000))}% of GPU time")
    assert "[4096, 50304] in fp32 (786.0 MB) and bf16/fp16 (393.0 MB)" in found.message
    assert "in (outside modules), lm_head" in found.message  # its backward here runs in no autograd node


def test_the_loss_head_of_compiled_code_is_found_from_the_record(tmp_path):
    """As torch 2.11's inductor records GPT's loss: beside the logits, its loss kernels hold a boolean mask and an
    int64 index of the targets, and the kernel that adds the tied embedding's gradient (fused with a piece of the
    loss's backward) its weight [vocabulary, width]: none of them are logits, nor is that kernel the loss head's."""
    logits = [[[TOKENS, VOCAB], "float32"]]
    targets = [[[TOKENS, VOCAB], "bool"], [[1, VOCAB], "int64"]]
    rec = record(
        [
            {
                "compile_id": "0/0",
                "function": "GPT.forward",
                "backward": False,
                "kernels": [
                    ("triton_poi_fused_0", False, {0: 1}, {}),
                    ("extern_kernels.mm", True, {1: 1}, {}, [[[TOKENS, VOCAB], "bfloat16"]]),
                    ("triton_red_fused__log_softmax_1", False, {1: 1}, {}, logits, True),
                    ("triton_red_fused_nll_loss_backward_2", False, {1: 1}, {}, targets + logits, True),
                    (
                        "triton_per_fused_embedding_dense_backward_3",
                        False,
                        {0: 5, 1: 1},
                        {},
                        [[[VOCAB, WIDTH], "float32"]],
                        True,
                    ),
                ],
            }
        ],
        ["wte", "lm_head"],
    )
    t = Trace()
    kernels = [("triton_poi_fused_0", 500), ("gemm", 300), ("triton_red_fused__log_softmax_1", 200)]
    kernels += [("triton_red_fused_nll_loss_backward_2", 100), ("triton_per_fused_embedding_dense_backward_3", 400)]
    for n in range(3):
        at = 10_000.0 * (n + 1)
        t.label(f"ProfilerStep#{n + 1}", at, 9000)
        t.op("## Call CompiledFxGraph k ##", at + 10, 500)
        for k, (name, us) in enumerate(kernels):
            t.launch(at + 20 + 10 * k, name, at + 1000 + 1000 * k, us)
    s = summarize(t.write(tmp_path / "run", rec).parent)
    (found,) = [d for d in s.diagnostics if d.kind == "loss_head"]
    assert found.message.startswith("The loss head takes 40% of GPU time") and "in lm_head)" in found.message
    assert "logits [4096, 50304] in fp32 (786.0 MB) and bf16/fp16 (393.0 MB), and" in found.message


def test_host_time_of_a_lightning_step_is_counted_once(tmp_path):
    """Lightning runs training_step and backward inside the optimizer's step (its closure): each range's host time
    goes to its owner less the ranges in it, so the rows add up to the step's outermost range."""
    t = Trace()
    t.label("ProfilerStep#1", 0, 1000)
    t.label("optimizer_step", 0, 500)
    t.op("Optimizer.step#SGD.step", 10, 480, cat="user_annotation")
    t.label("training_step", 20, 180)
    t.label("kprof.module:", 30, 120)
    t.op("aten::addmm", 40, 50, seq=7)
    t.op("aten::mse_loss", 160, 30, seq=8)
    t.label("backward", 210, 90)
    t.op("autograd::engine::evaluate_function: AddmmBackward0", 220, 60, seq=7, fwd=1)
    t.op("aten::add_", 310, 20)
    rows = _rows(summarize(t.write(tmp_path / "run").parent))
    cpu = {k: r.cpu_us for k, r in rows.items()}
    assert cpu == {
        ("", "forward"): 120,
        ("", "backward"): 60,
        ("(outside modules)", "forward"): 180 - 120,  # the loss and training_step's own code
        ("(outside modules)", "backward"): 90 - 60,
        ("(optimizer)", ""): 500 - 180 - 90,
    }
    assert rows[("(optimizer)", "")].calls == 1


def test_kernels_of_no_module_go_to_the_model_or_to_what_runs_the_graph(tmp_path):
    rec = record(
        [
            {
                "compile_id": "0/0",
                "function": "Net.forward",
                "backward": False,
                "kernels": [
                    ("triton_poi_fused_emb_0", False, {0: 1}, {}),
                    ("triton_red_fused_loss_1", False, {}, {}),  # the loss, computed in Net.forward itself
                ],
            },
            {
                "compile_id": "1/0",
                "function": "AdamW.step",
                "backward": False,
                "kernels": [
                    ("triton_for_fused_2", False, {}, {}),
                ],
            },
        ],
        ["emb"],
    )
    t = Trace()
    t.label("ProfilerStep#1", 0, 2000)
    t.op("## Call CompiledFxGraph a ##", 10, 100)
    t.launch(20, "triton_poi_fused_emb_0", 500, 10)
    t.launch(30, "triton_red_fused_loss_1", 600, 20)
    t.label("Optimizer.step#AdamW.step", 300, 200)
    t.op("## Call CompiledFxGraph b ##", 310, 100)
    t.launch(320, "triton_for_fused_2", 700, 40)
    rows = _rows(summarize(t.write(tmp_path / "run", rec).parent))
    assert rows[("emb", "forward")].gpu_us == 10 and rows[("", "forward")].self_gpu_us == 20
    assert rows[("(optimizer)", "")].gpu_us == 40 and rows[("(optimizer)", "")].cpu_us == 200
