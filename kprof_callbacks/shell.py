"""How kprof names itself in the commands it prints (``open the traces: kprof tensorboard log``): as the user's shell
would run this installation."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path


def typed_command() -> str:
    """The kprof command as the user's shell runs it: ``kprof`` where PATH finds this installation's, else the script
    beside this Python (e.g. ``.venv/bin/kprof`` when the venv is not activated), else ``python -m kprof_callbacks``
    through this Python."""
    script = Path(sys.executable).parent / "kprof"
    found = shutil.which("kprof")
    if found and script.is_file() and Path(found).resolve() == script.resolve():
        return "kprof"
    if script.is_file():
        return shlex.quote(_as_typed(script))
    return f"{shlex.quote(_as_typed(Path(sys.executable)))} -m kprof_callbacks"


def _as_typed(path: Path) -> str:
    """``path`` relative to the working folder when it lies inside it (``.venv/bin/kprof``), else absolute; never a
    bare name, which the shell would look up on PATH."""
    relative = os.path.relpath(path.absolute())
    if relative.startswith(".."):
        return str(path.absolute())
    return relative if os.sep in relative else f".{os.sep}{relative}"
