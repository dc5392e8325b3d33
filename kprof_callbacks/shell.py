"""How kprof names itself in the commands it prints (``open the traces: kprof tensorboard log``), as the user's shell
would run this installation, and how it starts a module of its own in a fresh interpreter (workers, TensorBoard)."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

_SAFE_PATH = sys.version_info >= (3, 11)  # python -P: no current folder on sys.path


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


def module_command(module: str) -> list[str]:
    """The command running ``module`` as a script in a fresh interpreter that never imports from the current folder
    (a ``logging.py`` of the user's project would run in it): ``python -P -m``, which keeps ``PYTHONPATH``; before
    3.11, ``python -I``, which ignores it, with this process's ``sys.path`` set by the command."""
    if _SAFE_PATH:
        return [sys.executable, "-P", "-m", module]
    path = [p for p in sys.path if p]
    run = f"import runpy, sys; sys.path[:0] = {path!r}; runpy.run_module({module!r}, run_name='__main__')"
    return [sys.executable, "-I", "-c", run]
