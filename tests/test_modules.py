"""Time by module on real CPU runs: kprof.session(model=...) records module ranges only while a window records,
the module that does the work comes out on top with the share the trace gives it, backward goes to the forward
module, the Lightning callback needs no model=, and torch.compile's kernels are recorded by module and line with
graph breaks counted."""

from __future__ import annotations

import inspect
import json
import re
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from test_callback import TinyModel, loader, trainer
from torch import nn

import kprof_callbacks as kprof
from kprof_callbacks import graph_record, module_ranges, torch_compat
from kprof_callbacks.analysis import Summary, attribution, summarize
from kprof_callbacks.layout import graphs_path

SPIN_OPS = 400  # elementwise ops the slow module runs per call, against one matrix product in each other module


class Spin(nn.Module):
    """Busy on the host: SPIN_OPS tiny ops (a known amount of work, whatever the machine's speed)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(SPIN_OPS):
            x = x * 1.0
        return x


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fast = nn.Linear(8, 8)
        self.spin = Spin()
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.spin(self.fast(x)))


def _train(logdir: Path, model: nn.Module, steps: int = 5, **options) -> kprof.Session:
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 8)
    with kprof.session(logdir, run="net", model=model, wait=1, warmup=1, active=2, **options) as s:
        for _ in range(steps):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            s.step()
    return s


@pytest.fixture(scope="module")
def eager(tmp_path_factory) -> tuple[kprof.Session, Summary]:
    s = _train(tmp_path_factory.mktemp("log"), Net(), with_stack=True)
    return s, s.summary()


def _module_ranges(trace: Path) -> dict[str, float]:
    """Summed duration (us) of each module's ranges inside the steps, read straight from the trace."""
    events = json.loads(trace.read_text())["traceEvents"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name", "").startswith("ProfilerStep#")]
    out: dict[str, float] = {}
    for e in events:
        if e.get("name", "").startswith("kprof.module:") and any(lo <= e["ts"] < hi for lo, hi in steps):
            name = e["name"].removeprefix("kprof.module:")
            out[name] = out.get(name, 0.0) + e["dur"]
    return out


def test_the_module_that_does_the_work_is_on_top_with_the_share_of_its_ranges(eager):
    session, s = eager
    forward = {m.name: m for m in s.modules if m.direction == "forward"}
    children = sorted(("fast", "spin", "head"), key=lambda n: -forward[n].cpu_us)
    assert children[0] == "spin"
    ranges = _module_ranges(session.trace_files[0])
    wall = sum(step.wall_us for step in s.steps)
    for name in ("", "fast", "spin", "head"):
        assert forward[name].cpu_us == pytest.approx(ranges[name], rel=1e-6)
    assert forward["spin"].share == pytest.approx(ranges["spin"] / wall, rel=1e-6)
    assert forward["spin"].calls == 2 and forward[""].calls == 2  # one call per recorded step
    assert forward[""].self_cpu_us == pytest.approx(ranges[""] - ranges["fast"] - ranges["spin"] - ranges["head"])


def test_backward_goes_to_the_module_of_the_forward_op(eager):
    _, s = eager
    backward = {m.name: m for m in s.modules if m.direction == "backward"}
    assert backward["fast"].calls == backward["head"].calls == 4  # TBackward0 and AddmmBackward0 each step
    assert backward["spin"].calls == 2 * SPIN_OPS  # one MulBackward0 per op
    assert backward["spin"].cpu_us > 0 and backward[""].cpu_us >= backward["spin"].cpu_us
    assert ("(outside modules)", "backward") in {(m.name, m.direction) for m in s.modules}  # the loss's own backward


def test_lines_name_the_users_function_and_the_call_it_makes(eager):
    _, s = eager
    lines = {(line.line, line.direction): line for line in s.lines}
    spin = f"test_modules.py:{inspect.getsourcelines(Spin.forward)[1]} forward"
    assert max(s.lines, key=lambda line: line.cpu_us).line == spin and (spin, "backward") in lines
    # a frame that ran before the window started is named by the line it was on then
    square = {d for line, d in lines if re.fullmatch(r"test_modules\.py:\d+ _train > square", line)}
    assert square == {"forward", "backward"}
    assert not any(line.startswith(("torch/", "kprof_callbacks/")) for line, _ in lines)  # library frames fold


def test_the_views_show_the_modules(eager):
    _, s = eager
    assert "Top modules by CPU time" in s.render() and "spin" in s.render()
    assert "Top modules" in s.to_markdown() and "<h2>Top modules" in s._repr_html_()
    frames = s.to_pandas()
    assert set(frames["modules"].columns) >= {"name", "direction", "gpu_us", "cpu_us", "share"}
    again = Summary.from_dict(json.loads(json.dumps(s.to_dict())))
    assert again.modules == s.modules and again.lines == s.lines


def test_hooks_exist_only_while_a_window_records(tmp_path):
    seen = []
    model = Net()
    model.head.register_forward_hook(lambda *_: seen.append(len(torch.nn.modules.module._global_forward_hooks)))
    other = nn.Linear(8, 8)  # a module outside the model: its calls get no range
    torch.manual_seed(0)
    with kprof.session(tmp_path, run="r", model=model, wait=1, warmup=1, active=2) as s:
        for _ in range(6):
            model(other(torch.randn(2, 8))).sum().backward()
            s.step()
    assert seen == [0, 0, 1, 1, 0, 0]  # wait, warm-up: none; the two recorded steps; after the window: none
    assert not torch.nn.modules.module._global_forward_hooks
    names = {e["name"] for e in json.loads(s.trace_files[0].read_text())["traceEvents"] if "name" in e}
    assert {"kprof.module:", "kprof.module:fast", "kprof.module:spin"} <= names
    assert not any(n.startswith("kprof.module:") and "other" in n for n in names)


def test_a_model_that_is_not_a_module_is_refused_before_training(tmp_path):
    with pytest.raises(TypeError, match="model must be"):
        kprof.session(tmp_path, model="gpt")


def test_the_lightning_callback_records_modules_without_being_given_the_model(tmp_path):
    fit = trainer(tmp_path, [kprof.ProfilerCallback(wait=1, warmup=1, active=2, summary=False)], max_steps=5)
    fit.fit(TinyModel(), loader())
    (run,) = {p.parent for p in tmp_path.rglob("*.pt.trace.json")}
    rows = {(m.name, m.direction) for m in summarize(run).modules}
    assert {("net", "forward"), ("net.0", "forward"), ("net.2", "backward"), ("(optimizer)", "")} <= rows
    # the loss in training_step is outside the modules, not in the optimizer's step that runs the closure
    assert ("(outside modules)", "forward") in rows


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("L['self'].blocks.3.attn", "blocks.3.attn"),
        ("L['self'].blocks[3].attn", "blocks.3.attn"),
        ("L['self']._modules['blocks']._modules['3']", "blocks.3"),
        ("getattr(L['self'].blocks, '3').mlp", "blocks.3.mlp"),
        ("L['self']._orig_mod.lm_head", "lm_head"),
        ("L['self']", ""),
        ("L['model'].net", "net"),
    ],
)
def test_dynamo_module_paths_become_qualified_names(raw, expected):
    assert graph_record.module_path(raw) == expected


