"""``kprof tensorboard``: serve a logdir with TensorBoard on 127.0.0.1, and the server handle the tests reuse.

TensorBoard runs as a child in a process group of its own (torch-tb-profiler loads runs in worker processes),
so stopping it ends every process it started, also when the code using it fails half-way, and also when
``kprof tensorboard`` itself gets SIGTERM or SIGHUP (``timeout``, ``kill``, a closed terminal): it stops the group,
reaps TensorBoard, then dies of the same signal. A port already in use is found before TensorBoard starts.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from ..shell import module_command

HOST = "127.0.0.1"
DEFAULT_PORT = 6006
KPROF_TAB = "#kprof"
PROFILER_TAB = "#pytorch_profiler"
OFFLINE = "summary, step time, timeline; works offline"
ONLINE = "needs internet access: its charts load from www.gstatic.com"
_BIND_ERROR = "could not bind to port"  # TensorBoard's message when the port is taken
_PORT_RETRIES = 2  # a free port can be taken between choosing it and TensorBoard binding it
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1 never goes through a proxy

T = TypeVar("T")


class TensorBoardError(RuntimeError):
    """TensorBoard did not start or did not reach the state waited for; the message ends with its log."""


def free_port(host: str = HOST) -> int:
    """A TCP port that is free on ``host`` right now (chosen by the OS)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def check_port(port: int, host: str = HOST) -> None:
    """Raise TensorBoardError when ``port`` on ``host`` is taken: TensorBoard itself takes half a minute to say so.

    The probe binds as TensorBoard's server does (SO_REUSEADDR), so a port that only has connections closing
    (TIME_WAIT) counts as free, and one that another server listens on does not.
    """
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise TensorBoardError(f"{_BIND_ERROR} {port} on {host}: {exc.strerror or exc}") from None


def open_hint(logdir: str | os.PathLike, port: int = DEFAULT_PORT) -> str:
    """How to read the traces in ``logdir``: the command (as this shell runs it), then the kprof tab (offline) and
    the PyTorch Profiler tab."""
    from ..shell import typed_command

    url = f"http://{HOST}:{port}/"
    return (
        f"open the traces:  {typed_command()} tensorboard {shlex.quote(str(logdir))}\n"
        f"  kprof tab:             {url}{KPROF_TAB}   ({OFFLINE})\n"
        f"  PyTorch Profiler tab:  {url}{PROFILER_TAB}   ({ONLINE})"
    )


