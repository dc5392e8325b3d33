"""Memory at the peak (`Summary.memory`): kinds, phases and modules from a trace's memory events, on a trace written
by hand (every byte known) and on real CPU training under kprof.session; its reports, JSON and DataFrames."""

from __future__ import annotations

import json

import pytest
import torch

import kprof_callbacks as kprof
from kprof_callbacks import models
from kprof_callbacks.analysis import Summary

MAIN, BACKWARD = 1, 2


def _op(name, ts, dur, tid=MAIN, cat="cpu_op", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _mem(ts, nbytes, addr, total, tid=MAIN):
    args = {
        "Device Type": 1,
        "Device Id": 0,
        "Addr": addr,
        "Bytes": nbytes,
        "Total Allocated": total,
        "Total Reserved": 20_000,
    }
    return {
        "ph": "i",
        "cat": "cpu_instant_event",
        "s": "t",
        "name": "[memory]",
        "pid": 7,
        "tid": tid,
        "ts": ts,
        "args": args,
    }


def hand_trace(path, note=True):
    """One step whose every allocation is known: an input copied from the host, a temporary and an activation in
    blocks.0's forward, an activation in blocks.1's, a gradient temporary and a parameter's gradient in backward
    (on the autograd thread), optimizer state and a temporary in the optimizer step, and zero_grad freeing that
    gradient and one from before the trace. The allocator held 10,700 bytes before it (700 of them that old
    gradient); the session's note says 6,000 are parameters and 3,000 optimizer state."""
    ann = "user_annotation"
    events = [
        _op("ProfilerStep#5", 0, 1000, cat=ann),
        _op("aten::to", 50, 40, **{"External id": 77}),
        _op("aten::_to_copy", 55, 30),
        _op("kprof.module:blocks.0", 100, 200, cat=ann),
        _op("aten::linear", 110, 90, **{"Sequence number": 10}),
        _op("kprof.module:blocks.1", 300, 150, cat=ann),
        _op("aten::mul", 310, 90, **{"Sequence number": 11}),
        _op("autograd::engine::evaluate_function: MulBackward0", 500, 80, tid=BACKWARD, **{"Sequence number": 11}),
        _op("autograd::engine::evaluate_function: AddmmBackward0", 585, 65, tid=BACKWARD, **{"Sequence number": 10}),
        _op("Optimizer.step#AdamW.step", 700, 100, cat=ann),
        _op("Optimizer.zero_grad#AdamW.zero_grad", 850, 100, cat=ann),
        {
            "ph": "X",
            "cat": "gpu_memcpy",
            "name": "Memcpy HtoD (Pageable -> Device)",
            "pid": 0,
            "tid": 7,
            "ts": 70,
            "dur": 5,
            "args": {"External id": 77},
        },
    ]
    allocations = [  # time, bytes, address, thread
        (60, 400, 0x400, MAIN),
        (150, 1000, 0x100, MAIN),
        (160, 500, 0x200, MAIN),
        (180, -500, 0x200, MAIN),
        (350, 2000, 0x300, MAIN),
        (520, 3000, 0x500, BACKWARD),
        (560, -2000, 0x300, BACKWARD),
        (570, -3000, 0x500, BACKWARD),
        (590, 800, 0x600, BACKWARD),
        (600, -1000, 0x100, BACKWARD),
        (710, 1600, 0x700, MAIN),
        (720, 300, 0x800, MAIN),
        (730, -300, 0x800, MAIN),
        (900, -800, 0x600, MAIN),
        (910, -700, 0x900, MAIN),
    ]
    total = 10_700
    for ts, nbytes, addr, tid in allocations:
        total += nbytes
        events.append(_mem(ts, nbytes, addr, total, tid))
    doc = {"schemaVersion": 1, "traceEvents": events}
    if note:
        doc["kprof_memory"] = {"device": "cuda", "parameters": 6000, "gradients": 0, "optimizer_state": 3000}
    path.write_text(json.dumps(doc))
    return path


def test_the_peak_of_a_hand_written_step_is_split_into_every_kind_exactly(tmp_path):
    memory = kprof.summarize(hand_trace(tmp_path / "w.pt.trace.json")).memory
    (step,) = memory.steps
    assert (step.step, step.peak, step.reserved, step.phase, step.where) == (5, 17_100, 20_000, "backward", "blocks.1")
    assert step.kinds == {
        "parameters": 6000,
        "optimizer_state": 3000,
        "gradients": 700,  # the old gradient zero_grad frees later
        "activations": 3000,
        "temporaries": 3000,
        "inputs": 400,
        "persistent": 1000,
        "other": 0,
    }
    assert sum(step.kinds.values()) == step.peak
    assert step.largest == 3000
    assert step.modules["blocks.1"] == 2000 + 3000  # its activation, and the gradient made by its backward node
    assert step.modules["blocks.0"] == 1000
    assert memory.shown == step
    assert [p[0] for p in memory.phases] == ["forward", "backward", "optimizer", "zero_grad"]
    assert max(v for _, v in memory.curve) == 17_100


def test_kinds_after_the_peak_follow_each_blocks_whole_life(tmp_path):
    """The state the optimizer keeps and the parameter's gradient are counted as such wherever they are alive: in a
    trace whose peak comes later (a large temporary in the optimizer step)."""
    path = hand_trace(tmp_path / "w.pt.trace.json")
    doc = json.loads(path.read_text())
    extra = [e for e in doc["traceEvents"] if e["name"] == "[memory]" and e["ts"] == 720][0]
    extra["args"]["Bytes"] = 9000
    for e in doc["traceEvents"]:
        if e["name"] == "[memory]" and e["ts"] >= 720:
            e["args"]["Total Allocated"] += 8700
            if e["ts"] == 730:
                e["args"]["Bytes"] = -9000
                e["args"]["Total Allocated"] -= 8700
    for e in doc["traceEvents"]:
        if e["name"] == "[memory]" and e["ts"] > 730:
            e["args"]["Total Allocated"] -= 8700
    path.write_text(json.dumps(doc))
    (step,) = kprof.summarize(path).memory.steps
    assert (step.phase, step.peak) == ("optimizer", 10_700 + 400 + 800 + 1600 + 9000)
    assert step.kinds["gradients"] == 800 + 700 and step.kinds["optimizer_state"] == 3000 + 1600
    assert step.kinds["temporaries"] == 9000 and step.kinds["activations"] == 0


def test_without_the_sessions_note_what_was_there_before_is_persistent(tmp_path):
    (step,) = kprof.summarize(hand_trace(tmp_path / "w.pt.trace.json", note=False)).memory.steps
    assert step.kinds["persistent"] == 10_000 and step.kinds["parameters"] == 0


def test_a_trace_without_memory_events_has_no_memory(tmp_path):
    path = tmp_path / "w.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": [_op("ProfilerStep#1", 0, 10, cat="user_annotation")]}))
    assert kprof.summarize(path).memory is None


