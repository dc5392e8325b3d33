"""Fault 9: kernel builds that go wrong on a real machine: a corrupted cache, a full disk, a build killed mid-compile.

A tiny Python C-API extension (no torch headers, about a second to compile) goes through kprof's real build path
(kernels/_build.py: cache folder, flock, torch's ninja build) in a cache of the test's own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from torch import nn

import kprof_callbacks as kprof
from kprof_callbacks.kernels import KernelBuildError, _build

PROBE = """
#include <Python.h>
#define KPROF_JOIN2(a, b) a##b
#define KPROF_JOIN(a, b) KPROF_JOIN2(a, b)
static PyModuleDef fault_probe = {PyModuleDef_HEAD_INIT, "fault_probe", nullptr, -1, nullptr};
PyMODINIT_FUNC KPROF_JOIN(PyInit_, TORCH_EXTENSION_NAME)(void) { return PyModule_Create(&fault_probe); }
"""


@pytest.fixture
def probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The probe's source, with TORCH_EXTENSIONS_DIR pointing at an empty cache of this test (here and in children)."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    source = tmp_path / "fault_probe.cpp"
    source.write_text(PROBE)
    return source


def _load_in_child(source: Path, **popen) -> subprocess.Popen:
    code = f"from kprof_callbacks.kernels import _build; print(_build.load('fault_probe', [{str(source)!r}]).__file__)"
    return subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen
    )


def _load_result(source: Path) -> tuple[int, str, str]:
    child = _load_in_child(source)
    out, err = child.communicate(timeout=300)
    return child.returncode, out.strip(), err


class ProbeLayer(nn.Module):
    """A stand-in kernel layer for swap(): building it builds the probe."""

    source: Path

    @classmethod
    def from_module(cls, module: nn.Module) -> ProbeLayer:
        return cls()

    def build(self) -> None:
        _build.load("fault_probe", [str(self.source)])


def test_corrupted_cached_library_is_rebuilt_or_named(probe):
    """A cached .so truncated on disk: a new process rebuilds it, or fails with a KernelBuildError naming it."""
    code, library, err = _load_result(probe)
    assert code == 0, err
    Path(library).write_bytes(Path(library).read_bytes()[:4096])
    code, _, err = _load_result(probe)
    assert code == 0 or ("KernelBuildError" in err and library in err), err


def test_build_on_a_full_disk_is_a_kernel_build_error(probe, tmpfs, monkeypatch):
    """The extension cache on a full 12 KiB tmpfs: a KernelBuildError saying so, not a bare OSError."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmpfs("12k")))
    with pytest.raises(KernelBuildError, match="No space left on device"):
        _build.load("fault_probe", [str(probe)])


def test_swap_fallback_keeps_the_torch_layer_when_the_disk_is_full(probe, tmpfs, monkeypatch):
    """swap(fallback=True) when the disk is too full to build: the torch layer stays, with a warning, and still runs."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmpfs("12k")))
    monkeypatch.setattr(ProbeLayer, "source", probe, raising=False)
    model = nn.Sequential(nn.Linear(4, 4), nn.GELU())
    with pytest.warns(UserWarning, match="keeping nn.GELU"):
        fast = kprof.swap(model, {nn.GELU: ProbeLayer}, fallback=True)
    assert type(fast[1]) is nn.GELU
    x = torch.randn(2, 4)
    torch.testing.assert_close(fast(x), model(x))


def test_build_killed_mid_compile_does_not_block_the_next_build(probe):
    """SIGKILL of a build while the compiler runs: the next process removes its lock (one warning) and builds."""
    child = _load_in_child(probe, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not any(_is_compiler(p) for p in _descendants(child.pid)):
            assert time.monotonic() < deadline and child.poll() is None, "the build finished before it could be killed"
            time.sleep(0.005)
        os.killpg(child.pid, signal.SIGKILL)
    finally:
        child.communicate()
    build_dir = next((probe.parent / "extensions" / "kprof").iterdir())
    assert not (build_dir / "kprof_build.json").exists() and (build_dir / "lock").exists()
    code, library, err = _load_result(probe)
    assert code == 0, err
    assert err.count("removing stale build lock") == 1 and Path(library).parent == build_dir


def _is_compiler(process: psutil.Process) -> bool:
    """True for a C++ compiler process; False for one that exited while we looked."""
    try:
        name = process.name()
    except (psutil.Error, OSError):
        return False
    return "cc1plus" in name or name in ("c++", "g++")


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def test_two_processes_building_one_extension_compile_it_once(probe):
    """Two processes need one extension at once: one compiles, the other waits on the lock; both load one library."""
    children = [_load_in_child(probe) for _ in range(2)]
    results = [child.communicate(timeout=300) for child in children]
    assert [child.returncode for child in children] == [0, 0], [err for _, err in results]
    assert results[0][0] == results[1][0]
    assert sum(err.count("building kprof kernel 'fault_probe': done") for _, err in results) == 1
