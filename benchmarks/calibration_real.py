"""The calibration end to end (``calibration.py --real``): a small MLP trained under ``kprof.session`` on this
machine, each effect injected into its loop, and the detectors run on its traces as kprof runs them."""

from __future__ import annotations

import mmap
import time
from collections import Counter
from pathlib import Path

import calibration_base as common
from calibration_base import Detector

from kprof_callbacks import stats
from kprof_callbacks.analysis import diff

import load_cases


class RealLoop:
    """A small MLP's training steps under ``kprof.session`` on this machine; each effect is injected into the loop."""

    def __init__(self, logdir: Path) -> None:
        import torch

        self.torch = torch
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.device == "cpu":
            torch.set_num_threads(1)  # intra-op threads spin against other processes: a step's time is not its own
        width, self.batch = (4096, 512) if self.device == "cuda" else (1024, 256)  # ~10-20 ms a step on a CPU
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(width, 2 * width), torch.nn.ReLU(), torch.nn.Linear(2 * width, width)
        ).to(self.device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-4)
        self.x = torch.randn(2 * self.batch, width, device=self.device)
        self.logdir, self.runs = logdir, 0
        self.step_s = min(self._timed() for _ in range(5))
        self.cycles_per_s = self._gpu_clock() if self.device == "cuda" else 0.0

    def _step(self, item: bool = False) -> None:
        loss = self.model(self.x[: self.batch]).square().mean()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if item:
            loss.item()

    def _timed(self) -> float:
        if self.device == "cuda":
            self.torch.cuda.synchronize()
        start = time.perf_counter()
        self._step()
        if self.device == "cuda":
            self.torch.cuda.synchronize()
        return time.perf_counter() - start

    def _gpu_clock(self) -> float:
        """Cycles a second of ``torch.cuda._sleep``, the GPU's own spin, timed with CUDA events."""
        cuda = self.torch.cuda
        cuda._sleep(1000)
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        cycles = 20_000_000
        start.record()
        cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return cycles / (start.elapsed_time(end) / 1e3)

    def _pause(self, seconds: float) -> None:
        """Make this step ``seconds`` longer where its time is spent: on the CPU a sleep; on a GPU a spin kernel,
        since the host runs steps ahead of the GPU and a host sleep there is absorbed, never slowing training."""
        if self.device == "cuda":
            self.torch.cuda._sleep(int(seconds * self.cycles_per_s))
        else:
            time.sleep(seconds)

    def _megabyte(self):
        """1 MB kept: on the GPU a tensor (CUDA allocated); on the CPU new pages (malloc would reuse freed ones)."""
        if self.device == "cuda":
            return self.torch.ones(2**18, device=self.device)
        block = mmap.mmap(-1, 2**20)
        block.write(b"\1" * len(block))
        return block

    def _tiny(self) -> None:
        t = self.x[:8, :8].clone()
        for _ in range(300):
            t = t * 1.0001 + 0.0001

    def run(self, steps: int, effect: str = "", schedule: dict | None = None, **options):
        """A session of ``steps`` steps with ``effect`` injected; returns it, stopped."""
        import kprof_callbacks as kprof

        self.runs += 1
        kept = []
        schedule = schedule or common.SCHEDULE
        with kprof.session(self.logdir, run=f"r{self.runs}", **schedule, **options) as s:
            for i in range(steps):
                if effect == "data":
                    with s.region("data_loading"):
                        time.sleep(0.15 / 0.85 * self.step_s)
                if effect in ("slow", "slower") and i == steps // 2:
                    self._pause(self.step_s * (1 if effect == "slow" else 3))
                if effect == "tiny":
                    self._tiny()
                else:
                    self._step(item=effect == "item")
                if effect == "longer":
                    self._pause(0.2 * self.step_s)
                if effect == "leak":
                    kept.append(self._megabyte())
                s.step()
        return s