def _module_ranges(model: torch.nn.Module) -> None:
    """``kprof.module:<name>`` ranges around each module's forward, as kprof records them while a window records."""
    for name, module in model.named_modules():
        if not name:
            continue
        stack = []

        def pre(m, args, name=name, stack=stack):
            stack.append(torch.profiler.record_function(f"kprof.module:{name}"))
            stack[-1].__enter__()

        def post(m, args, out, stack=stack):
            stack.pop().__exit__(None, None, None)

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)


def _train(logdir, run, checkpoint=False, ranges=True) -> Summary:
    torch.manual_seed(0)
    cfg = models.GPTConfig(n_layer=3, n_head=2, n_embd=32, vocab_size=256, block_size=32)
    model = models.GPT(cfg)
    if checkpoint:
        for block in model.blocks:
            forward = block.forward
            block.forward = lambda x, f=forward: torch.utils.checkpoint.checkpoint(f, x, use_reentrant=False)
    if ranges:
        _module_ranges(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = models.random_batches(cfg, n=5, batch=4)
    with kprof.session(logdir, run=run, wait=1, warmup=1, active=3, profile_memory=True, scalars=False) as s:
        for idx, targets in batches:
            model(idx, targets).backward()
            opt.step()
            opt.zero_grad()
            s.step()
    return s.summary()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("memory")
    return _train(logdir, "plain"), _train(logdir, "checkpointed", checkpoint=True), logdir


def test_cpu_training_names_the_blocks_activations_and_what_checkpointing_frees(trained):
    plain, _, _ = trained
    memory = plain.memory
    assert memory.device == "cpu" and len(memory.steps) == 3
    for step in memory.steps:
        assert sum(step.kinds.values()) == step.peak > 0
    assert memory.shown.phase == "backward"
    blocks = {r.name for r in memory.repeated}
    assert blocks == {"blocks.0", "blocks.1", "blocks.2"} and {r.family for r in memory.repeated} == {"blocks.*"}
    assert any(m.module.startswith("blocks.") and m.kind == "activations" for m in memory.modules)
    found = {d.kind: d.message for d in plain.diagnostics}
    assert "memory_activations" in found
    assert "Checkpointing each of the 3 blocks.*" in found["memory_activations"]


def test_checkpointing_the_blocks_moves_the_activations_and_the_diff_shows_it(trained):
    plain, checkpointed, _ = trained
    before, after = plain.memory.kind_median("activations"), checkpointed.memory.kind_median("activations")
    assert after < 0.6 * before
    d = kprof.diff(plain, checkpointed)
    rows = {c.name: c for c in d.changes if c.kind == "memory"}
    assert rows["kind: activations"].status == "decreased"
    assert rows["peak allocated"].change < 0
    assert not d.more_memory(5) and d.memory.b_median < d.memory.a_median
    reverse = kprof.diff(checkpointed, plain)
    assert reverse.more_memory(5)
    assert "Memory regression (limit +5%)" in reverse.render(fail_if_more_memory=5)


def test_without_module_ranges_sites_are_operators_and_backward_nodes(tmp_path):
    memory = _train(tmp_path, "bare", ranges=False).memory
    names = {m.module for m in memory.modules}
    assert not any(n.startswith("blocks.") for n in names)
    assert any(n.startswith("aten::") for n in names) and any(n.endswith("Backward0") for n in names)


def test_memory_survives_json_and_reaches_every_report(trained, tmp_path):
    plain, _, _ = trained
    back = Summary.from_dict(json.loads(json.dumps(plain.to_dict())))
    assert back.memory == plain.memory
    text = plain.render()
    assert "Memory at the peak (cpu): step" in text and "Largest blocks at the peak" in text
    assert "Memory at the peak by module" in plain.to_markdown()
    frames = plain.to_pandas()
    assert list(frames["memory"]["peak"]) == [s.peak for s in plain.memory.steps]
    assert {"activations", "temporaries"} <= set(frames["memory"].columns)
    assert len(frames["memory_blocks"]) == len(plain.memory.blocks)
    html = plain.to_html(tmp_path / "r.html").read_text()
    assert 'aria-label="memory over the step"' in html and "<polyline" in html


def test_a_step_without_backward_is_all_forward(tmp_path):
    """Inference, or a window's stub of a step: no backward in the trace at all."""
    events = [_op("ProfilerStep#1", 0, 100, cat="user_annotation"), _op("aten::mm", 10, 50)]
    total = 0
    for ts, nbytes, addr in ((20, 300, 1), (30, 200, 2), (40, -200, 2)):
        total += nbytes
        events.append(_mem(ts, nbytes, addr, total))
    path = tmp_path / "w.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    (step,) = kprof.summarize(path).memory.steps
    assert (step.peak, step.phase) == (500, "forward")
    assert step.kinds["activations"] == 300 and step.kinds["temporaries"] == 200
