"""A real (tiny) training loop under ``kprof.session``: imported by the fault tests, or run as a subprocess.

As a script it prints ``step <n> recording=<0|1> captures=<c> traces=<k>`` after every step (``c`` windows
finished, ``k`` of them written), so a test can pick the moment to signal or kill it, and ``done <k>`` when
the session has closed. Session options come as ``--option name=<python literal>`` (``--option active=3``);
``--slow-first-trace S`` gives the session an ``on_trace`` callback that prints ``on_trace <file>`` and, for the
first trace only, then sleeps ``S`` seconds (a slow consumer, holding the writer).
"""

from __future__ import annotations

import argparse
import ast
import time
from collections.abc import Callable

import torch
from torch import nn

import kprof_callbacks as kprof


def make_model(layers: int = 2, width: int = 16) -> nn.Sequential:
    """``layers`` Linear+GELU blocks; more layers make a bigger trace (slower to write)."""
    torch.manual_seed(0)
    return nn.Sequential(*(block for _ in range(layers) for block in (nn.Linear(width, width), nn.GELU())))


def train(
    s: kprof.Session,
    steps: int,
    *,
    model: nn.Sequential | None = None,
    step_sleep: float = 0.0,
    after_step: Callable[[kprof.Session], None] | None = None,
) -> None:
    """Run ``steps`` SGD steps, each marked with ``s.step()`` (and a ``forward`` region)."""
    model = model if model is not None else make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    width = model[0].in_features
    for _ in range(steps):
        with s.region("forward"):
            loss = model(torch.randn(8, width)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step_sleep:
            time.sleep(step_sleep)
        s.step(samples=8)
        if after_step is not None:
            after_step(s)


def option_arg(text: str) -> tuple[str, object]:
    """``--option active=3`` -> ``("active", 3)`` (the value is a Python literal)."""
    name, _, value = text.partition("=")
    return name, ast.literal_eval(value)


def slow_first_trace(seconds: float) -> Callable[[object], None]:
    """An ``on_trace`` callback that announces each trace and sleeps ``seconds`` after the first one."""
    seen = []

    def on_trace(path) -> None:
        print(f"on_trace {path.name}", flush=True)
        seen.append(path)
        if len(seen) == 1:
            time.sleep(seconds)

    return on_trace


def _progress(s: kprof.Session) -> None:
    counts = f"recording={int(s.recording)} captures={len(s.captures)} traces={len(s.trace_files)}"
    print(f"step {s.steps} {counts}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("logdir")
    parser.add_argument("--run", default="r")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--option", type=option_arg, action="append", default=[])
    parser.add_argument("--slow-first-trace", type=float, default=None, metavar="SECONDS")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # a tiny model: extra threads only contend for the CI machine's cores
    config = kprof.ProfileConfig.from_kwargs(logdir=args.logdir, run=args.run, **dict(args.option))
    on_trace = None if args.slow_first_trace is None else slow_first_trace(args.slow_first_trace)
    with kprof.Session(config, on_trace=on_trace) as s:
        train(s, args.steps, model=make_model(args.layers), step_sleep=args.step_sleep, after_step=_progress)
    print(f"done {len(s.trace_files)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
