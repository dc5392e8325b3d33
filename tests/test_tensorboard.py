"""Real TensorBoard + torch-tb-profiler over real kprof traces, checked through their HTTP APIs.

The shared ``tensorboard`` fixture (conftest.py) serves a logdir holding a run profiled here (shapes and memory
recorded, two windows) and the README demo's run; the server tests below start their own short-lived ones.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch

from kprof_callbacks import cli
from kprof_callbacks.tensorboard.launch import HOST, OFFLINE, TensorBoardError, TensorBoardServer, serve

PROFILER = "data/plugin/pytorch_profiler/"
OFFLINE_NOTE = f"({OFFLINE})".split()


def test_profiler_lists_run_with_expected_views(tensorboard, profiled_logdir):
    runs = tensorboard.get_json(PROFILER + "runs")["runs"]
    assert profiled_logdir.run in runs
    views = tensorboard.get_json(PROFILER + "views", run=profiled_logdir.run)
    assert {"Overview", "Operator", "Trace", "Memory"} <= set(views)
    assert ("Kernel" in views) == torch.cuda.is_available()  # the Kernel view exists only for GPU traces
    workers = tensorboard.get_json(PROFILER + "workers", run=profiled_logdir.run, view="Overview")
    assert workers == [profiled_logdir.worker]


def _overview_steps(tb, run: str, worker: str, span: str) -> list[str]:
    overview = tb.get_json(PROFILER + "overview", run=run, worker=worker, span=span)
    return list(dict.fromkeys(row[0] for row in overview["steps"]["rows"]))  # a GPU trace lists each step twice


def test_overview_steps_are_the_session_steps(tensorboard, profiled_logdir):
    run, worker = profiled_logdir.run, profiled_logdir.worker
    spans = tensorboard.get_json(PROFILER + "spans", run=run, worker=worker)
    assert len(spans) == len(profiled_logdir.captures) == 2  # one span per trace file (repeat=2)
    shown = [_overview_steps(tensorboard, run, worker, span) for span in spans]
    expected = [[str(n) for n in range(c.first_step, c.last_step + 1)] for c in profiled_logdir.captures]
    assert shown == expected


def test_operator_trace_and_memory_views_serve_the_run(tensorboard, profiled_logdir):
    first = dict(run=profiled_logdir.run, worker=profiled_logdir.worker, span="1")
    ops = tensorboard.get_json(PROFILER + "operation", group_by="Operation", **first)
    op_names = {row[0] for row in ops["host_total_time"]["rows"]}
    assert "aten::addmm" in op_names  # nn.Linear's forward

    trace = tensorboard.get_json(PROFILER + "trace", **first)  # gzip-encoded, decoded by get_json
    steps = {e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")}
    capture = profiled_logdir.captures[0]
    assert steps == {f"ProfilerStep#{n}" for n in range(capture.first_step, capture.last_step + 1)}
    assert "forward" in {e.get("name") for e in trace["traceEvents"]}  # Session.region label

    memory = tensorboard.get_json(PROFILER + "memory", **first)
    device = "GPU0" if torch.cuda.is_available() else "CPU"  # the fixture trains on the GPU where there is one
    assert memory["metadata"]["default_device"] == device
    assert memory["rows"][device], "profile_memory=True should give per-operator memory rows"


def test_scalars_tab_has_step_time_for_every_step(tensorboard, profiled_logdir):
    run = profiled_logdir.run
    assert tensorboard.get_json("data/plugins_listing")["scalars"]["enabled"]

    def points(tag: str) -> list | None:
        values = tensorboard.get_json("data/plugin/scalars/scalars", run=run, tag=tag)
        return values if len(values) == profiled_logdir.steps else None

    step_ms = tensorboard.wait_for(lambda: points("kprof/step_time_ms"), "step-time scalars", timeout=30)
    assert [step for _, step, _ in step_ms] == list(
        range(profiled_logdir.steps)
    )  # the whole run, 0-based like ProfilerStep#N
    expected_ms = [t * 1e3 for t in profiled_logdir.step_times]
    assert [value for _, _, value in step_ms] == pytest.approx(expected_ms, rel=1e-5)

    throughput = tensorboard.wait_for(lambda: points("kprof/throughput_samples_per_s"), "throughput", timeout=30)
    expected_tput = [profiled_logdir.batch / t for t in profiled_logdir.step_times]
    assert [value for _, _, value in throughput] == pytest.approx(expected_tput, rel=1e-5)


def test_readme_demo_trace_loads_in_torch_tb_profiler(tensorboard, profiled_logdir):
    run = profiled_logdir.demo_run
    assert run in tensorboard.get_json(PROFILER + "runs")["runs"]
    assert {"Overview", "Operator", "Trace"} <= set(tensorboard.get_json(PROFILER + "views", run=run))
    (worker,) = tensorboard.get_json(PROFILER + "workers", run=run, view="Overview")
    spans = tensorboard.get_json(PROFILER + "spans", run=run, worker=worker)
    assert len(spans) == profiled_logdir.demo_traces == 2  # the demo records two windows
    assert all(_overview_steps(tensorboard, run, worker, span) for span in spans)


# -- the server handle itself -------------------------------------------------------------------------------------


def test_server_leaves_no_process_when_the_block_fails(tmp_path, group_leftovers):
    server = TensorBoardServer(tmp_path)
    with pytest.raises(RuntimeError, match="the test body failed"), server:
        assert server.get_json("data/logdir")["logdir"] == str(tmp_path)
        assert group_leftovers(server.pid)
        raise RuntimeError("the test body failed")
    assert not group_leftovers(server.pid)


@pytest.fixture
def taken_port():
    """A port on 127.0.0.1 that another server listens on."""
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        yield taken.getsockname()[1]


def test_busy_port_is_a_clear_error_with_nothing_left_running(tmp_path, group_leftovers, taken_port):
    server = TensorBoardServer(tmp_path, port=taken_port)
    with pytest.raises(TensorBoardError, match=f"could not bind to port {taken_port}"):
        server.start()
    assert not group_leftovers(server.pid)


def test_readiness_wait_is_bounded(tmp_path, group_leftovers):
    server = TensorBoardServer(tmp_path, startup_timeout=0.2)  # far less than TensorBoard needs to import
    started = time.monotonic()
    with pytest.raises(TensorBoardError, match="first HTTP answer not within"):
        server.start()
    assert time.monotonic() - started < 15
    assert not group_leftovers(server.pid)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(logdir="no-such-dir"), "logdir must be an existing directory"),
        (dict(port=70000), "port must be an int"),
        (dict(port="6006"), "port must be an int"),
        (dict(startup_timeout=0), "startup_timeout must be > 0"),
    ],
)
def test_bad_arguments_are_rejected_before_starting(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        TensorBoardServer(**{"logdir": tmp_path, **kwargs})


# -- `kprof tensorboard` ------------------------------------------------------------------------------------------


def test_cli_serves_logdir_on_localhost_and_stops_on_ctrl_c(tmp_path, group_leftovers):
    psutil = pytest.importorskip("psutil")
    proc, first = _start_cli(tmp_path, "--port", "0")  # the first line comes once TensorBoard answers
    try:
        assert first.startswith(f"TensorBoard for {tmp_path}: http://{HOST}:"), first
        url = first.split(": ", 1)[1].strip()
        assert proc.stdout.readline().split() == ["kprof", "tab:", f"{url}#kprof", *OFFLINE_NOTE]
        profiler_line = proc.stdout.readline()
        assert f"{url}#pytorch_profiler" in profiler_line and "needs internet access" in profiler_line
        with urllib.request.urlopen(url + "data/logdir", timeout=30) as response:
            assert response.status == 200
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children, "TensorBoard should run as a child of `kprof tensorboard`"
        os.kill(proc.pid, signal.SIGINT)  # what Ctrl-C sends
        assert proc.wait(timeout=30) == 0
        assert not [c for c in children if _alive(c, psutil)]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert not group_leftovers(proc.pid)


def _start_cli(logdir, *args: str) -> tuple[subprocess.Popen, str]:
    """`kprof tensorboard LOGDIR ARGS` in a session of its own, once it printed its URL."""
    cmd = [sys.executable, "-m", "kprof_callbacks", "tensorboard", str(logdir), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return proc, proc.stdout.readline()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_cli_stopped_by_sigterm_or_sighup_stops_tensorboard_and_dies_of_the_signal(tmp_path, sig, group_leftovers):
    psutil = pytest.importorskip("psutil")
    proc, first = _start_cli(tmp_path, "--port", "0")
    children = []
    try:
        assert first.startswith("TensorBoard for"), first
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children, "TensorBoard should run as a child of `kprof tensorboard`"
        os.kill(proc.pid, sig)  # the CLI alone, as `timeout`, `kill` or a closed terminal does
        assert proc.wait(timeout=30) == -sig
        assert not [c for c in children if _alive(c, psutil)], "TensorBoard outlived `kprof tensorboard`"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for child in children:  # what a failing run left behind
            with contextlib.suppress(psutil.Error):
                child.kill()
    assert not group_leftovers(proc.pid)


def test_busy_port_fails_within_2_s_with_one_line(tmp_path, capsys, taken_port):
    started = time.monotonic()
    assert serve(tmp_path, taken_port) == 1
    assert time.monotonic() - started < 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"port {taken_port} on {HOST} is in use" in err and "--port 0" in err


def test_busy_port_from_the_command_line_is_one_line(tmp_path, taken_port):
    done = subprocess.run(
        [sys.executable, "-m", "kprof_callbacks", "tensorboard", str(tmp_path), "--port", str(taken_port)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines() == [done.stderr.strip()] and "is in use" in done.stderr


def _alive(process, psutil) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_cli_rejects_missing_logdir(tmp_path, capsys):
    assert cli.main(["tensorboard", str(tmp_path / "missing")]) == 2
    assert "logdir must be an existing directory" in capsys.readouterr().err
