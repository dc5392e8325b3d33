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
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=300,
    )


def test_cold_build_shows_progress_and_warm_load_in_new_process_compiles_nothing(
    cache: Path, tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    source = probe_source(tmp_path)
    module = _build.load("probe", [str(source)])
    assert module.answer == 42
    err = capfd.readouterr().err
    assert "building kprof kernel 'probe' (first run" in err and "done in" in err
    library = Path(module.__file__)
    assert library.parent.parent == cache
    mtime = library.stat().st_mtime_ns
    assert _build.load("probe", [str(source)]) is module  # same process: no work at all

    result = run_python(
        f"""
        from kprof_callbacks.kernels import _build
        print(_build.load("probe", [{str(source)!r}]).answer)
    """,
        env={"TORCH_EXTENSIONS_DIR": str(cache.parent)},
    )
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
    result = run_python(
        f"""
        from kprof_callbacks.kernels import _build
        print(_build.load("probe", [{str(source)!r}]).answer)
    """,
        env={"TORCH_EXTENSIONS_DIR": str(cache.parent)},
    )
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
    result = run_python(
        """
        import kprof_callbacks as kprof
        from kprof_callbacks import kernels
        layers = [kernels.GELU(), kernels.Square(variant="grid2d"), kernels.Add(), kernels.LinearGELU(4, 4),
                  kernels.BiasGELU(4)]
        print(len(layers), kernels.LayerNorm.__name__, kernels.RMSNorm.__name__)
    """,
        env={"TORCH_EXTENSIONS_DIR": str(tmp_path)},
    )
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
    jobs = {
        src: subprocess.Popen(
            [
                "nvcc",
                "-I",
                str(_build.KERNELS_DIR),
                "-arch=sm_90",
                "-c",
                str(src),
                "-o",
                str(tmp_path / f"{src.stem}.o"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for src in sources
    }
    outputs = {src.name: job.communicate(timeout=600)[0] for src, job in jobs.items()}
    failures = {name: outputs[name] for name, job in zip(outputs, jobs.values(), strict=True) if job.returncode != 0}
    assert not failures, failures


# --- The wheel and the sdist, installed alone ------------------------------------------------------------------------
# Each is installed into a fresh virtual environment whose only other path is the site-packages folder that holds
# torch (a .pth line appends it; .pth files inside it, such as the checkout's editable-install finder, are not run),
# so nothing of the checkout can stand in for a file the package forgot.

# In the installed environment: import every module of the package (`__main__` is only found: importing it runs the
# CLI), load the TensorBoard plugin's entry point and print where each came from.
INSTALLED_PROBE = """
import importlib, importlib.util, json, pkgutil, sys
from importlib import metadata
import kprof_callbacks
modules = {"kprof_callbacks": kprof_callbacks.__file__}
for info in pkgutil.walk_packages(kprof_callbacks.__path__, "kprof_callbacks."):
    if info.name.endswith(".__main__"):
        modules[info.name] = importlib.util.find_spec(info.name).origin
    else:
        modules[info.name] = importlib.import_module(info.name).__file__
from kprof_callbacks.analysis.workers import Workers
with Workers(2) as workers:  # worker processes start from the install too
    assert workers.submit(len, "abc").result(timeout=120) == 3
dist = metadata.distribution("kprof-callbacks")
(plugin,) = [ep for ep in dist.entry_points if ep.group == "tensorboard_plugins"]
loaded = plugin.load()
print(json.dumps({"modules": modules, "version": kprof_callbacks.__version__, "metadata_version": dist.version,
                  "plugin": [loaded.__name__, sys.modules[loaded.__module__].__file__]}))
"""


def expected_modules() -> set[str]:
    """Every module of the checkout, by the name it has once installed (kernels/ ships as kprof_callbacks.kernels)."""
    names = set()
    for root, package in ((REPO / "kprof_callbacks", "kprof_callbacks"), (REPO / "kernels", "kprof_callbacks.kernels")):
        for path in root.rglob("*.py"):
            parts = [package, *path.relative_to(root).with_suffix("").parts]
            names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The wheel and the sdist, built from a copy of the project as a release would be (``python -m build``)."""
    tmp = tmp_path_factory.mktemp("dists")
    project = tmp / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, project / name)
    for name in ("kprof_callbacks", "kernels"):
        shutil.copytree(REPO / name, project / name, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--no-isolation",
            "--skip-dependency-check",
            "--sdist",
            "--wheel",
            "--outdir",
            str(tmp / "dist"),
            str(project),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = (tmp / "dist").glob("kprof_callbacks-*.whl")
    (sdist,) = (tmp / "dist").glob("kprof_callbacks-*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


def dependency_dirs(path: list[str] | None = None) -> list[str]:
    """Where this interpreter finds its packages (``path``: ``sys.path``), less any folder that holds kprof's own
    sources (the checkout): torch's site-packages, and any folder a machine without an index adds to PYTHONPATH for
    the rest (msgspec, torch-tb-profiler), such as the GPU set-up's ``.gpu-site`` inside the checkout."""
    dirs = [Path(p).resolve() for p in (sys.path if path is None else path) if p and Path(p).is_dir()]
    keep = [d for d in dirs if not (d / "kprof_callbacks").exists()]
    return list(dict.fromkeys(map(str, [Path(torch.__file__).parents[1], *keep])))


def test_the_installed_package_sees_the_dependencies_the_gpu_set_up_provides(tmp_path: Path) -> None:
    """`make test-gpu` on an offline machine puts the wheels of .whl/ in `.gpu-site` inside the checkout, on
    PYTHONPATH: the venv of the tests below lacked them (msgspec) because every folder inside the checkout was
    left out with it."""
    checkout = tmp_path / "checkout"
    for folder in ("kprof_callbacks", "kernels", ".gpu-site/msgspec", "tests"):
        (checkout / folder).mkdir(parents=True)
    found = dependency_dirs([str(checkout), str(checkout / ".gpu-site"), str(checkout / "tests")])
    assert str(checkout / ".gpu-site") in found and str(checkout) not in found


def install_alone(dist: Path, venv: Path) -> Path:
    """A fresh venv holding only ``dist`` (dependencies come from this interpreter's package folders, never from the
    checkout); returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [python, "-I", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "kprof_deps.pth").write_text("".join(f"{d}\n" for d in dependency_dirs()))
    installed = subprocess.run(
        [
            python,
            "-I",
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--ignore-installed",
            "--no-build-isolation",
            "-q",
            str(dist),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=venv,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    return python


def test_wheel_ships_kernel_sources_under_kprof_callbacks_only(dists: dict[str, Path]) -> None:
    names = zipfile.ZipFile(dists["wheel"]).namelist()
    assert not any(n.startswith("kernels/") for n in names), "the wheel must not own a top-level `kernels`"
    for source in (
        "add.cpp",
        "add.cu",
        "gelu.cpp",
        "gelu.cu",
        "_op.h",
        "_dispatch.h",
        "_elementwise.cuh",
        "_gelu_math.h",
    ):
        assert f"kprof_callbacks/kernels/{source}" in names
    assert "kprof_callbacks/tensorboard/static/index.js" in names


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_installed_alone_imports_every_module_and_runs_the_cli(
    kind: str, dists: dict[str, Path], tmp_path: Path
) -> None:
    """Installed where the checkout cannot leak in, every module imports, ``kprof --help`` runs and the TensorBoard
    plugin loads through its entry point, all from the installed files."""
    python = install_alone(dists[kind], tmp_path / "venv")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = subprocess.run(
        [python, "-I", "-c", INSTALLED_PROBE], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    found = json.loads(probe.stdout.splitlines()[-1])
    assert set(found["modules"]) == expected_modules()
    outside = {name: file for name, file in found["modules"].items() if not file.startswith(str(tmp_path / "venv"))}
    assert not outside, f"modules loaded from outside the install: {outside}"
    assert found["version"] == found["metadata_version"]
    assert found["plugin"][0] == "KprofPlugin" and found["plugin"][1].startswith(str(tmp_path / "venv"))

    cli = subprocess.run(
        [tmp_path / "venv" / "bin" / "kprof", "--help"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert cli.returncode == 0, cli.stderr[-3000:]
    for command in ("summary", "diff", "tensorboard", "demo"):
        assert command in cli.stdout


def test_installed_wheel_loads_the_checkouts_kernel_build_without_compiling(
    dists: dict[str, Path], tmp_path: Path
) -> None:
    """The installed kernel sources hash like the checkout's: a warm load from the same cache, no compile."""
    _build.load("add", ["add.cpp", "add.cu"])  # the checkout's build, in the default cache
    python = install_alone(dists["wheel"], tmp_path / "venv")
    result = subprocess.run(
        [
            python,
            "-I",
            "-c",
            textwrap.dedent("""
        import torch
        from kprof_callbacks import kernels
        x = torch.randn(5)
        assert torch.equal(kernels.add(x, x), x + x)
        print(kernels.__file__)
    """),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith(str(tmp_path / "venv"))
    assert "building" not in result.stderr
