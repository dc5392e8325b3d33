"""The worker processes that read traces: nothing hangs, a dead worker's task is tried again, and no worker imports
from the current folder."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from kprof_callbacks import shell
from kprof_callbacks.analysis import workers as workers_module
from kprof_callbacks.analysis.workers import WorkerError, Workers

pytestmark = pytest.mark.timeout(120)  # a hang shows as a failure, not a stuck suite
WAIT = 60  # seconds a result may take at most on a loaded machine before the test calls it a hang


def _dies_once(marker: Path) -> str:
    """An expression for ``eval`` in a worker: ends the worker the first time, then answers 7."""
    m = str(marker)
    return f"7 if __import__('os').path.exists({m!r}) else open({m!r}, 'w').close() or __import__('os')._exit(3)"


def test_a_task_whose_worker_died_is_tried_once_more_then_fails(tmp_path):
    with Workers(2) as workers:  # one worker; .result() leaves every task to it
        assert workers.submit(eval, _dies_once(tmp_path / "died")).result(timeout=WAIT) == 7
        with pytest.raises(WorkerError, match=r"ended \(exit status 3\) while running _exit, on each of 2 tries"):
            workers.submit(os._exit, 3).result(timeout=WAIT)
        assert workers.submit(len, "abc").result(timeout=WAIT) == 3


@pytest.mark.parametrize("error", [MemoryError(), EOFError("the other end closed the pipe")])
def test_an_answer_that_cannot_be_read_fails_the_task_and_never_hangs(monkeypatch, error):
    """A MemoryError while reading an answer (an address-space limit, `ulimit -v`) killed the feeder thread, and
    its futures were never completed: `kprof summary --jobs N` hung."""

    def unreadable(pipe):
        raise error

    monkeypatch.setattr(workers_module, "_receive", unreadable)
    with Workers(2) as workers:
        with pytest.raises(WorkerError, match=f"on each of 2 tries \\({type(error).__name__}"):
            workers.submit(len, "abc").result(timeout=WAIT)


def test_a_worker_that_cannot_be_replaced_fails_its_tasks_and_the_caller_runs_the_rest(monkeypatch, tmp_path):
    """No process can start any more (out of memory, a process limit): the tasks the feeder held fail, never hang,
    and the tasks still queued run in the caller."""
    with Workers(2) as workers:
        assert workers.submit(os.getpid).result(timeout=WAIT) != os.getpid()  # the worker is up

        def no_more(*args, **kwargs):
            raise OSError(12, "Cannot allocate memory")

        monkeypatch.setattr(workers_module.subprocess, "Popen", no_more)
        with pytest.raises(WorkerError, match="Cannot allocate memory"):
            workers.submit(os._exit, 3).result(timeout=WAIT)
        later = [workers.submit(pow, 2, k) for k in range(4)]
        workers.wait(later)
        assert [f.result() for f in later] == [1, 2, 4, 8]


def test_when_no_thread_can_start_the_caller_does_the_work(monkeypatch):
    """`RuntimeError: can't start new thread` (a limit on threads) was a traceback: the caller reads alone."""

    def refused(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refused)
    with Workers(4) as workers:
        tasks = [workers.submit(os.getpid) for _ in range(3)]
        workers.wait(tasks)
    assert {f.result() for f in tasks} == {os.getpid()}


@pytest.mark.parametrize("safe_path", [True, False], ids=["-P", "-I"])
def test_workers_never_import_from_the_current_folder(tmp_path, monkeypatch, safe_path):
    """A `logging.py` or `tokenize.py` in the user's folder ran in every worker (and failed the summary)."""
    _shadowing_modules(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(shell, "_SAFE_PATH", safe_path)
    with Workers(2) as workers:
        assert workers.submit(os.getpid).result(timeout=WAIT) != os.getpid()
        assert workers.submit(eval, "__import__('logging').__file__").result(timeout=WAIT) != str(
            tmp_path / "logging.py"
        )
    assert not list(tmp_path.glob("*.ran"))


def _shadowing_modules(folder: Path) -> None:
    """A `logging.py` and a `tokenize.py` that leave a `*.ran` file and end the process that imports them."""
    for name in ("logging", "tokenize"):
        (folder / f"{name}.py").write_text(f"open({str(folder / name)!r} + '.ran', 'w').close()\nraise SystemExit\n")


def test_kprof_tensorboard_never_imports_from_the_current_folder(tmp_path, monkeypatch, group_leftovers):
    """TensorBoard ran with the current folder first on sys.path: a project's `logging.py` stopped it."""
    from kprof_callbacks.tensorboard.launch import TensorBoardServer

    (tmp_path / "log").mkdir()
    _shadowing_modules(tmp_path)
    monkeypatch.chdir(tmp_path)
    with TensorBoardServer(tmp_path / "log") as server:
        assert server.get_json("data/logdir")["logdir"] == str(tmp_path / "log")
    assert not list(tmp_path.glob("*.ran")) and not group_leftovers(server.pid)


def test_a_worker_whose_caller_was_killed_ends_without_a_traceback(tmp_path):
    """The caller gets SIGKILL while a worker runs a task: the worker's answer meets a closed pipe, and it ends
    quietly (it printed a BrokenPipeError traceback on the terminal)."""
    (tmp_path / "waits.py").write_text(
        textwrap.dedent(
            """
            import os, time

            def until_orphaned(parent: int, started: str) -> str:
                open(started, "w").close()
                while os.getppid() == parent:
                    time.sleep(0.01)
                return "x" * 100
            """
        )
    )
    caller = textwrap.dedent(
        """
        import os, signal, time
        from kprof_callbacks.analysis.workers import Workers
        from waits import until_orphaned

        workers = Workers(2)
        pid = workers.submit(os.getpid).result(timeout=60)
        workers.submit(until_orphaned, os.getpid(), "started")
        while not os.path.exists("started"):  # the worker runs it
            time.sleep(0.01)
        print(pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", caller],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(tmp_path), os.environ.get("PYTHONPATH"))))},
        capture_output=True,
        text=True,
        timeout=WAIT,
    )  # returns once the worker, which holds the caller's stderr too, has ended
    assert done.returncode == -9 and done.stdout.strip().isdigit()
    assert done.stderr == ""


def test_the_tab_keeps_no_summary_that_a_dead_worker_spoiled(tmp_path, monkeypatch):
    """A file whose worker died (twice) is a problem of that request only: the tab kept "nothing readable" until the
    run's files changed."""
    from concurrent.futures import Future

    from tensorboard.plugins import base_plugin
    from test_diff import write_trace
    from werkzeug.test import Client
    from werkzeug.wrappers import Response

    from kprof_callbacks.analysis import reading
    from kprof_callbacks.tensorboard import plugin as plugin_module

    (tmp_path / "log" / "run").mkdir(parents=True)
    write_trace(tmp_path / "log" / "run" / "w.1.pt.trace.json", [{"aten::mm": 10.0}] * 4)
    monkeypatch.setattr(reading, "_POOL_BYTES", 0)  # worker processes read even this small run
    monkeypatch.setattr(reading, "_JOB_BYTES", 1)
    monkeypatch.setattr(plugin_module, "default_jobs", lambda: 2)
    deaths = [WorkerError("a worker process ended (exit status -9) while running decode, on each of 2 tries")]

    class Dying(Workers):
        def submit(self, fn, *args):
            if not deaths:
                return super().submit(fn, *args)
            future: Future = Future()
            future.set_exception(deaths.pop())
            return future

    monkeypatch.setattr(reading, "Workers", Dying)
    routes = plugin_module.KprofPlugin(base_plugin.TBContext(logdir=str(tmp_path / "log"), data_provider=None))
    summary = Client(routes.get_plugin_apps()["/summary"], Response)
    first = summary.get("/summary", query_string={"run": "run"}).get_json()
    assert "nothing readable in run" in first["error"] and "exit status -9" in first["error"]
    again = summary.get("/summary", query_string={"run": "run"}).get_json()
    assert again["error"] is None and again["summary"]["name"] == "run"
