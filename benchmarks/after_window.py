"""Cost of a training step long after a profiling window, every variant in one process (H100 check).

CUPTI is detached after each window (``TEARDOWN_CUPTI=1``, set here for all variants as kprof sets it), so the
variants can share a process; they run in interleaved rounds so clock drift hits all alike.

    python benchmarks/after_window.py      # needs CUDA; 6 variants x 5 rounds of 100 steps
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TEARDOWN_CUPTI", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import Loop  # noqa: E402

import kprof_callbacks as kprof  # noqa: E402

STEPS, ROUNDS = 100, 5


def none(loop: Loop, logdir: str) -> list[float]:
    return loop.run(STEPS)[0]


def record_function_only(loop: Loop, logdir: str) -> list[float]:
    """What torch.profiler does at every step even outside windows: a ProfilerStep#N range."""
    state = {"step": 0, "range": None}

    def hook() -> None:
        if state["range"] is not None:
            state["range"].__exit__(None, None, None)
        state["step"] += 1
        state["range"] = torch.profiler.record_function(f"ProfilerStep#{state['step']}")
        state["range"].__enter__()

    times = loop.run(STEPS, hook)[0]
    state["range"].__exit__(None, None, None)
    return times


def raw_after(loop: Loop, logdir: str) -> list[float]:
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=3, repeat=1)
    with torch.profiler.profile(schedule=schedule, on_trace_ready=lambda prof: None) as prof:
        return loop.run(STEPS + 10, prof.step)[0][10:]


def kprof_after(loop: Loop, logdir: str, scalars: bool = True) -> list[float]:
    with kprof.session(logdir, run=f"after-{time.time_ns()}", wait=1, warmup=1, active=3, scalars=scalars) as s:
        return loop.run(STEPS + 10, s.step)[0][10:]


def kprof_disabled(loop: Loop, logdir: str) -> list[float]:
    with kprof.session(logdir, enabled=False) as s:
        return loop.run(STEPS, s.step)[0]


VARIANTS = {
    "none": none,
    "record_function only": record_function_only,
    "raw torch.profiler after window": raw_after,
    "kprof after window": kprof_after,
    "kprof after window, scalars=False": lambda loop, logdir: kprof_after(loop, logdir, scalars=False),
    "kprof enabled=False": kprof_disabled,
}


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("after_window.py measures CUDA launch overhead: it needs a CUDA device")
    loop = Loop(256, 24, 64, "cuda")  # the launch-bound MLP of benchmarks/overhead.py
    loop.run(20)
    rounds = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as logdir:
        for _ in range(ROUNDS):
            for name, run in VARIANTS.items():
                rounds[name].append(statistics.median(run(loop, logdir)) * 1e3)
    base = statistics.median(rounds["none"])
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: median step, {ROUNDS} rounds of {STEPS}\n")
    print("| variant | median of round medians (ms) | rounds | vs none |\n|---|---|---|---|")
    for name, values in rounds.items():
        median = statistics.median(values)
        cells = ", ".join(f"{v:.2f}" for v in values)
        print(f"| {name} | {median:.3f} | {cells} | {(median / base - 1) * 100:+.1f}% |")


if __name__ == "__main__":
    main()
