"""kernels/_build.py: the build cache (cold build once, warm loads in new processes without compiling), its
progress line, the build lock, clear errors for broken toolchains and sources, and the installed wheel.

Most tests build a tiny Python C-API extension (about a second to compile) in a temporary cache; the
cross-process warm-load test uses a real kernel in the default cache, as a user would."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch

from kprof_callbacks.kernels import _build
from kprof_callbacks.kernels._build import KernelBuildError

REPO = Path(__file__).resolve().parents[1]
HAS_CUDA = torch.cuda.is_available()

# A complete extension without torch headers: quick to compile, and it still goes through torch's ninja build.
PROBE = textwrap.dedent("""
    #include <Python.h>
    #define KPROF_CAT2(a, b) a##b
    #define KPROF_CAT(a, b) KPROF_CAT2(a, b)
    static PyModuleDef probe_def = {PyModuleDef_HEAD_INIT, "probe", nullptr, -1, nullptr};
    PyMODINIT_FUNC KPROF_CAT(PyInit_, TORCH_EXTENSION_NAME)(void) {
      PyObject* m = PyModule_Create(&probe_def);
      if (m != nullptr) PyModule_AddIntConstant(m, "answer", ANSWER);
      return m;
    }
""")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty extension cache for this test."""
    root = tmp_path / "extensions"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(root))
    return root / "kprof"


def probe_source(directory: Path, answer: int = 42, body: str = PROBE) -> Path:
    path = directory / "probe.cpp"
    path.write_text(f"#define ANSWER {answer}\n{body}")
    return path


def run_python(code: str, env: dict[str, str] | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full_env, cwd=cwd, timeout=300)