class Broken(nn.Module):
    """Two Linears with a graph break between them."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(8, 16)
        self.second = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.first(x))
        torch._dynamo.graph_break()
        return self.second(h).log_softmax(-1)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> tuple[kprof.Session, Summary, dict]:
    model = Broken()
    saved = [torch._inductor.config.fx_graph_cache, torch._functorch.config.enable_autograd_cache]
    s = _train(tmp_path_factory.mktemp("log"), torch.compile(model), steps=4)
    assert [torch._inductor.config.fx_graph_cache, torch._functorch.config.enable_autograd_cache] == saved
    record = json.loads(graphs_path(s.run_dir, s._recorder.writer.worker).read_text())
    return s, s.summary(), record


def _frames(record: dict) -> tuple[str, str]:
    """The compile ids of the two frames Broken compiles to (the forward, then what resumes after the break): Dynamo
    numbers frames in the order a process compiles them, so earlier tests in the process shift them."""
    first, resumed = sorted({g["compile_id"] for g in record["graphs"]}, key=lambda c: int(c.split("/")[0]))
    return first, resumed


@pytest.mark.slow
def test_the_record_names_each_compiled_kernels_modules_and_lines(compiled):
    _, _, record = compiled
    assert record["note"] is None
    graphs = {(g["compile_id"], g["backward"]): g for g in record["graphs"]}
    first, resumed = _frames(record)
    assert set(graphs) == {(first, False), (first, True), (resumed, False), (resumed, True)}
    assert first.endswith("/0") and resumed.endswith("/0")  # each compiled once
    assert graphs[(first, False)]["function"] == "Broken.forward"
    assert graphs[(resumed, False)]["function"].startswith("Broken.torch_dynamo_resume_in_forward")
    names = {tuple(m) for m in record["modules"]}
    assert {("first", False), ("second", False)} <= names
    lines = {code for _, code in record["lines"]}
    assert "h = torch.relu(self.first(x))" in lines and "return self.second(h).log_softmax(-1)" in lines
    assert all(line.split(":")[0].endswith("test_modules.py") for line, _ in record["lines"])
    computed = [record["modules"][m][0] for k in graphs[(first, False)]["kernels"] for m, _ in k["modules"]]
    assert set(computed) == {"first"}  # the first frame computes the first Linear (and its relu) only
    backward = graphs[(resumed, True)]["kernels"]
    assert any(k["loss"] for k in backward) and any(k["extern"] for k in backward)


@pytest.mark.slow
def test_a_graph_break_is_counted_and_a_compiled_root_gets_no_module_ranges(compiled):
    session, s, record = compiled
    assert s.compiled["graphs_per_step"] == 2 and s.compiled["breaks_per_step"] == 1
    assert s.compiled["resumed"] == [_frames(record)[1]] and s.compiled["recompiled"] == []
    assert f"1 graph break a step (resuming: {_frames(record)[1]})" in s.render()
    names = {e.get("name", "") for e in json.loads(session.trace_files[0].read_text())["traceEvents"]}
    assert not any(n.startswith("kprof.module:") for n in names)


class Stack(nn.Module):
    """Two blocks, each to be compiled in place (``block.compile()``), as a transformer's often are."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.relu(block(x))
        return x


