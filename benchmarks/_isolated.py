"""One measurement per fresh process, cheaply, on the same CPU cores every time.

A profiler leaves process-wide state behind (kineto keeps CUPTI attached after a CUDA trace unless
TEARDOWN_CUPTI=1), so a benchmark that measures "no profiler" after a profiled variant in the same process does
not measure "no profiler". Starting a Python process per measurement costs seconds of imports, though, which
limits how many interleaved rounds fit in a run. Here a forkserver imports the heavy modules once (it never
touches CUDA); each call forks a child from it that sets its environment, pins itself to the same few cores
(a host-bound step is as fast as the core it lands on; torch gets one thread per core), runs one function, sends
back its result and exits.

    measure = Isolated(preload=("torch",))
    result = measure(fn, *args, env={"TEARDOWN_CUPTI": "0"}, **kwargs)   # fn: a module-level function
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator

CORES = 4  # enough for the training thread plus the profiler's and the writer's threads


def _child(conn, env: dict[str, str], cores: list[int], fn: Callable, args: tuple, kwargs: dict) -> None:
    os.environ.update(env)  # before the function's first CUDA call: kineto reads TEARDOWN_CUPTI then
    if cores:
        os.sched_setaffinity(0, cores)
        torch = sys.modules.get("torch")
        if torch is not None:  # its CPU thread pool is sized for the whole machine; 16 threads spinning on 4 cores
            torch.set_num_threads(len(cores))  # ran a 1.7 ms step in 512 ms on the 16-core H100 host
    try:
        conn.send((True, fn(*args, **kwargs)))
    except BaseException as exc:  # the caller re-raises it
        conn.send((False, exc))


class Isolated:
    """Calls a function in a fresh child process of a forkserver that has ``preload`` imported."""

    def __init__(self, preload: tuple[str, ...] = ("torch",), cores: int = CORES, timeout: float = 300) -> None:
        self._ctx = multiprocessing.get_context("forkserver")
        self._ctx.set_forkserver_preload(list(preload))
        self.cores = sorted(os.sched_getaffinity(0))[:cores] if hasattr(os, "sched_getaffinity") else []
        self.timeout = timeout

    def __call__(self, fn: Callable, *args, env: dict[str, str] | None = None, **kwargs):
        receive, send = self._ctx.Pipe(duplex=False)
        child = self._ctx.Process(target=_child, args=(send, env or {}, self.cores, fn, args, kwargs), daemon=True)
        child.start()
        send.close()
        answered = receive.poll(self.timeout)
        try:
            if not answered:
                raise TimeoutError(f"{fn.__qualname__}{args} did not finish within {self.timeout:.0f} s")
            ok, value = receive.recv()
        except EOFError:  # died without a word: a crash
            child.join()
            raise RuntimeError(f"{fn.__qualname__}{args} died with exit code {child.exitcode}") from None
        finally:
            receive.close()
            child.join(5 if answered else 0)  # one that answered is exiting; one that timed out is killed
            if child.is_alive():
                child.kill()
                child.join()
        if not ok:
            raise value
        return value


def rounds(count: int, seconds: float | None) -> Iterator[int]:
    """Round numbers 1..count, fewer if the next round would end past ``seconds`` (judged by the last one's length)
    from the first. One round always runs."""
    started = time.monotonic()
    for number in range(1, count + 1):
        round_started = time.monotonic()
        yield number
        now = time.monotonic()
        if seconds is not None and now - started + (now - round_started) >= seconds:
            return


def change_cell(ratios: list[float]) -> str:
    """Paired per-round ratios as a change: the median, and the range over rounds ("+0.4% (-2.1% .. +3.0%)")."""
    mid = statistics.median(ratios) - 1
    return f"{mid:+.1%}" + (f" ({min(ratios) - 1:+.1%} .. {max(ratios) - 1:+.1%})" if len(ratios) > 1 else "")
