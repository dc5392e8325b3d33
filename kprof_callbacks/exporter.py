"""Exporting one window's trace: torch's chrome-trace export, done in a forked child (torch's exporter holds the GIL
for the whole write), checked as JSON (names with unescaped quotes repaired) and compressed, into the partial file
that the trace writer renames into place."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import time
import warnings
from collections.abc import Callable
from pathlib import Path

try:
    import msgspec
except ImportError:  # optional here: validation falls back to the json module
    msgspec = None

from . import layout

_CHILD_NICE = 19  # the export process's scheduling priority, below the training process's
# A name field as torch's exporters write it: on a line of its own (torch >= 2.12), or followed by the pid
# (kineto's one-line events, torch 2.11 on GPU). The value may hold unescaped quotes: it ends at the last quote.
_NAME_FIELD = re.compile(rb'("name": ")(.*?)("(?:, "pid": |,?\s*$))')


def _not_written(path: Path) -> str:
    """Why torch's exporter left no file (it only logs "Failed to write to log file!" and returns)."""
    folder = path.parent
    if not folder.is_dir():
        return f"{folder} no longer exists"
    stat = os.statvfs(folder)
    if stat.f_flag & os.ST_RDONLY:
        return f"{folder} is on a read-only file system"
    if not os.access(folder, os.W_OK):
        return f"no permission to write in {folder}"
    free = stat.f_bavail * stat.f_frsize
    if free < 2**20:
        return f"No space left on device ({free // 1024} KiB free in {folder})"
    return f"torch's trace exporter could not write {path.name} ({free // 2**20} MiB free in {folder})"


def _is_json(data: bytes) -> bool:
    if msgspec is None:
        try:
            json.loads(data)
        except ValueError:
            return False
        return True
    try:
        msgspec.json.decode(data, type=msgspec.Raw)  # checks the whole document, builds nothing (~10 ms / 15 MB)
    except msgspec.DecodeError:
        return False
    return True


def check_json(path: Path) -> None:
    """Make sure the exported file is valid JSON before it gets a final name.

    torch's exporter does not escape the names it writes, and with ``with_stack=True`` it can write a
    python_function name taken from stray memory (``torch/profiler/_cupti_monitor.py(0):     \"\"\"``), or bytes
    that are not UTF-8. Bytes that are not UTF-8 become U+FFFD and such name lines are re-escaped; a file still
    invalid after that is refused.
    """
    data = path.read_bytes()
    try:
        data.decode()
    except UnicodeDecodeError:
        data = data.decode(errors="replace").encode()
    else:
        if _is_json(data):
            return
    data = b"\n".join(_NAME_FIELD.sub(_escaped_name, line) for line in data.split(b"\n"))
    if not _is_json(data):
        raise ValueError(f"torch's exporter wrote invalid JSON to {path.name}; the capture is not kept")
    path.write_bytes(data)


def _escaped_name(match: re.Match) -> bytes:
    """The name field of ``match`` with its value escaped, unless it already is a valid JSON string."""
    value = match[2]
    if _is_json(b'"' + value + b'"'):
        return match[0]
    return match[1] + value.replace(b"\\", b"\\\\").replace(b'"', b'\\"') + match[3]


def export(results, final: Path, compress: bool) -> int:
    """Write one capture's chrome-trace JSON (gzip-compressed when asked) to ``final``'s partial file; returns the
    size of the JSON (what the capture weighs before compression)."""
    dest = layout.partial_path(final)
    json_path = layout.raw_json_path(final) if compress else dest
    results.export_chrome_trace(str(json_path))
    if not json_path.is_file():
        raise OSError(_not_written(json_path))
    check_json(json_path)
    size = json_path.stat().st_size
    if compress:
        with open(json_path, "rb") as src, gzip.open(dest, "wb", compresslevel=3) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        json_path.unlink()
    return size


def export_in_child(
    results, final: Path, compress: bool, timeout: float, running: set[int], forked: Callable[[], None]
) -> int:
    """``export`` in a forked child process, whose pid is in ``running`` while it runs (``forked()`` is called
    once it does).

    torch's exporter is C++ that holds the GIL for the whole write (~0.3 s for 20 MB), which would freeze the
    training thread even from a background thread. The forked child owns a copy-on-write snapshot of the
    results, writes the file and exits; the parent only waits (without the GIL). The child touches no CUDA.
    """
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Python 3.12+: fork() in a multi-threaded process
        pid = os.fork()
    if pid == 0:  # child: export, report any error through the pipe, never return into the caller's code
        code = 0
        try:
            os.close(read_end)
            os.nice(_CHILD_NICE)  # the export yields the CPU to training wherever the two compete
            os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # torch logs each failed write there; ours is one warning
            os.write(write_end, b"%d" % export(results, final, compress))
        except BaseException as exc:
            os.write(write_end, f"{type(exc).__name__}: {exc}".encode()[:4000])
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    running.add(pid)
    forked()
    deadline = time.monotonic() + timeout
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                raise TimeoutError(f"trace export did not finish within {timeout:.0f} s")
            time.sleep(0.005)
        message = os.read(read_end, 4096).decode(errors="replace")
    finally:
        running.discard(pid)
        os.close(read_end)
    if os.waitstatus_to_exitcode(status) != 0:
        raise OSError(message or f"trace export process exited with status {status}")
    return int(message)