def test_modules_compiled_in_place_keep_their_ranges_and_no_hook_is_compiled(tmp_path):
    """The hooks around a compiled module's call run under Dynamo's frame callback: Dynamo compiles none of them
    (it would make each a no-op, compiled in the window's first step), so each compiled block keeps its range."""
    torch._dynamo.reset()
    model = Stack()
    for block in model.blocks:
        block.compile(backend="eager")
    model(torch.randn(4, 8)).sum().backward()  # compiled before the window
    torch._dynamo.utils.counters.clear()
    session = _train(tmp_path, model, steps=4)
    assert dict(torch._dynamo.utils.counters["frames"]) == {}
    names = {e.get("name", "") for e in json.loads(session.trace_files[0].read_text())["traceEvents"]}
    assert {"kprof.module:", "kprof.module:blocks.0", "kprof.module:blocks.1"} <= names


def test_without_an_inductor_hook_the_record_says_why(tmp_path, monkeypatch):
    import torch._inductor.debug as debug

    monkeypatch.delattr(debug, "set_kernel_post_grad_provenance_tracing")
    assert "set_kernel_post_grad_provenance_tracing" in torch_compat.record_inductor_kernels(print)
    s = _train(tmp_path, Net(), steps=3)
    record = json.loads(graphs_path(s.run_dir, s._recorder.writer.worker).read_text())
    assert "no set_kernel_post_grad_provenance_tracing" in record["note"] and record["graphs"] == []


def test_a_data_parallel_wrapper_is_seen_through(tmp_path):
    s = _train(tmp_path, nn.DataParallel(Net()), steps=4)
    names = {m.name for m in s.summary().modules}
    assert {"", "fast", "spin", "head"} <= names and not any(n.startswith("module") for n in names)


