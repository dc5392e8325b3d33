"""The memory findings fire on their effect and stay quiet on what the calibration's noise-only runs hold: a window's
first step with the effect, a typical share under the threshold."""

from __future__ import annotations

import numpy as np

from kprof_callbacks import layout
from kprof_callbacks.analysis.memory import KINDS, MemoryBlock, MemoryStep, MemorySummary, RepeatedModule
from kprof_callbacks.analysis.memory_findings import memory_findings
from kprof_callbacks.analysis.series import Series

GB = 2**30


def _step(i: int, *, largest: float = 0.02, reserved: float = 1.05, **shares: float) -> MemoryStep:
    kinds = {k: 0 for k in KINDS}
    kinds.update({k: int(8 * GB * v) for k, v in shares.items()})
    kinds["parameters"] = 8 * GB - sum(kinds.values())
    return MemoryStep(
        i, None, "w", 8 * GB, int(8 * GB * reserved), 1.0, "backward", "blocks.3.attn", kinds, {}, int(8 * GB * largest)
    )


def _memory(steps: list[MemoryStep], blocks=(), repeated=()) -> MemorySummary:
    return MemorySummary("cuda", steps, steps[0], [], [], list(blocks), [], list(repeated))


def _kinds(memory: MemorySummary, series=None) -> dict[str, str]:
    return {d.kind: d.message for d in memory_findings(memory, series)}


def test_activations_fire_on_the_median_step_and_name_what_checkpointing_frees():
    repeated = [RepeatedModule(f"blocks.{i}", "blocks.*", 400 * 2**20, 50 * 2**20, 2000.0) for i in range(12)]
    steps = [_step(i, activations=0.6) for i in range(10)]
    message = _kinds(_memory(steps, repeated=repeated))["memory_activations"]
    assert "Activations fill 60% of the memory peak (4.8 GB" in message
    assert "Checkpointing each of the 12 blocks.*" in message
    assert "would free about 3.8 GB" in message  # 12 x 350 MB less one block's 350 MB: 3,850 MB
    assert "24.0 ms per step" in message
    quiet = [_step(i, activations=0.6 if i % 5 == 0 else 0.35) for i in range(10)]
    assert "memory_activations" not in _kinds(_memory(quiet))


def test_a_large_tensor_is_named_with_its_operator_module_and_shapes():
    block = MemoryBlock(
        int(0.12 * 8 * GB),
        "activations",
        "lm_head",
        "aten::cross_entropy_loss",
        "aten::_log_softmax",
        "[[4096, 50304], [4096]]",
        "forward",
        10.0,
        20.0,
    )
    steps = [_step(i, activations=0.3, largest=0.12) for i in range(10)]
    message = _kinds(_memory(steps, [block]))["memory_large_tensor"]
    assert "One tensor holds 12% of the memory peak (983.0 MB" in message
    assert "aten::cross_entropy_loss (aten::_log_softmax) of input [[4096, 50304], [4096]] in lm_head" in message
    quiet = [_step(i, activations=0.3, largest=0.12 if i % 5 == 0 else 0.04) for i in range(10)]
    assert "memory_large_tensor" not in _kinds(_memory(quiet, [block]))


def test_optimizer_state_fires_on_its_share():
    assert "memory_optimizer_state" in _kinds(_memory([_step(i, optimizer_state=0.32) for i in range(10)]))
    quiet = [_step(i, optimizer_state=0.3 if i % 5 == 0 else 0.15) for i in range(10)]
    assert "memory_optimizer_state" not in _kinds(_memory(quiet))


def test_fragmentation_from_the_trace_or_from_the_scalars():
    steps = [_step(i, activations=0.3, reserved=1.6) for i in range(10)]
    assert "from the trace" in _kinds(_memory(steps))["memory_fragmentation"]
    quiet = [_step(i, activations=0.3, reserved=1.6 if i % 5 == 0 else 1.1) for i in range(10)]
    assert "memory_fragmentation" not in _kinds(_memory(quiet))
    untraced = [_step(i, activations=0.3, reserved=0) for i in range(10)]
    at = np.arange(10)
    series = {
        "w": {
            layout.MEMORY_TAGS["reserved"]: Series(at, np.full(10, 12_000.0)),
            layout.MEMORY_TAGS["peak"]: Series(at, np.full(10, 8_000.0)),
        }
    }
    assert "kprof/mem_reserved_mb" in _kinds(_memory(untraced), series)["memory_fragmentation"]
    assert "memory_fragmentation" not in _kinds(_memory(untraced))


def test_no_memory_no_findings():
    assert memory_findings(None) == []
