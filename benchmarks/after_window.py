"""Cost of a training step after a profiling window, every variant in one process.

Two numbers per variant: the median step time long after the window, and the host time the training thread spends
inside the per-step call itself (``prof.step()``, ``s.step()``: the part a profiler adds to every step directly,
which does not drown in the step's own noise). CUPTI is detached after each window (``TEARDOWN_CUPTI=1``, set here for
all variants as kprof sets it), so the variants can share a process; they run in interleaved rounds so clock drift
hits all alike. Then the per-step calls alone, warm, and a machine sample's cost (``machine.MachineProbe``).

``--bump`` measures the steps right after each window instead (``bump.py``): the user's own step, timed outside
kprof, against the steps after it, with the minor page faults in it and the export process's CPU time, for kprof
exporting in a forked process (as it does), kprof exporting in-process, and no profiler; and what the session charges
to itself for it (``kprof/after_window_ms``), so that the step-time scalars stay flat.

    python benchmarks/after_window.py           # the launch-bound MLP; 6 variants x 5 rounds of 100 steps
    python benchmarks/after_window.py --bump [--out FILE]   # the step after each window (CPU or the first GPU)
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
import kprof_callbacks as kprof  # noqa: E402

from overhead import Loop  # noqa: E402

STEPS, ROUNDS = 100, 5


def none(loop: Loop, logdir: str) -> tuple[list[float], list[float]]:
    return loop.run(STEPS)


def record_function_only(loop: Loop, logdir: str) -> tuple[list[float], list[float]]:
    """What torch.profiler does at every step even outside windows: a ProfilerStep#N range."""
    state = {"step": 0, "range": None}

    def hook() -> None:
        if state["range"] is not None:
            state["range"].__exit__(None, None, None)
        state["step"] += 1
        state["range"] = torch.profiler.record_function(f"ProfilerStep#{state['step']}")
        state["range"].__enter__()

    times = loop.run(STEPS, hook)
    state["range"].__exit__(None, None, None)
    return times


def raw_after(loop: Loop, logdir: str) -> tuple[list[float], list[float]]:
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=3, repeat=1)
    with torch.profiler.profile(schedule=schedule, on_trace_ready=lambda prof: None) as prof:
        return _after_window(loop.run(STEPS + 10, prof.step))


def kprof_after(loop: Loop, logdir: str, scalars: bool = True) -> tuple[list[float], list[float]]:
    with kprof.session(logdir, run=f"after-{time.time_ns()}", wait=1, warmup=1, active=3, scalars=scalars) as s:
        return _after_window(loop.run(STEPS + 10, s.step))


def kprof_disabled(loop: Loop, logdir: str) -> tuple[list[float], list[float]]:
    with kprof.session(logdir, enabled=False) as s:
        return loop.run(STEPS, s.step)


def _after_window(run: tuple[list[float], list[float]]) -> tuple[list[float], list[float]]:
    steps, hooks = run
    return steps[10:], hooks[10:]


VARIANTS = {
    "none": none,
    "record_function only": record_function_only,
    "raw torch.profiler after window": raw_after,
    "kprof after window": kprof_after,
    "kprof after window, scalars=False": lambda loop, logdir: kprof_after(loop, logdir, scalars=False),
    "kprof enabled=False": kprof_disabled,
}


def warm_calls(calls: int = 3000) -> dict[str, float]:
    """Median µs of the per-step call alone, repeated with nothing in between (caches warm), after the window."""

    def median_us(fn) -> float:
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e6

    schedule = dict(wait=1, warmup=1, active=1, repeat=1)
    out = {
        "record_function enter+exit": median_us(
            lambda: torch.profiler.record_function("x").__enter__().__exit__(None, None, None)
        )
    }
    with torch.profiler.profile(schedule=torch.profiler.schedule(**schedule), on_trace_ready=lambda prof: None) as prof:
        for _ in range(5):
            prof.step()
        out["raw torch.profiler prof.step()"] = median_us(prof.step)
    with tempfile.TemporaryDirectory() as logdir, kprof.session(logdir, run="warm", **schedule) as s:
        for _ in range(5):
            s.step()
        out["kprof s.step()"] = median_us(s.step)
    return out


def machine_sample_us(samples: int = 3000) -> float:
    """Median µs of one machine sample (``MachineProbe.on_step`` at a sampled step), GPU evidence included where
    NVML loads; a session samples every ``MACHINE_EVERY`` steps."""
    from kprof_callbacks.machine import MachineProbe, pci_bus_id

    gpu = pci_bus_id(torch.cuda.get_device_properties(0)) if torch.cuda.is_available() else None
    probe = MachineProbe(every=1, pci_bus_id=gpu)
    times = []
    for step in range(samples):
        start = time.perf_counter()
        probe.on_step(step)
        times.append(time.perf_counter() - start)
        probe.metrics(step)
    probe.close()
    return statistics.median(times) * 1e6


def main() -> None:
    if "--bump" in sys.argv:
        import bump

        sys.exit(bump.main([a for a in sys.argv[1:] if a != "--bump"]))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    loop = Loop(256, 24, 64, device)  # the launch-bound MLP of benchmarks/overhead.py
    loop.run(20)
    steps = {name: [] for name in VARIANTS}
    hooks = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as logdir:
        for _ in range(ROUNDS):
            for name, run in VARIANTS.items():
                step_s, hook_s = run(loop, logdir)
                steps[name].append(statistics.median(step_s) * 1e3)
                hooks[name].append(statistics.median(hook_s) * 1e6)
    base = statistics.median(steps["none"])
    where = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(f"{where}, torch {torch.__version__}: medians over {ROUNDS} interleaved rounds of {STEPS} steps\n")
    print("| variant | step (ms) | step, each round | vs none | in the per-step call (us) |\n|---|---|---|---|---|")
    for name, values in steps.items():
        median = statistics.median(values)
        cells = ", ".join(f"{v:.2f}" for v in values)
        print(
            f"| {name} | {median:.3f} | {cells} | {(median / base - 1) * 100:+.1f}% | "
            f"{statistics.median(hooks[name]):.1f} |"
        )
    print("\n| the per-step call alone, 3,000 times after the window | us |\n|---|---:|")
    for name, us in warm_calls().items():
        print(f"| {name} | {us:.1f} |")
    from kprof_callbacks.machine import MACHINE_EVERY

    sample = machine_sample_us()
    print(f"| a machine sample, every {MACHINE_EVERY} steps (per step: {sample / MACHINE_EVERY:.1f}) | {sample:.1f} |")


if __name__ == "__main__":
    main()