def test_cold_build_shows_progress_and_warm_load_in_new_process_compiles_nothing(
        cache: Path, tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    source = probe_source(tmp_path)
    module = _build.load("probe", [str(source)])
    assert module.answer == 42
    err = capfd.readouterr().err
    assert "building kprof kernel 'probe' (first run" in err and "done in" in err
    library = Path(module.__file__)
    assert library.parent.parent == cache
    mtime = library.stat().st_mtime_ns
    assert _build.load("probe", [str(source)]) is module  # same process: no work at all

    result = run_python(f"""
        from kprof_callbacks.kernels import _build
        print(_build.load("probe", [{str(source)!r}]).answer)
    """, env={"TORCH_EXTENSIONS_DIR": str(cache.parent)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "42"
    assert "building" not in result.stderr
    assert library.stat().st_mtime_ns == mtime


def test_real_kernel_warm_load_across_processes_is_a_load_not_a_compile() -> None:
    library = Path(_build.load("add", ["add.cpp", "add.cu"]).__file__)
    mtime = library.stat().st_mtime_ns
    result = run_python("""
        import time, torch
        from kprof_callbacks import kernels
        x = torch.randn(1000)
        start = time.perf_counter()
        out = kernels.add(x, x)
        print(time.perf_counter() - start)
        assert torch.equal(out, x + x)
    """)
    assert result.returncode == 0, result.stderr
    assert "building" not in result.stderr
    assert library.stat().st_mtime_ns == mtime
    assert float(result.stdout) < 5.0  # a generous bound: the load itself takes milliseconds


def test_changed_source_builds_into_a_new_cache_folder(cache: Path, tmp_path: Path) -> None:
    first = _build.load("probe", [str(probe_source(tmp_path, 1))])
    second = _build.load("probe", [str(probe_source(tmp_path, 2))])
    assert (first.answer, second.answer) == (1, 2)
    assert Path(first.__file__).parent != Path(second.__file__).parent


def test_compile_error_names_the_log_with_the_compiler_output(cache: Path, tmp_path: Path) -> None:
    source = probe_source(tmp_path, body=PROBE.replace("return m;", "return m"))
    with pytest.raises(KernelBuildError, match="full compiler log") as info:
        _build.load("probe", [str(source)])
    log = info.value.log_path
    assert log is not None and log.is_file() and str(log) in str(info.value)
    assert "error" in log.read_text() and "probe.cpp" in log.read_text()


def test_stale_lock_from_a_killed_build_is_removed_with_a_warning(cache: Path, tmp_path: Path) -> None:
    source = probe_source(tmp_path)
    build_dir = Path(_build.load("probe", [str(source)]).__file__).parent
    # What a build killed mid-way leaves: torch's FileBaton lock, no marker, no library.
    (build_dir / "kprof_build.json").unlink()
    for library in build_dir.glob("*.so"):
        library.unlink()
    (build_dir / "lock").touch()
    result = run_python(f"""
        from kprof_callbacks.kernels import _build
        print(_build.load("probe", [{str(source)!r}]).answer)
    """, env={"TORCH_EXTENSIONS_DIR": str(cache.parent)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "42"
    assert "removing stale build lock" in result.stderr
    assert not (build_dir / "lock").exists()
    assert json.loads((build_dir / "kprof_build.json").read_text())["module"].startswith("kprof_probe_")


def test_missing_compiler_is_a_clear_error(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(KernelBuildError, match="no C\\+\\+ compiler.*no-such-compiler.*CXX"):
        _build.load("probe", [str(probe_source(tmp_path))])


def test_missing_ninja_is_a_clear_error(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compiler = shutil.which(os.environ.get("CXX", "c++"))
    assert compiler is not None
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    monkeypatch.setenv("CXX", compiler)
    monkeypatch.setenv("PATH", str(empty_bin))
    monkeypatch.setattr(sys, "executable", str(empty_bin / "python"))  # no ninja beside the interpreter either
    with pytest.raises(KernelBuildError, match="ninja was not found"):
        _build.load("probe", [str(probe_source(tmp_path))])


def test_bad_source_lists_are_value_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file"):
        _build.load("probe", [str(tmp_path / "missing.cpp")])
    with pytest.raises(ValueError, match="needs a .cpp file defining the module"):
        _build.load("add", ["add.cu"])


def test_importing_and_constructing_layers_compiles_nothing(tmp_path: Path) -> None:
    result = run_python("""
        import kprof_callbacks as kprof
        from kprof_callbacks import kernels
        layers = [kernels.GELU(), kernels.Square(variant="grid2d"), kernels.Add(), kernels.LinearGELU(4, 4),
                  kernels.BiasGELU(4)]
        print(len(layers), kernels.LayerNorm.__name__, kernels.RMSNorm.__name__)
    """, env={"TORCH_EXTENSIONS_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert "building" not in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_cache_root_follows_torch_extensions_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert _build.cache_root() == tmp_path / "kprof"
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _build.cache_root() == tmp_path / "xdg" / "kprof" / "torch_extensions"


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA")
def test_arch_flags_follow_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    major, minor = torch.cuda.get_device_capability(0)
    assert f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}" in _build.cuda_arch_flags()
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")
    assert _build.cuda_arch_flags() == []  # torch applies the user's list itself


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_every_cuda_source_compiles_with_plain_nvcc(tmp_path: Path) -> None:
    """The .cu files (and square's inline CUDA source) hold no torch headers: plain `nvcc -c` builds them, so a
    machine with nvcc and a CPU-only torch still checks every kernel compiles."""
    inline = tmp_path / "square_inline.cu"
    inline.write_text(importlib.import_module("kprof_callbacks.kernels.square").CUDA_SOURCE)
    sources = [*sorted(_build.KERNELS_DIR.glob("*.cu")), inline]
    jobs = {src: subprocess.Popen(["nvcc", "-I", str(_build.KERNELS_DIR), "-arch=sm_90", "-c", str(src), "-o",
                                   str(tmp_path / f"{src.stem}.o")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True) for src in sources}
    outputs = {src.name: job.communicate(timeout=600)[0] for src, job in jobs.items()}
    failures = {name: outputs[name] for name, job in zip(outputs, jobs.values(), strict=True) if job.returncode != 0}
    assert not failures, failures


def test_wheel_ships_kernel_sources_under_kprof_callbacks_only(tmp_path: Path) -> None:
    """Build the wheel from a copy of the project, check its file list, install it into a folder and run a
    kernel from there (a warm load from the same cache: the installed sources hash like the checkout's)."""
    project = tmp_path / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, project / name)
    for name in ("kprof_callbacks", "kernels"):
        shutil.copytree(REPO / name, project / name, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(project), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist")], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("kprof_callbacks-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert not any(n.startswith("kernels/") for n in names), "the wheel must not own a top-level `kernels`"
    for source in ("add.cpp", "add.cu", "gelu.cpp", "gelu.cu", "_op.h", "_dispatch.h", "_elementwise.cuh",
                   "_gelu_math.h"):
        assert f"kprof_callbacks/kernels/{source}" in names

    _build.load("add", ["add.cpp", "add.cu"])  # the checkout's build, in the default cache
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    result = run_python("""
        import torch
        from kprof_callbacks import kernels
        x = torch.randn(5)
        assert torch.equal(kernels.add(x, x), x + x)
        print(kernels.__file__)
    """, env={"PYTHONPATH": str(site)}, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith(str(site))
    assert "building" not in result.stderr