@pytest.mark.parametrize(
    "frame, call",
    [
        ("<built-in method square of Tensor object at 0x7f51a929a530>", "square"),
        ("<built-in function scaled_dot_product_attention>", "scaled_dot_product_attention"),
        ("<built-in method _log_softmax of type object at 0x7f>", "_log_softmax"),
        ("nn.Module: Linear_0", "Linear"),
        ("torch/nn/functional.py(3462): cross_entropy", "cross_entropy"),
    ],
)
def test_a_line_names_the_call_it_makes_as_the_user_wrote_it(frame, call):
    assert attribution._callee(frame) == call


class _Range:
    """Stands for the profiler's range in the hooks: notes (thread, "enter" or "exit", name) in ``seen``."""

    seen: list[tuple[int, str, str]] = []

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        self.seen.append((threading.get_ident(), "enter", self.name))

    def __exit__(self, *exc: object) -> None:
        self.seen.append((threading.get_ident(), "exit", self.name))


def _ranges_of(run: Callable[[nn.Module], None], monkeypatch) -> list[tuple[int, str, str]]:
    """What the hooks of ``ModuleRanges`` do with their ranges while ``run`` calls a Net."""
    monkeypatch.setattr(torch_compat, "FastRange", _Range)
    monkeypatch.setattr(_Range, "seen", [])
    model = Net()
    ranges = module_ranges.ModuleRanges(model)
    ranges.start()
    try:
        run(model)
    finally:
        ranges.stop()
    return _Range.seen


def test_a_compile_sessions_own_module_calls_get_no_range(monkeypatch):
    """Inside a compile session (the flag ``torch.compiler.is_compiling()`` reads), modules called on fake tensors
    open no range, as in code Dynamo traces."""
    x = torch.randn(2, 8)
    assert len(_ranges_of(lambda model: model(x), monkeypatch)) == 8
    monkeypatch.setattr(torch.compiler, "_is_compiling_flag", True)
    assert torch.compiler.is_compiling()
    assert _ranges_of(lambda model: model(x), monkeypatch) == []


def test_a_torch_without_the_private_compiling_flag_asks_is_compiling(monkeypatch):
    """The hooks read ``torch.compiler._is_compiling_flag``; where a torch lacks it, the stand-in asks the public
    ``is_compiling()``, so a hook never raises in the user's step."""
    flag = torch_compat._CompilingFlag()
    assert flag._is_compiling_flag is False
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert flag._is_compiling_flag is True


def test_modules_called_on_many_threads_each_get_their_ranges_nested_on_their_thread(monkeypatch):
    """Each thread keeps its own open ranges: every call of every thread is recorded, each range closed on its
    thread after the ranges it holds, none closed for another thread."""
    x = torch.randn(2, 8)

    def run(model: nn.Module) -> None:
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda _: model(x), range(16)))

    seen = _ranges_of(run, monkeypatch)
    assert Counter(name for _, what, name in seen if what == "enter") == {
        f"kprof.module:{n}": 16 for n in ("", "fast", "spin", "head")
    }
    open_ranges: dict[int, list[str]] = {}
    for thread, what, name in seen:
        stack = open_ranges.setdefault(thread, [])
        if what == "enter":
            stack.append(name)
        else:
            assert stack.pop() == name
    assert len(open_ranges) > 1 and not any(open_ranges.values())


def test_a_compiled_step_of_an_eager_model_records_no_inner_range_no_break_and_compiles_once(tmp_path):
    """The session holds the eager model, training calls its torch.compile wrapper: the model's own call runs the
    hooks as they are (its range is around the compiled frame), Dynamo traces them in its modules' calls and finds
    nothing to do, and the hooks coming and going between windows recompile nothing."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = Net()
    step_model = torch.compile(model, backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 8)
    with kprof.session(tmp_path, run="c", model=model, wait=1, warmup=1, active=2, repeat=2) as s:
        for _ in range(10):
            step_model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            s.step()
    counters = torch._dynamo.utils.counters
    assert counters["frames"]["ok"] == 1 and not counters["graph_break"] and not counters["recompiles"]
    for trace in s.trace_files:
        names = {e.get("name", "") for e in json.loads(trace.read_text())["traceEvents"]}
        assert {n for n in names if n.startswith("kprof.module:")} == {"kprof.module:"}
