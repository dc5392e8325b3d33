"""Fixtures of the fault-injection suite: a real loop and fit, trace checks, tiny and read-only disks, children.

tests/faults/helpers/ goes on sys.path: ``loop`` (the training loop, also run as a subprocess) and ``faultkit``
(plain helpers the test modules import).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "helpers"))

import loop  # noqa: E402
from faultkit import Child, assert_traces_valid  # noqa: E402


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Tiny models on a busy 2-core CI machine: torch's spinning worker threads only slow every step down."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def train() -> Callable[..., None]:
    """``train(session, steps, ...)``: the tiny SGD loop of helpers/loop.py, in this process."""
    return loop.train


@pytest.fixture
def fit(tmp_path: Path) -> Callable[..., object]:
    """``fit(callbacks, steps, at_start=None)``: a tiny Lightning fit (helpers/lightning_loop.py's model) that
    calls ``at_start()`` when training starts (to inject a fault); returns the trainer."""
    import lightning as L

    from lightning_loop import Regression, regression_data

    class AtStart(L.Callback):
        def __init__(self, action: Callable[[], object]) -> None:
            self.action = action

        def on_train_start(self, trainer, pl_module) -> None:
            self.action()

    def run(callbacks: list, steps: int, at_start: Callable[[], object] | None = None) -> L.Trainer:
        extra = [AtStart(at_start)] if at_start is not None else []
        trainer = L.Trainer(
            max_steps=steps,
            callbacks=[*callbacks, *extra],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=tmp_path / "lightning",
        )
        trainer.fit(Regression(0.0), regression_data())
        return trainer

    return run


@pytest.fixture
def check_traces() -> Callable[[Path], list[Path]]:
    return assert_traces_valid


@contextlib.contextmanager
def kprof_warnings() -> Iterator[list[str]]:
    """Record every kprof warning raised inside the block (from any thread), duplicates included."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got: list[str] = []
        yield got
    got.extend(str(w.message) for w in caught if str(w.message).startswith("kprof:"))


@pytest.fixture
def told():
    """``with told() as messages:`` collects the kprof warnings the user saw."""
    return kprof_warnings


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """``tmpfs("2m")`` mounts a real tmpfs of that size (a small disk that really fills up); unmounted after."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        where = tmp_path / f"tmpfs{len(mounted)}"
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {done.stderr.decode().strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in reversed(mounted):
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture
def read_only() -> Iterator[Callable[[Path], None]]:
    """``read_only(folder)`` makes writes in ``folder`` fail from now on.

    chmod is no barrier to root (CAP_DAC_OVERRIDE), so as root the folder becomes a read-only bind mount of
    itself (writes fail with EROFS); otherwise its mode becomes r-x. Undone after the test.
    """
    undo: list[list[str] | tuple[Path, int]] = []

    def protect(folder: Path) -> None:
        if os.geteuid() != 0:
            undo.append((folder, folder.stat().st_mode))
            folder.chmod(0o555)
            return
        for command in (["mount", "--bind", str(folder), str(folder)], ["mount", "-o", "remount,bind,ro", str(folder)]):
            done = subprocess.run(command, capture_output=True)
            if done.returncode != 0:
                pytest.skip(f"root, but cannot make a read-only bind mount: {done.stderr.decode().strip()}")
            if command[1] == "--bind":
                undo.append(["umount", "-l", str(folder)])

    yield protect
    for step in reversed(undo):
        if isinstance(step, list):
            subprocess.run(step, check=False)
        else:
            step[0].chmod(step[1])


@pytest.fixture
def spawn() -> Iterator[Callable[..., Child]]:
    """``spawn(logdir, *args, script="loop.py")`` starts a helper; whatever is left of its process group dies after."""
    children: list[Child] = []

    def start(logdir: Path, *args: str, script: str = "loop.py") -> Child:
        children.append(Child(logdir, *args, script=script))
        return children[-1]

    yield start
    for child in children:
        child.kill_group()
