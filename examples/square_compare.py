"""The seeds' experiment: torch.square(a) vs a * a vs a ** 2 vs kprof's own square kernels.

Each variant is timed with ``kprof.time_cuda`` (CUDA events after a warm-up; perf_counter on a CPU), profiled
for three calls with torch.profiler (its key_averages table is printed, as in the seeds), and the profiler's events say
which ATen op and which device kernel each one dispatched to: torch.square and ``** 2`` go through
``aten::pow``, ``a * a`` through ``aten::mul``. Nothing about the dispatch is hard-coded below.

    python examples/square_compare.py              # 10000 x 10000 float32 on CUDA, 2048 x 2048 on a CPU
    python examples/square_compare.py --size 4096 --iters 100
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from torch.autograd.profiler_util import FunctionEvent
from torch.profiler import ProfilerActivity, profile, schedule

import kprof_callbacks as kprof
from kprof_callbacks import kernels

VARIANTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "torch.square(a)": torch.square,
    "a * a": lambda a: a * a,
    "a ** 2": lambda a: a**2,
    "kernels.square grid2d": lambda a: kernels.square(a, variant="grid2d"),
    "kernels.square vectorized": lambda a: kernels.square(a, variant="vectorized"),
}


def dispatch_chain(events: list[FunctionEvent], cuda: bool) -> list[str]:
    """The ops from the top-level call down to the one that did the work, in the fastest profiled call.

    Of the profiled calls (one ``ProfilerStep`` range each) take the fastest, so that a call the OS preempted
    cannot decide. Starting at its top-level op, step into the child that holds most of the time (device time
    on CUDA, CPU time otherwise) for as long as one child holds more than half of its parent's.
    """

    def cost(e: FunctionEvent) -> float:
        return e.device_time_total if cuda else e.cpu_time_total

    steps = [e for e in events if e.cpu_parent is None and e.name.startswith("ProfilerStep") and e.cpu_children]
    node = max(min(steps, key=cost).cpu_children, key=cost)
    chain = [node.name]
    while node.cpu_children:
        child = max(node.cpu_children, key=cost)
        if cost(child) <= cost(node) / 2:
            break
        node = child
        chain.append(node.name)
    return chain


def device_kernels(events: list[FunctionEvent]) -> list[str]:
    """Names of the GPU kernels the call launched (none on a CPU).

    A ``record_function`` range such as ``kprof::square`` shows up on the GPU timeline too, under the same name
    as on the CPU side; those are not kernels.
    """
    ranges = {e.name for e in events if e.device_type.name == "CPU"}
    return sorted({e.name for e in events if e.device_type.name == "CUDA" and e.name not in ranges})


def profile_calls(fn: Callable, a: torch.Tensor, cuda: bool, calls: int = 3):
    """Profile `calls` calls, one step each, after one profiled-but-discarded warm-up step (the seeds'
    schedule, shortened), so the profiler's own start-up cost stays out of the table."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=calls, repeat=1)) as prof:
        for _ in range(1 + calls):
            fn(a)
            if cuda:
                torch.cuda.synchronize()
            prof.step()
    return prof


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=None, help="a is size x size (default: 10000 CUDA, 2048 CPU)")
    parser.add_argument("--iters", type=int, default=50, help="timed calls per variant (default: 50)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls first (default: 5, as the seeds)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    args = parser.parse_args()

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.startswith("cuda")
    size = args.size or (10000 if cuda else 2048)
    a = torch.randn(size, size, device=device, generator=torch.Generator(device).manual_seed(0))
    reference = torch.square(a)
    moved = 2 * a.numel() * a.element_size()  # read a once, write the result once

    rows = []
    for name, fn in VARIANTS.items():
        err = (fn(a) - reference).abs().max().item()
        timing = kprof.time_cuda(fn, a, warmup=args.warmup, iters=args.iters, device=device)
        prof = profile_calls(fn, a, cuda)
        events = list(prof.events())
        chain, launched = dispatch_chain(events, cuda), device_kernels(events)
        rows.append((name, timing, chain, launched, err))
        print(f"=== {name} ===")
        sort = "self_device_time_total" if cuda else "self_cpu_time_total"
        print(prof.key_averages().table(sort_by=sort, row_limit=8))
        print(f"dispatch: {' -> '.join(chain)}")
        for kernel in launched:
            print(f"device kernel: {kernel}")
        print()

    print(f"a: {size} x {size} {a.dtype} on {timing.device}; {args.iters} timed calls after {args.warmup} warm-up")
    print(f"{'variant':26} {'median ms':>10} {'p10':>8} {'p90':>8} {'GB/s':>7} {'max |err|':>9}  does the work")
    for name, timing, chain, _, err in rows:
        gbps = moved / (timing.median_ms * 1e-3) / 1e9
        print(
            f"{name:26} {timing.median_ms:10.4f} {timing.p10_ms:8.4f} {timing.p90_ms:8.4f} {gbps:7.1f} {err:9.1e}  "
            f"{chain[-1]}"
        )
    print()
    print("What the profiler saw (the op that did the work, and its device kernel):")
    by_op: dict[str, list[str]] = {}
    for name, _, chain, _, _ in rows:
        by_op.setdefault(chain[-1], []).append(name)
    for op, names in by_op.items():
        kernel = next((k for _, _, chain, launched, _ in rows if chain[-1] == op for k in launched), None)
        print(f"  {op}: {', '.join(names)}" + (f"\n      kernel {kernel[:140]}" if kernel else ""))
    chains = {name: chain for name, _, chain, _, _ in rows}
    square, mul = chains["torch.square(a)"], chains["a * a"]
    if square[-1] != mul[-1]:
        print(
            f"  torch.square(a) runs {' -> '.join(square)}, a * a runs {' -> '.join(mul)}: the same values "
            "through different kernels"
        )
    print("GB/s counts the minimum traffic (read a once, write once); the custom kernels only differ on CUDA.")


if __name__ == "__main__":
    main()
