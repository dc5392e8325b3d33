"""Where the training thread's time goes in the step that closes a profiling window, by py-spy's native stacks.

That step's block is almost all torch's ``_disable_profiler()`` (``overhead.py`` measures both). This runs one
window of ``--active`` steps of overhead.py's launch-bound MLP under ``py-spy record --native`` (py-spy is on
PyPI) and prints the share of the samples inside torch's ``disableProfiler`` by the C++ functions it calls.
Each native sample stops the process, so under py-spy the call takes many times longer (3.0 s instead of 0.2 s on
an H100 host): read the shares, not the durations (the measured ones are in ``overhead.py``).

    python benchmarks/window_end.py [--active 30] [--folded block.folded]

It profiles raw torch.profiler, which calls the same ``_disable_profiler()`` as kprof on torch <= 2.11 (on torch
>= 2.12 kprof adds ``trace_only``, which skips the ``KinetoEvent`` list). kprof itself is not run here: its trace
writer forks a child, and py-spy's native sampling stops the process at that fork.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = "disableProfiler"  # torch::autograd::profiler::disableProfiler, what _disable_profiler() binds to
RUN = (
    "import sys; sys.path.insert(0, {here!r}); from overhead import one; "
    "print(one({sizes!r}, 'launch-bound', tool='raw', active={active}))"
)


def short(frame: str) -> str:
    """``ns::(anonymous namespace)::Cls::fn<T> (libtorch.so)`` -> ``Cls::fn``."""
    name = frame.split(" (")[0].replace("(anonymous namespace)::", "")
    while "<" in name and re.search(r"<[^<>]*>", name):
        name = re.sub(r"<[^<>]*>", "", name)
    return "::".join(name.split("::")[-2:])


def breakdown(folded: list[str], depth: int = 2) -> tuple[int, collections.Counter]:
    """Samples under the deepest ``disableProfiler`` frame, grouped by the ``depth`` frames below it."""
    total, parts = 0, collections.Counter()
    for line in folded:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        frames = stack.split(";")
        roots = [i for i, f in enumerate(frames) if ROOT in f.split(" (")[0]]
        if not roots or not count.isdigit():
            continue
        total += int(count)
        below = [short(f) for f in frames[roots[-1] + 1 : roots[-1] + 1 + depth]]
        parts[" > ".join(below) or "(in disableProfiler itself)"] += int(count)
    return total, parts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--active", type=int, default=30, help="steps in the window (default 30, the target's)")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--folded", type=Path, help="keep py-spy's folded stacks here")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args(argv)
    spy = shutil.which("py-spy")
    if spy is None:
        parser.error("py-spy not found on PATH: pip install py-spy")
    import torch

    sizes = "cuda" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        folded = args.folded or Path(tmp) / "block.folded"
        code = RUN.format(here=str(HERE), sizes=sizes, active=args.active)
        subprocess.run(
            [
                spy,
                "record",
                "--native",
                "--rate",
                str(args.rate),
                "--format",
                "raw",
                "-o",
                str(folded),
                "--",
                sys.executable,
                "-c",
                code,
            ],
            check=True,
        )
        total, parts = breakdown(folded.read_text().splitlines())
    if not total:
        print(f"no sample inside {ROOT}: was the window closed?", file=sys.stderr)
        return 1
    print(
        f"\n{total} samples inside {ROOT}, torch {torch.__version__}, "
        f"{torch.cuda.get_device_name() if sizes == 'cuda' else 'cpu'}, {args.active} active steps\n"
    )
    print("| share | under disableProfiler |\n|---:|---|")
    for part, count in parts.most_common(args.top):
        print(f"| {count / total:.0%} | {part} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
