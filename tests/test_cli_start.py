"""The kprof command as a new user meets it: the commands the demo prints run as typed, also when the venv holding
kprof is not activated, and reading traces (the CLI, summarize, diff, the TensorBoard tab) starts without torch."""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

VENV_BIN = str(Path(sys.executable).parent)
FIXTURES = Path(__file__).parent / "fixtures"


def _env_without_venv_on_path() -> dict[str, str]:
    """The environment ``make demo`` leaves a shell in: the venv's bin folder is not on PATH."""
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != VENV_BIN)
    return {**os.environ, "PATH": path, "PYTHONUNBUFFERED": "1"}


def _printed_commands(stdout: str) -> dict[str, str]:
    """The demo's closing hints, ``{"open the traces": command, "summary again": command}``, notes cut off."""
    hints = {}
    for line in stdout.splitlines():
        label, _, rest = line.partition(":")
        if label in ("open the traces", "summary again"):
            hints[label] = rest.split("   (")[0].strip()
    return hints


def _read_until(proc: subprocess.Popen, marker: str, timeout: float) -> str:
    """What ``proc`` wrote to stdout until ``marker`` appeared (or until it exited, or ``timeout``)."""
    out, deadline = b"", time.monotonic() + timeout
    while marker.encode() not in out and time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            out += chunk
    return out.decode(errors="replace")


@pytest.mark.slow
def test_demo_hints_run_as_typed_without_the_venv_on_path(tmp_path: Path, group_leftovers) -> None:
    """``make demo`` runs the demo through .venv/bin/python; the shell it returns to has no .venv/bin on PATH, so
    the printed commands must name the kprof that exists (here ``.venv/bin/kprof`` by its path)."""
    env = _env_without_venv_on_path()
    demo = subprocess.run(
        [sys.executable, "-m", "kprof_callbacks", "demo", "--steps", "24"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert demo.returncode == 0, demo.stderr[-3000:]
    hints = _printed_commands(demo.stdout)
    assert set(hints) == {"open the traces", "summary again"}, demo.stdout[-2000:]

    summary = subprocess.run(
        ["bash", "-c", hints["summary again"]], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert summary.returncode == 0, summary.stderr[-3000:]
    assert "Steps: 10 profiled" in summary.stdout
    assert re.search(r"Top modules by [CG]PU time", summary.stdout)  # the demo trains on a GPU where there is one
    assert "blocks.*.down (4)" in summary.stdout  # the ToyModel's

    # `--port 0`: the same command on a free port (a shared machine may already serve 6006)
    server = subprocess.Popen(
        ["bash", "-c", f"exec {hints['open the traces']} --port 0"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out = _read_until(server, "kprof tab:", timeout=180)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
    assert "kprof tab:" in out and "http://127.0.0.1:" in out, out[-3000:]
    assert not group_leftovers(server.pid), "kprof tensorboard left processes behind"


# What reading traces runs, in a fresh interpreter: the CLI (help, summary as text, JSON and HTML, diff), the API's
# summarize and diff, and the TensorBoard tab's handlers; then the heavy packages it imported, which must be none.
READ_WITHOUT_TORCH = """
import contextlib, io, sys
from pathlib import Path
run, out = Path(sys.argv[1]), Path(sys.argv[2])
from kprof_callbacks.cli import main
with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):
    main(["--help"])
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    assert main(["summary", str(run)]) == 0
    assert main(["summary", str(run.parent), "--json", "--html", str(out / "s.html")]) == 0
    assert main(["diff", str(run), f"{run}@steps=2-3", "--html", str(out / "d.html")]) == 0
saved = io.StringIO()
with contextlib.redirect_stdout(saved):
    assert main(["summary", str(run), "--json"]) == 0
(out / "base.json").write_text(saved.getvalue())
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    assert main(["summary", str(out / "base.json"), "--markdown"]) == 0
    assert main(["diff", str(out / "base.json"), str(run), "--markdown", "--fail-if-slower", "5"]) == 1  # 3 steps

import kprof_callbacks as kprof
assert kprof.diff(kprof.summarize(run), run).to_dict()
assert kprof.summarize(run)._repr_html_() and kprof.diff(out / "base.json", run)._repr_html_()

from tensorboard.plugins import base_plugin
from werkzeug.test import Client
from werkzeug.wrappers import Response
from kprof_callbacks.tensorboard.plugin import KprofPlugin
plugin = KprofPlugin(base_plugin.TBContext(logdir=str(run.parent), data_provider=None))
routes = plugin.get_plugin_apps()
trace = next(run.iterdir()).name
for route, query in [("/runs", ""), ("/summary", "run=gpu"), ("/timeline", f"run=gpu&file={trace}"),
                     ("/diff", "run=gpu&a=gpu&b=gpu&b_steps=2")]:
    response = Client(routes[route], Response).get(route, query_string=query)
    assert response.status_code == 200, (route, response.status_code, response.get_data()[:300])
heavy = {"torch", "lightning", "pytorch_lightning", "triton", "sympy", "kprof_callbacks.kernels"}
print(sorted({top for name in sys.modules for top in (name.split(".")[0], ".".join(name.split(".")[:2]))} & heavy))
"""


def test_reading_traces_never_imports_torch(tmp_path: Path) -> None:
    """The CLI and the analysis path start in a fraction of a second: none of them imports torch, Lightning or the
    kernels (benchmarks/cold_start.py times them)."""
    run = tmp_path / "log" / "gpu"
    run.mkdir(parents=True)
    shutil.copy(FIXTURES / "gpu_small.pt.trace.json.gz", run / "gpuhost_1.1795000000000000000.pt.trace.json.gz")
    result = subprocess.run(
        [sys.executable, "-c", READ_WITHOUT_TORCH, str(run), str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]", f"imported while reading traces: {result.stdout}"
