"""Where the Triton twins (``impl="triton"``) enter: an ``OpLibrary`` whose build imports a ``*_triton`` module, which
registers the operators ``torch.ops.kprof.triton_<op>``. Nothing here imports triton, an optional extra: without it,
loading a Triton library raises an ImportError that names the extra, and nothing else changes."""

from __future__ import annotations

import importlib
import types

from ._library import OpLibrary

EXTRA = "pip install 'kprof-callbacks[triton]'"


def require() -> types.ModuleType:
    """The shared Triton machinery (``_triton_op``, which imports triton); ImportError naming the extra without it."""
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"impl='triton' needs the triton package: {EXTRA}") from exc
    return importlib.import_module("._triton_op", __package__)


def library(name: str, module: str, ops: tuple[str, ...]) -> OpLibrary:
    """The Triton twin of the C++ library ``name``: its ``ops``, as ``kprof::triton_<op>``, registered by importing
    ``module`` (a file of this package), called through the same attribute names."""

    def build() -> types.ModuleType:
        require()
        return importlib.import_module(f".{module}", __package__)

    return OpLibrary(f"triton_{name}", build, ops, prefix="triton_")


def unavailable(device: str) -> str | None:
    """None when the Triton kernels run on ``device``'s tensors in this process, else why not (``kprof bench``)."""
    try:
        return require().device_error(device)
    except ImportError as exc:
        return str(exc)
