"""The provenance at the top of a result of record: the commit measured, date, device, versions and command.

benchmarks/tables.py refuses a results file without them; every benchmark that writes one starts it here.
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def commit() -> str | None:
    """The full hash of the checkout's HEAD, or None outside a git checkout; ``KPROF_COMMIT`` when set, for a copy of
    the tree whose ``.git`` is not its own (a machine that receives the working tree but an older repository)."""
    if os.environ.get("KPROF_COMMIT"):
        return os.environ["KPROF_COMMIT"]
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT, timeout=10)
    except OSError:
        return None
    return done.stdout.strip() or None


def command(script: str, argv: list[str] | None) -> str:
    """``python benchmarks/SCRIPT ARGS``: how to run it again (``argv`` None: this process's arguments)."""
    return shlex.join(["python", f"benchmarks/{script}", *(sys.argv[1:] if argv is None else argv)])


def header(device: str, run: str, **versions: str | None) -> dict:
    """The provenance keys, in tables.py's order; ``versions`` adds to torch, CUDA and Python."""
    try:
        import torch

        found = {"torch": torch.__version__, "cuda": torch.version.cuda}
    except ImportError:
        found = {}
    return {
        "commit": commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "versions": {**found, "python": platform.python_version(), **versions},
        "command": run,
    }