def real_detectors(loop: RealLoop) -> tuple[Detector, ...]:
    """The detectors end to end on ``loop``'s machine: (name, run, effect, fired(rng, sigma, inject))."""
    return (*_run_rows(loop), *_hog_rows(loop), *(_gpu_rows(loop) if loop.device == "cuda" else ()))


def _finding(loop: RealLoop, kind: str, effect: str, steps: int = 14, **options):
    """Fires when a run of ``steps`` steps (with ``effect`` when injected) has a ``kind`` finding."""

    def fired(rng, sigma, inject) -> bool:
        return kind in {d.kind for d in loop.run(steps, effect if inject else "", **options).summary().diagnostics}

    return fired


def _run_rows(loop: RealLoop) -> list[Detector]:
    """The findings, the diff and its gate, and the slow-step trigger, on runs of ``loop``."""

    def leak(rng, sigma, inject) -> bool:
        session = loop.run(100, "leak" if inject else "", {"wait": 97, "warmup": 1, "active": 2, "repeat": 1})
        return "memory_growth" in {d.kind for d in session.summary().diagnostics}

    def step_time(rng, sigma, inject) -> bool:
        a, b = loop.run(14), loop.run(14, "longer" if inject else "")
        verdict = diff(a.run_dir, b.run_dir).step_time.verdict
        return verdict == stats.SLOWER if inject else verdict != stats.SAME

    def gate(rng, sigma, inject) -> bool:
        a, b = loop.run(14), loop.run(14, "longer" if inject else "")
        return diff(a.run_dir, b.run_dir).regressed(5)

    def trigger(rng, sigma, inject) -> bool:
        session = loop.run(
            120, "slower" if inject else "", {"warmup": 1, "active": 1}, trigger="slow_step", max_captures=1
        )
        return bool(session.captures)

    slow, data = _finding(loop, "slow_step", "slow"), _finding(loop, "dataloader", "data")
    return [
        Detector("slow step", "10 profiled steps", "one step 2x (a sleep or spin)", slow),
        Detector("data loading", "10 profiled steps", "a data_loading region 15% of each step", data),
        Detector("memory growth", "100 steps, memory_every=5", "1 MB kept every step", leak),
        Detector(
            "diff: step time", "10 against 10 profiled steps", "B's steps 20% longer (a sleep or spin)", step_time
        ),
        Detector(
            "diff: gate at 5%",
            "10 against 10 profiled steps, the same code",
            "B's steps 20% longer (a sleep or spin)",
            gate,
        ),
        Detector("slow-step trigger", "120 steps, factor 3", "one step 4x (a sleep or spin)", trigger),
    ]


def _hog_rows(loop: RealLoop) -> list[Detector]:
    """The diff's gate and compare's verdict while CPU hogs load the machine."""
    statuses = Counter()  # the gate's exit statuses, with and without hogs
    return [
        Detector(
            "diff: machine changed",
            "14 steps a side, the same code (false positive: the gate at 5% calls a code regression)",
            "a CPU hog on every core from before B (detected: B busier, no code regression)",
            load_cases.diff_under_hog(loop, statuses),
            lambda: {"gate_exit_statuses": {f"{hog}: {status}": n for (hog, status), n in sorted(statuses.items())}},
        ),
        *(
            Detector(
                f"compare under a CPU hog: {effect:g}x",
                "20 timed steps a variant, hogs on every core (false positive: identical called faster/slower)",
                f"a variant {effect:g}x slower (a sleep)",
                load_cases.compare_under_hog(loop, effect),
                detection_target=effect >= 10,
            )
            for effect in (1.5, 10.0)
        ),
    ]


def _gpu_rows(loop: RealLoop) -> list[Detector]:
    """The findings that need a GPU."""
    return [
        Detector("syncs", "10 profiled steps", "loss.item() every step", _finding(loop, "sync", "item")),
        Detector(
            "launch-bound",
            "10 profiled steps of a compute-bound MLP",
            "300 tiny kernels a step",
            _finding(loop, "launch_bound", "tiny"),
        ),
    ]
