"""One name and one colour for each part of a step's time and each kind of timeline event.

The terminal report, the HTML report and the kprof tab take their words (the last two also their colours) from
here, so "host only" means the same time, in the same orange, wherever it is read.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .tables import StepStats


@dataclasses.dataclass(frozen=True)
class Part:
    """A disjoint part of a step's wall time: the three stack up to the wall time."""

    key: str
    name: str
    color: str
    meaning: str


PARTS = (
    Part("gpu_busy_us", "GPU busy", "#4e79a7", "kernels, copies or sets running on any stream"),
    Part(
        "cpu_only_us",
        "host only",
        "#f28e2b",
        "host operators running while no GPU work runs (on a CPU-only run: all host operator time)",
    ),
    Part("other_us", "other", "#bab0ac", "neither: Python between operators, waits, sleeps"),
)

COLUMNS = {
    "wall_us": "wall",
    "gpu_busy_us": "GPU busy",
    "gpu_idle_us": "GPU idle",
    "kernel_us": "kernels",
    "memcpy_us": "memcpy",
    "memset_us": "memset",
    "comm_us": "comm",
    "cpu_only_us": "host only",
    "other_us": "other",
    "dataloader_us": "data loading",
    "peak_memory": "peak memory",
}
"""The name of each per-step figure, as every report heads its column."""

KIND_COLORS = {
    "operator": PARTS[1].color,
    "label": "#b07aa1",
    "python": "#c7c7c7",
    "runtime": "#e15759",
    "step": "#d6d6d6",
    "kernel": PARTS[0].color,
    "memcpy": "#59a14f",
    "memset": "#76b7b2",
    "communication": "#edc948",
}
"""Timeline colours by event kind (`slices.KINDS`): host operators in the host-only orange, kernels in GPU blue."""

RANK_PARTS = (
    Part("compute_only_us", "computing", PARTS[0].color, "computation while no communication runs"),
    Part("overlap_us", "both", "#a0cbe8", "communication hidden behind computation"),
    Part(
        "exposed_comm_us",
        "communicating",
        KIND_COLORS["communication"],
        "communication while nothing computes: the step waits for it",
    ),
    Part("rest_us", "neither", PARTS[2].color, "the rest of the step"),
)
"""A rank's mean step as the ranks view stacks it: the four add up to the step."""

MEMORY_KINDS = (
    Part("parameters", "parameters", "#4e79a7", "the model's weights"),
    Part("optimizer_state", "optimizer state", "#76b7b2", "what the optimizer keeps between steps (Adam's moments)"),
    Part("gradients", "gradients", "#59a14f", "made in backward, kept until zero_grad"),
    Part("activations", "activations", "#f28e2b", "made in forward and kept past it: saved for backward, outputs"),
    Part("temporaries", "temporaries", "#e15759", "made and freed within one forward, backward or optimizer step"),
    Part("inputs", "inputs", "#edc948", "batches copied from the host in forward"),
    Part(
        "persistent",
        "persistent",
        "#b07aa1",
        "held from before the trace, not named (buffers, caches, the model without the session's note)",
    ),
    Part("other", "other", "#bab0ac", "made after backward outside the optimizer (clipping, logging)"),
)
"""What is alive at a step's memory peak, by kind (`analysis/memory.py`): the kinds add up to the peak."""

CHANGE_COLORS = {"increased": "#e15759", "decreased": "#59a14f"}
"""A diff's rows that grew (red) and shrank (green): the HTML report's bars and the tab's."""


def other_us(step: StepStats) -> float:
    """The wall time that is neither GPU busy nor host only."""
    return max(step.wall_us - step.gpu_busy_us - step.cpu_only_us, 0.0)


def value(part: Part, step: StepStats) -> float:
    """Microseconds of `step` in `part`."""
    return other_us(step) if part.key == "other_us" else getattr(step, part.key)


def legend() -> dict[str, Any]:
    """Everything above as JSON, for the kprof tab."""
    return {
        "parts": [dataclasses.asdict(p) for p in PARTS],
        "columns": COLUMNS,
        "kinds": KIND_COLORS,
        "changes": CHANGE_COLORS,
        "rank_parts": [dataclasses.asdict(p) for p in RANK_PARTS],
        "memory_kinds": [dataclasses.asdict(p) for p in MEMORY_KINDS],
    }
