"""Build-or-load for kprof's C++/CUDA extensions, with a content-keyed cache and clear errors.

A cold build compiles with ninja through ``torch.utils.cpp_extension`` (several seconds to a
minute). A warm start in a new process only imports the cached shared library: the cache
folder is keyed by a hash of the sources, torch/CUDA versions, arch list and flags, and a
marker file written after a successful build says the library in it is complete (and how big it
is: a truncated library is rebuilt, not imported).

Extension sources follow one contract: the ``.cpp`` registers the ``torch.ops.kprof`` operators (schemas, CPU
kernels, autograd, autocast; see ``_dispatch.h``) and defines the Python module whose import runs those
registrations; ``.cu`` files hold only kernels and ``extern "C"`` launchers (no torch headers) and are compiled
only when CUDA is usable, in which case ``KPROF_WITH_CUDA`` is defined for the C++ side.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys
import time
import types
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

KERNELS_DIR = Path(__file__).resolve().parent
_MARKER = "kprof_build.json"
_FLOCK = "kprof_build.lock"
_TORCH_BATON = "lock"  # torch.utils.file_baton.FileBaton's file in the build folder
_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)
_loaded: dict[Path, types.ModuleType] = {}


class KernelBuildError(RuntimeError):
    """A kprof extension could not be built; ``log_path`` points at the full compiler log if any."""

    def __init__(self, message: str, log_path: Path | None = None) -> None:
        super().__init__(message)
        self.log_path = log_path


def cuda_enabled() -> bool:
    """True when the CUDA half of the extensions is built: torch has CUDA and sees a GPU."""
    return torch.version.cuda is not None and torch.cuda.is_available()


def cache_root() -> Path:
    """``$TORCH_EXTENSIONS_DIR/kprof`` if set, else ``~/.cache/kprof/torch_extensions``."""
    env = os.environ.get("TORCH_EXTENSIONS_DIR")
    if env:
        return Path(env) / "kprof"
    cache_home = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache_home) / "kprof" / "torch_extensions"


def cuda_arch_flags() -> list[str]:
    """``-gencode`` flags for every visible GPU's compute capability (H100: sm_90, B200: sm_100).

    Empty when the user set ``TORCH_CUDA_ARCH_LIST``: torch then applies that list itself.
    """
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return []
    capabilities = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    return [f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}" for major, minor in capabilities]


def _flags(with_cuda: bool) -> dict[str, list[str]]:
    openmp = ["-fopenmp"] if sys.platform.startswith("linux") else []  # at::parallel_for is serial without it
    cflags = ["-O3", *openmp] + (["-DKPROF_WITH_CUDA"] if with_cuda else [])
    cuda_cflags = ["-O3", "-lineinfo", *cuda_arch_flags()] if with_cuda else []
    return {"extra_cflags": cflags, "extra_cuda_cflags": cuda_cflags, "extra_ldflags": openmp}


def load(name: str, sources: list[str], *, verbose: bool | None = None) -> types.ModuleType:
    """Build (or load from cache) the extension made of these files in kernels/ (a .cpp defining the module, plus .cu
    files that are compiled only when CUDA is usable). Defines KPROF_WITH_CUDA for the C++ side when .cu files are
    built.

    Relative paths are taken from the kernels/ folder; absolute paths are used as given.
    """
    with_cuda = cuda_enabled()
    paths = [KERNELS_DIR / s for s in sources]
    if not any(p.suffix == ".cpp" for p in paths):
        raise ValueError(f"sources: {name!r} needs a .cpp file defining the module, got {sources}")
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ValueError(f"sources: no such file(s): {missing}")
    used = [p for p in paths if p.suffix != ".cu" or with_cuda]
    flags = _flags(with_cuda)
    key = _key(name, [p.read_bytes() for p in (*used, *_local_headers(used))], flags)

    def build(ext_name: str, build_dir: Path, verbose: bool) -> types.ModuleType:
        from torch.utils import cpp_extension

        return cpp_extension.load(
            ext_name,
            [str(p) for p in used],
            build_directory=str(build_dir),
            verbose=verbose,
            with_cuda=with_cuda,
            extra_include_paths=[str(KERNELS_DIR)],
            **flags,
        )

    return _cached(name, key, with_cuda, build, verbose)


def load_inline(
    name: str,
    cpp_source: str,
    cuda_source: str | None,
    functions: list[str] | None = None,
    *,
    verbose: bool | None = None,
) -> types.ModuleType:
    """Build (or load from cache) an extension from source strings.

    No header is added implicitly: ``cpp_source`` includes what it uses. With ``functions``, those are bound as
    plain pybind11 functions (``cpp_source`` includes ``torch/csrc/utils/pybind.h``), so c10 errors reach Python
    through torch's exception translators (TORCH_CHECK_VALUE -> ValueError, ...); without, ``cpp_source`` defines
    its module itself (kprof's operators: ``KPROF_PYTHON_MODULE()``). ``cuda_source`` is compiled only when CUDA
    is usable.
    """
    with_cuda = cuda_enabled() and cuda_source is not None
    flags = _flags(with_cuda)
    sources = [cpp_source, *([cuda_source] if with_cuda else [])]
    headers = [h.read_bytes() for h in _local_headers(sources, KERNELS_DIR)]
    key = _key(name, [*(s.encode() for s in sources), *headers, json.dumps(functions).encode()], flags)

    def build(ext_name: str, build_dir: Path, verbose: bool) -> types.ModuleType:
        from torch.utils import cpp_extension

        return cpp_extension.load_inline(
            ext_name,
            [cpp_source],
            [cuda_source] if with_cuda else None,
            functions=list(functions) if functions is not None else None,
            build_directory=str(build_dir),
            verbose=verbose,
            with_cuda=with_cuda,
            with_pytorch_error_handling=False,
            extra_include_paths=[str(KERNELS_DIR)],
            no_implicit_headers=True,
            **flags,
        )

    return _cached(name, key, with_cuda, build, verbose)


def build_directory(name: str, key: str) -> Path:
    """The cache folder of one build of ``name`` (``key`` is the hex digest from the build inputs)."""
    return cache_root() / f"{name}-{key[:16]}"


def _local_headers(sources: list[Path] | list[str], folder: Path | None = None) -> list[Path]:
    """The ``#include "..."`` files the sources pull in from their folder (or ``folder`` for source text), transitively,
    so that editing a header rebuilds exactly the extensions that use it."""
    found: dict[Path, None] = {}
    pending = [
        (s.read_text() if isinstance(s, Path) else s, s.parent if isinstance(s, Path) else folder) for s in sources
    ]
    while pending:
        text, base = pending.pop()
        for include in _INCLUDE.findall(text):
            header = (base / include).resolve()
            if header.is_file() and header not in found:
                found[header] = None
                pending.append((header.read_text(), header.parent))
    return sorted(found)


def _key(name: str, texts: list[bytes], flags: dict[str, list[str]]) -> str:
    digest = hashlib.sha256()
    parts = [
        name,
        torch.__version__,
        str(torch.version.cuda),
        sys.implementation.cache_tag,
        os.environ.get("TORCH_CUDA_ARCH_LIST", ""),
        json.dumps(flags, sort_keys=True),
    ]
    for part in (*(p.encode() for p in parts), *texts):
        digest.update(len(part).to_bytes(8, "little") + part)
    return digest.hexdigest()


def _cached(
    name: str, key: str, with_cuda: bool, build: Callable[[str, Path, bool], types.ModuleType], verbose: bool | None
) -> types.ModuleType:
    build_dir = build_directory(name, key)
    module = _loaded.get(build_dir) or _import_built(build_dir)
    if module is None:
        verbose = os.environ.get("KPROF_VERBOSE_BUILD") == "1" if verbose is None else verbose
        build_dir.mkdir(parents=True, exist_ok=True)
        with _build_lock(build_dir, name):
            module = _import_built(build_dir)  # another process may have built it while we waited
            if module is None:
                module = _build(name, key, with_cuda, build_dir, build, verbose)
    _loaded[build_dir] = module
    return module


def _import_built(build_dir: Path) -> types.ModuleType | None:
    """Import the library a finished build left in ``build_dir``; None if there is none."""
    try:
        marker = json.loads((build_dir / _MARKER).read_text())
    except (OSError, ValueError):
        return None
    library = build_dir / marker["library"]
    try:
        if library.stat().st_size != marker["bytes"]:  # truncated: importing it would SIGBUS the process
            return None
    except (OSError, KeyError):  # gone, or a marker from before sizes were recorded
        return None
    spec = importlib.util.spec_from_file_location(marker["module"], library)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build(
    name: str,
    key: str,
    with_cuda: bool,
    build_dir: Path,
    build: Callable[[str, Path, bool], types.ModuleType],
    verbose: bool,
) -> types.ModuleType:
    _check_toolchain(with_cuda)
    ext_name = f"kprof_{name}_{key[:12]}"
    log_path = build_dir / "build.log"
    estimate = "~15-30 s" if with_cuda else "~10-30 s"  # measured: 12-19 s on an H100 host, 15-40 s on 2 CPU cores
    print(f"building kprof kernel {name!r} (first run, {estimate})...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    for damaged in build_dir.glob("*.so"):  # no valid library here: ninja must not find this one up to date
        damaged.unlink()
    try:
        module = build(ext_name, build_dir, verbose)
    except (RuntimeError, ImportError, OSError) as exc:
        try:
            log_path.write_text(f"{exc}\n")
        except OSError:  # the disk that failed the build (full, read-only) can refuse the log too
            log_path = None
        raise KernelBuildError(_failure_message(name, str(exc), log_path, verbose), log_path) from exc
    seconds = time.perf_counter() - start
    library = Path(module.__file__)
    marker = {
        "module": ext_name,
        "library": library.name,
        "bytes": library.stat().st_size,
        "seconds": round(seconds, 2),
        "cuda": with_cuda,
        "torch": torch.__version__,
    }
    tmp = build_dir / f"{_MARKER}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(marker, indent=1))
    os.replace(tmp, build_dir / _MARKER)
    print(f"building kprof kernel {name!r}: done in {seconds:.1f} s", file=sys.stderr, flush=True)
    return module


def _failure_message(name: str, output: str, log_path: Path | None, verbose: bool) -> str:
    errors = [line for line in output.splitlines() if "error" in line.lower()][:15]
    detail = "\n".join(errors) if errors else output[-2000:]
    where = (
        "compiler output above"
        if verbose
        else f"full compiler log: {log_path}"
        if log_path
        else "the compiler log could not be saved either"
    )
    return f"building kprof kernel {name!r} failed ({where})\n{detail}"


def _check_toolchain(with_cuda: bool) -> None:
    """Fail early, naming the missing tool, instead of deep inside torch's build."""
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        raise KernelBuildError(
            f"no C++ compiler: {cxx!r} (from $CXX, default 'c++') was not found; install g++ or clang++, "
            "or point CXX at a compiler"
        )
    if shutil.which("ninja") is None:
        venv_bin = Path(sys.executable).parent
        if not (venv_bin / "ninja").is_file():
            raise KernelBuildError("ninja was not found on PATH: `pip install ninja` (torch builds extensions with it)")
        os.environ["PATH"] = f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}"
    if with_cuda:
        from torch.utils.cpp_extension import CUDA_HOME

        nvcc = Path(CUDA_HOME or "", "bin", "nvcc")
        headers = [
            Path(CUDA_HOME or "", "include", "cuda_runtime_api.h"),
            *Path(CUDA_HOME or "/nonexistent", "targets").glob("*/include/cuda_runtime_api.h"),
        ]
        if CUDA_HOME is None or not nvcc.is_file() or not any(h.is_file() for h in headers):
            raise KernelBuildError(
                f"CUDA toolkit not found (CUDA_HOME={CUDA_HOME!r}): torch {torch.__version__} uses CUDA "
                f"{torch.version.cuda} and sees a GPU, so kprof builds CUDA kernels and needs nvcc and the CUDA "
                "headers; install the toolkit matching torch.version.cuda and set CUDA_HOME"
            )


@contextlib.contextmanager
def _build_lock(build_dir: Path, name: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the build folder for the duration of a build.

    The kernel drops an flock when its owner dies, so a killed build never blocks the next one.
    torch's own FileBaton (a plain ``lock`` file) does not have that property: if one is present
    while we hold the flock, the build that made it is dead, and the file is removed with a warning.
    """
    with open(build_dir / _FLOCK, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"kprof: waiting for another process building {name!r} in {build_dir}", file=sys.stderr, flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            baton = build_dir / _TORCH_BATON
            if baton.exists():
                warnings.warn(f"kprof: removing stale build lock {baton} left by an interrupted build", stacklevel=4)
                baton.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
