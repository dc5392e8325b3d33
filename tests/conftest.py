"""Shared fixtures. Append new ones in their own section; keep each small and specific."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

# --- Triton (tests/test_kernels_triton.py) ---------------------------------------------------------------------------
# Without a GPU the Triton kernels run in Triton's interpreter, on CPU tensors. triton.jit reads TRITON_INTERPRET when
# a kernel is defined, i.e. when kprof first loads its Triton kernels, so it is set here, before any test module runs
# (child processes inherit it). On a GPU machine it stays unset: the kernels are compiled and run on the GPU.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# --- Signals (tests/faults/test_interrupt_faults.py, tests/test_tensorboard.py) -------------------------------------
# A shell starts a background job (`make test &`, nohup) with SIGINT (and SIGHUP) ignored, and an ignored signal stays
# ignored across exec: the children these tests interrupt would never see their Ctrl-C. Restore what a foreground run
# has; a handler, unlike SIG_IGN, is reset to the default in every child.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)

# --- TensorBoard (tests/test_tensorboard.py, tests/test_browser.py) ----------------------------------------------


@dataclass
class ProfiledLogdir:
    """A logdir with two real runs: ``run`` profiled in this process, ``demo_run`` written by ``kprof demo``."""

    logdir: Path
    run: str
    worker: str
    steps: int
    captures: list  # Session.captures: first_step/last_step of each trace, in the order written
    step_times: list[float]
    batch: int
    demo_run: str
    demo_traces: int


def _profile_tiny_model(logdir: Path, run: str, steps: int, batch: int):
    """Train a tiny MLP for ``steps`` steps under kprof.session with shapes and memory recorded."""
    import torch

    import kprof_callbacks as kprof

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # a GPU machine's traces hold kernels (the Kernel view)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with kprof.session(
        logdir, run=run, wait=1, warmup=1, active=2, repeat=2, record_shapes=True, profile_memory=True
    ) as s:
        for _ in range(steps):
            with s.region("forward"):
                loss = model(torch.randn(batch, 32, device=device)).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            s.step(samples=batch)
    return s


@pytest.fixture(scope="session")
def profiled_logdir(tmp_path_factory) -> ProfiledLogdir:
    """Both runs are complete before any TensorBoard sees the logdir (torch-tb-profiler loads a run once)."""
    from kprof_callbacks.layout import worker_name

    logdir = tmp_path_factory.mktemp("tb-logdir")
    demo = subprocess.Popen(  # the README's demo command, in parallel with the in-process run
        [sys.executable, "-m", "kprof_callbacks", "demo", "--logdir", str(logdir), "--steps", "30"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        s = _profile_tiny_model(logdir, run="tiny-mlp", steps=12, batch=16)
        out, _ = demo.communicate(timeout=600)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert demo.returncode == 0, f"kprof demo failed:\n{out[-3000:]}"
    (demo_dir,) = [p for p in logdir.iterdir() if p.name.startswith("demo-")]
    return ProfiledLogdir(
        logdir=logdir,
        run="tiny-mlp",
        worker=worker_name(),
        steps=s.steps,
        captures=list(s.captures),
        step_times=s.step_times,
        batch=16,
        demo_run=demo_dir.name,
        demo_traces=len(list(demo_dir.glob("*.pt.trace.json*"))),
    )


@pytest.fixture(scope="session")
def group_leftovers():
    """``group_leftovers(pgid)``: processes of group ``pgid`` still alive (not zombies) after a short grace period.

    The grace period lets processes that were just sent SIGKILL finish dying; anything left after it leaked.
    """
    psutil = pytest.importorskip("psutil")

    def in_group_and_alive(proc, pgid: int) -> bool:
        try:
            return os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE
        except (ProcessLookupError, psutil.Error):
            return False

    def leftovers(pgid: int, grace: float = 5.0) -> list:
        deadline = time.monotonic() + grace
        while True:
            found = [proc for proc in psutil.process_iter() if in_group_and_alive(proc, pgid)]
            if not found or time.monotonic() > deadline:
                return found
            time.sleep(0.1)

    return leftovers


@pytest.fixture(scope="session")
def tensorboard(profiled_logdir, group_leftovers):
    """One real TensorBoard (with torch-tb-profiler) over ``profiled_logdir``, shared by the TensorBoard tests."""
    from kprof_callbacks.tensorboard.launch import TensorBoardServer

    with TensorBoardServer(profiled_logdir.logdir) as tb:
        tb.wait_for_profiler_runs([profiled_logdir.run, profiled_logdir.demo_run], timeout=90)
        yield tb
    assert not group_leftovers(tb.pid), "TensorBoard left processes behind"


# --- headless Chromium (Debian's `chromium`; .ci/run installs it) ------------------------------------------------

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",  # only local servers: same result offline or not
    "--window-size=1400,900",
    "--virtual-time-budget=15000",  # virtual ms for the page's timers (TensorBoard plugins poll every few s)
)


@pytest.fixture
def chromium(tmp_path, group_leftovers):
    """``chromium(url, *args)``: one headless Chromium run on ``url`` (e.g. ``--dump-dom``, ``--screenshot=PATH``),
    in a process group of its own that is checked empty and killed after; returns its stdout."""
    binary = shutil.which("chromium")
    if binary is None:
        pytest.skip("headless Chromium not found: `apt-get install chromium` (Debian package; .ci/run installs it)")
    runs = 0

    def run(url: str, *args: str, timeout: float = 120) -> str:
        nonlocal runs
        runs += 1
        profile = tmp_path / f"chromium-profile-{runs}"
        cmd = [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, url]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            pytest.fail(f"chromium did not exit within {timeout} s on {url}")
        leaked = group_leftovers(proc.pid)
        if leaked:
            os.killpg(proc.pid, signal.SIGKILL)
        assert proc.returncode == 0, f"chromium exited with {proc.returncode} on {url}: {err[-3000:]}"
        assert not leaked, f"Chromium left processes behind: {leaked}"
        return out

    return run


# --- timing on a shared machine (tests/test_compare.py, tests/test_profiler_cost.py) --------------------------------


@pytest.fixture
def one_thread():
    """One intra-op thread: on a loaded 2-core machine, OpenMP's spinning threads stretch a 3 ms step to 200 ms."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