class TensorBoardServer:
    """TensorBoard on 127.0.0.1: ``with TensorBoardServer(logdir) as tb:`` answers HTTP inside the block, and
    its whole process group is gone after it, whatever happened inside.

    ``port=0`` picks a free port. ``startup_timeout`` bounds the wait for the first HTTP answer.
    """

    def __init__(self, logdir: str | os.PathLike, *, port: int = 0, startup_timeout: float = 60.0) -> None:
        self.logdir = Path(logdir)
        if not self.logdir.is_dir():
            raise ValueError(f"logdir must be an existing directory, got {str(logdir)!r}")
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
            raise ValueError(f"port must be an int in 0..65535 (0 picks a free one), got {port!r}")
        if startup_timeout <= 0:
            raise ValueError(f"startup_timeout must be > 0, got {startup_timeout!r}")
        self.requested_port = port
        self.port = port
        self.startup_timeout = startup_timeout
        self.pid: int | None = None  # also the process group id; kept after stop() so callers can check it is gone
        self._proc: subprocess.Popen | None = None
        self._log: Path | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/"

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def start(self) -> TensorBoardServer:
        """Start TensorBoard and wait until it answers; on any failure nothing is left running."""
        retries = _PORT_RETRIES if self.requested_port == 0 else 0
        if self.requested_port:
            check_port(self.requested_port)
        while True:
            self.port = self.requested_port or free_port()
            self._spawn()
            try:
                self._wait_ready()
                return self
            except BaseException as exc:
                self.stop()
                port_taken = isinstance(exc, TensorBoardError) and _BIND_ERROR in str(exc)
                if not (port_taken and retries):
                    raise
                retries -= 1

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL whatever is left after ``timeout`` seconds, reap TensorBoard."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        _signal_group(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout)
        _signal_group(proc.pid, signal.SIGKILL)  # loader processes TensorBoard left behind, or TensorBoard itself
        proc.wait()
        if self._log is not None:
            self._log.unlink(missing_ok=True)
            self._log = None

    def wait(self) -> int:
        """Block until TensorBoard exits on its own; returns its exit code."""
        if self._proc is None:
            raise RuntimeError("TensorBoardServer is not running; use it as a context manager or call start()")
        return self._proc.wait()

    def __enter__(self) -> TensorBoardServer:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # -- HTTP --------------------------------------------------------------------------------------------------
    def get_json(self, route: str, **params: str) -> Any:
        """GET ``route`` (e.g. ``data/plugin/pytorch_profiler/runs``) with query ``params``; the decoded JSON."""
        url = self.url + route.lstrip("/") + ("?" + urllib.parse.urlencode(params) if params else "")
        with _DIRECT.open(url, timeout=30) as response:
            body = response.read()
            if response.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
        return json.loads(body)

    def wait_for(self, probe: Callable[[], T], what: str, timeout: float = 60.0) -> T:
        """Call ``probe`` until it returns something truthy (HTTP errors count as "not yet"); bounded."""
        deadline = time.monotonic() + timeout
        last_error = ""
        while True:
            self._check_alive(what)
            try:
                value = probe()
                if value:
                    return value
            except (urllib.error.URLError, OSError, ValueError) as exc:
                last_error = f" (last error: {exc})"
            if time.monotonic() > deadline:
                raise TensorBoardError(f"TensorBoard at {self.url}: {what} not within {timeout:g} s{last_error}")
            time.sleep(0.25)

    def wait_for_profiler_runs(self, runs: Iterable[str], timeout: float = 60.0) -> list[str]:
        """Wait until torch-tb-profiler lists every run in ``runs`` and has no load in progress; all its runs."""
        wanted = set(runs)

        def loaded() -> list[str] | None:
            listing = self.get_json("data/plugin/pytorch_profiler/runs")
            done = wanted <= set(listing["runs"]) and not listing["loading"]
            return listing["runs"] if done else None

        return self.wait_for(loaded, f"PyTorch Profiler runs {sorted(wanted)} loaded", timeout)

    # -- internals ---------------------------------------------------------------------------------------------
    def _spawn(self) -> None:
        fd, log = tempfile.mkstemp(prefix="kprof-tensorboard-", suffix=".log")
        self._log = Path(log)
        try:
            with os.fdopen(fd, "wb") as out:
                self._proc = subprocess.Popen(
                    [*module_command("tensorboard.main"), "--logdir", str(self.logdir)]
                    + ["--host", HOST, "--port", str(self.port)],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # own process group: stop() reaches the loader processes too
                )
        except OSError:
            self._log.unlink(missing_ok=True)
            self._log = None
            raise
        self.pid = self._proc.pid

    def _wait_ready(self) -> None:
        def answers() -> bool:
            if _BIND_ERROR in self._log_tail():
                raise TensorBoardError(f"TensorBoard {_BIND_ERROR} {self.port}:\n{self._log_tail()}")
            return "logdir" in self.get_json("data/logdir")

        self.wait_for(answers, "first HTTP answer", self.startup_timeout)

    def _check_alive(self, what: str) -> None:
        if self._proc is None:
            raise TensorBoardError(f"TensorBoard is not running (waiting for: {what})")
        code = self._proc.poll()
        if code is not None:
            raise TensorBoardError(f"TensorBoard exited with code {code} (waiting for: {what}):\n{self._log_tail()}")

    def _log_tail(self, chars: int = 4000) -> str:
        try:
            return self._log.read_text(errors="replace")[-chars:] if self._log else ""
        except OSError:
            return ""


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


class _Stopped(BaseException):
    """SIGTERM or SIGHUP arrived: unwind (stopping TensorBoard on the way), then die of the same signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _stopped_by(*signums: signal.Signals):
    """Inside the block, each of ``signums`` raises _Stopped (where it still has Python's default action)."""

    def stop(signum, frame) -> None:
        for s in signums:  # a second signal must not cut the clean-up short
            signal.signal(s, signal.SIG_IGN)
        raise _Stopped(signum)

    previous = {s: signal.getsignal(s) for s in signums}
    for s, handler in previous.items():
        if handler == signal.SIG_DFL:
            signal.signal(s, stop)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def serve(logdir: str | Path, port: int = DEFAULT_PORT) -> int:
    """``kprof tensorboard``: run TensorBoard for ``logdir`` on 127.0.0.1 until Ctrl-C; returns the exit status.

    SIGTERM or SIGHUP stops TensorBoard and every process it started, then ends this process by the same signal.
    """
    try:
        server = TensorBoardServer(logdir, port=port)
    except ValueError as exc:
        print(f"kprof tensorboard: {exc} (write traces first, e.g. `kprof demo`)", file=sys.stderr)
        return 2
    try:
        with _stopped_by(signal.SIGTERM, signal.SIGHUP), server:
            print(f"TensorBoard for {server.logdir}: {server.url}", flush=True)
            print(f"kprof tab:             {server.url}{KPROF_TAB}   ({OFFLINE})", flush=True)
            print(f"PyTorch Profiler tab:  {server.url}{PROFILER_TAB}   ({ONLINE})", flush=True)
            print("Ctrl-C to stop", flush=True)
            return server.wait()
    except TensorBoardError as exc:
        if _BIND_ERROR in str(exc):
            print(
                f"kprof tensorboard: port {server.port} on {HOST} is in use (another TensorBoard?): "
                "stop that server, or pick another port (--port 0 picks a free one)",
                file=sys.stderr,
            )
        else:
            print(f"kprof tensorboard: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    except _Stopped as stopped:  # TensorBoard's group is stopped and reaped by now
        sys.stdout.flush()
        signal.signal(stopped.signum, signal.SIG_DFL)
        os.kill(os.getpid(), stopped.signum)
        raise SystemExit(128 + stopped.signum) from None  # only if the signal is blocked
