"""Each private torch API in kprof_callbacks/torch_compat.py works on the installed torch (CI: the CPU build; the GPU
machine's torch runs the CUDA cases): a torch upgrade that breaks one fails here, by name."""

from __future__ import annotations

import json

import pytest
import torch
from torch.profiler import ProfilerActivity

from kprof_callbacks import torch_compat

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_trace_only_config_is_accepted_by_the_profiler_where_torch_has_it():
    config = torch_compat.trace_only_config()
    if config is None:
        pytest.skip(f"torch {torch.__version__} has no trace_only mode")
    with torch.profiler.profile(activities=[ProfilerActivity.CPU], experimental_config=config):
        torch.ones(3).sum()


def test_profiler_enabled_follows_a_running_profiler():
    assert not torch_compat.profiler_enabled()
    with torch.profiler.profile(activities=[ProfilerActivity.CPU]):
        assert torch_compat.profiler_enabled()
    assert not torch_compat.profiler_enabled()


def _profiled_steps(tmp_path, enabled: bool) -> list[str]:
    """Names of the ProfilerStep ranges torch records while step ranges are on or off."""
    out = tmp_path / "trace.json"
    prof = torch.profiler.profile(
        activities=[ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(wait=0, warmup=0, active=3),
        on_trace_ready=lambda p: p.export_chrome_trace(str(out)),
    )
    with prof:
        for _ in range(3):
            torch_compat.step_ranges(prof, enabled)
            torch.ones(4).sum()
            prof.step()
    return [
        e["name"] for e in json.loads(out.read_text())["traceEvents"] if e.get("name", "").startswith("ProfilerStep")
    ]


def test_step_ranges_turn_torchs_profilerstep_ranges_on_and_off(tmp_path):
    assert _profiled_steps(tmp_path, True)
    assert _profiled_steps(tmp_path, False) == []


def test_window_results_export_a_chrome_trace(tmp_path):
    exported = []

    def ready(prof):
        path = tmp_path / "window.json"
        torch_compat.window_results(prof).export_chrome_trace(str(path))
        exported.append(json.loads(path.read_text()))

    sched = torch.profiler.schedule(wait=0, warmup=0, active=1)
    with torch.profiler.profile(activities=[ProfilerActivity.CPU], schedule=sched, on_trace_ready=ready) as prof:
        torch.ones(2).sum()
        prof.step()
    assert exported and exported[0]["traceEvents"]


@cuda
def test_memory_history_is_recorded_and_dumped(tmp_path):
    torch_compat.record_memory_history(True)
    try:
        torch.ones(1024, device="cuda").sum()
        torch_compat.dump_memory_snapshot(tmp_path / "snap.pickle")
    finally:
        torch_compat.record_memory_history(False)
    assert (tmp_path / "snap.pickle").stat().st_size > 0


def test_is_compiled_tells_torch_compiles_wrapper_from_a_module():
    module = torch.nn.Linear(2, 2)
    assert not torch_compat.is_compiled(module)
    assert torch_compat.is_compiled(torch.compile(module))


def test_original_module_is_the_module_under_torch_compiles_wrapper():
    module = torch.nn.Linear(2, 2)
    assert torch_compat.original_module(torch.compile(module)) is module
    assert torch_compat.original_module(module) is module


def test_has_fake_kernel_follows_register_fake():
    lib = torch.library.Library("kprof_compat_test", "FRAGMENT")
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: 2 * x, "CPU")
    assert not torch_compat.has_fake_kernel("kprof_compat_test::twice")
    torch.library.register_fake("kprof_compat_test::twice", lambda x: torch.empty_like(x), lib=lib)
    assert torch_compat.has_fake_kernel("kprof_compat_test::twice")


def test_autocasts_names_the_ops_torch_autocasts_itself():
    assert torch_compat.autocasts("aten::layer_norm", "cuda")  # fp32 policy under CUDA autocast
    assert not torch_compat.autocasts("aten::gelu", "cuda") and not torch_compat.autocasts("aten::gelu", "cpu")


def test_is_fake_tells_fake_tensors_from_real_ones():
    from torch._subclasses import FakeTensorMode

    with FakeTensorMode():
        fake = torch.empty(3)
    assert torch_compat.is_fake(fake) and not torch_compat.is_fake(torch.empty(3))


def test_a_function_never_compiled_as_a_frame_runs_as_written_under_dynamos_callback():
    """A module compiled in place calls the global hooks under Dynamo's frame callback: marked, they run eagerly."""
    torch._dynamo.reset()
    seen: list[bool] = []

    def hook(module, args) -> None:
        seen.append(torch.compiler.is_compiling())

    torch_compat.never_compiled_as_frames(hook)
    layer = torch.nn.Linear(2, 2)
    layer.compile(backend="eager")
    handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
    try:
        layer(torch.ones(1, 2))
    finally:
        handle.remove()
    assert seen == [False]
