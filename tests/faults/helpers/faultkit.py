"""Plain helpers of the fault suite (no fixtures): trace checks, a disk filler, helper subprocesses."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

HELPERS = Path(__file__).parent
TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")


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
