"""Shared tools for the fault-injection suite: a real loop, trace validation, tiny disks, child processes."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

HELPERS = Path(__file__).parent / "helpers"
sys.path.insert(0, str(HELPERS))

import loop  # noqa: E402  (tests/faults/helpers/loop.py: the training loop the subprocesses run too)

TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")


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
            max_steps=steps, callbacks=[*callbacks, *extra], logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path / "lightning",
        )
        trainer.fit(Regression(0.0), regression_data())
        return trainer

    return run


def final_traces(root: Path) -> list[Path]:
    """Every file under ``root`` with a final trace name (the names TensorBoard and ``kprof summary`` read)."""
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(TRACE_SUFFIXES))


def leftovers(root: Path) -> list[Path]:
    """Temp files of unfinished writes: ours (``*.partial``) and torch's exporter's (``*.partial.tmp``)."""
    return sorted(p for p in root.rglob("*") if ".partial" in p.name)


def assert_traces_valid(root: Path) -> list[Path]:
    """Parse every final-named trace under ``root``: complete JSON with timed events, or the test fails."""
    paths = final_traces(root)
    for path in paths:
        data = path.read_bytes()
        if path.name.endswith(".gz"):
            data = gzip.decompress(data)
        doc = json.loads(data)
        assert any(e.get("ph") == "X" for e in doc["traceEvents"]), f"{path} has no timed events"
    return paths


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


def fill_disk(folder: Path, leave: int) -> Path:
    """Fill the file system holding ``folder`` until only ``leave`` bytes are free; returns the filler file."""
    stat = os.statvfs(folder)
    filler = folder / "filler"
    with open(filler, "wb") as f:
        f.write(b"\0" * max(stat.f_bavail * stat.f_frsize - leave, 0))
    return filler


def progress(line: str) -> dict[str, int]:
    """``step 7 recording=1 captures=2 traces=1`` -> ``{"step": 7, "recording": 1, "captures": 2, "traces": 1}``."""
    _, *rest = line.split()
    return {"step": int(rest[0]), **{k: int(v) for k, v in (item.split("=") for item in rest[1:])}}


class Child:
    """A subprocess running a helper script (loop.py by default) in its own process group; stdout read by line."""

    def __init__(self, logdir: Path, *args: str, script: str = "loop.py") -> None:
        self.stderr_path = logdir.parent / f"stderr-{time.monotonic_ns()}.txt"
        self._stderr = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(HELPERS / script), str(logdir), *args],
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.logdir = logdir
        self.lines: list[str] = []

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_for(self, predicate: Callable[[str], bool], timeout: float = 60.0) -> str:
        """Read stdout until a line satisfies ``predicate``; fail with the child's output if it never does."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line.rstrip("\n"))
            if predicate(self.lines[-1]):
                return self.lines[-1]
        pytest.fail(f"child never printed the awaited line; stdout tail {self.lines[-5:]}, stderr:\n{self.stderr()}")

    def wait_until(self, condition: Callable[[dict[str, int]], bool], timeout: float = 60.0) -> dict[str, int]:
        """Wait for a progress line (``step 7 recording=1 captures=2 traces=1``) whose numbers meet ``condition``."""
        line = self.wait_for(lambda text: text.startswith("step ") and condition(progress(text)), timeout)
        return progress(line)

    def finish(self, timeout: float = 60.0) -> int:
        """Wait for the exit (reading the rest of stdout) and return the exit status."""
        out, _ = self.proc.communicate(timeout=timeout)
        self.lines.extend(out.splitlines())
        return self.proc.returncode

    def stderr(self) -> str:
        self._stderr.flush()
        return self.stderr_path.read_text(errors="replace")

    def kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._stderr.close()


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
