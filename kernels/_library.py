"""One kprof extension as a set of ``torch.ops.kprof`` operators: built (or loaded from the cache) once per process,
with the fake (shape-only) kernels that let torch.compile trace them.

The C++ side registers the schemas, the CPU/CUDA kernels, autograd and autocast (``_dispatch.h``); the fake kernels
live in Python, beside the layers, as the PyTorch custom-operator tutorial does for C++ operators. Layers load their
library when they are built; the functional forms call ``ensure()`` first, which Dynamo runs once while tracing
instead of tracing into the build cache, so ``torch.compile`` sees nothing but the ``torch.ops.kprof`` calls.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable
from typing import TypeVar

import torch

from .. import torch_compat

Fn = TypeVar("Fn", bound=Callable)
_lock = threading.Lock()


class OpLibrary:
    """The operators ``kprof::<prefix><op>`` for each of ``ops``; ``build`` registers them (``_build.load`` or
    ``load_inline`` for a C++ extension, an import for the Triton twins, whose ``prefix`` is "triton_").

    Once loaded, each operator is an attribute named without the prefix (``LIBRARY.gelu``), called exactly as a
    twin library's: the extension's eager entry where it has one (``_fastcall.h``: the operator through its typed
    dispatcher handle, without torch.ops' per-call argument parsing; Dynamo traces it as the ``OpOverload``), else
    the ``OpOverload`` itself (``torch.ops.kprof.gelu.default``).
    """

    def __init__(
        self, name: str, build: Callable[[], types.ModuleType], ops: tuple[str, ...], prefix: str = ""
    ) -> None:
        self.name = name
        self.ops = ops
        self.prefix = prefix
        self._builder = build
        self._fakes: dict[str, Callable] = {}
        self._loaded = False

        def ensure() -> bool:
            return self._loaded or self.load()

        # Under torch.compile, Dynamo calls ensure() at trace time and keeps its result as a constant.
        self.ensure: Callable[[], bool] = torch.compiler.assume_constant_result(ensure)

    def fake(self, op: str) -> Callable[[Fn], Fn]:
        """Decorator: ``fn`` is the fake kernel of ``kprof::<prefix><op>``, registered when the library loads."""
        if op not in self.ops:
            raise ValueError(f"{op!r} is not one of {self.name}'s operators {self.ops}")

        def record(fn: Fn) -> Fn:
            self._fakes[op] = fn
            return fn

        return record

    def load(self) -> bool:
        """Build or load the extension (once per process), register its fake kernels and bind its operators as
        attributes; True when done.

        A library whose operators are already registered in this process is not loaded a second time (a second
        copy's registrations would fail inside the dynamic loader, where an error ends the process).
        """
        if self._loaded:
            return True
        with _lock:
            if not self._loaded:
                module = None
                if not hasattr(torch.ops.kprof, self.prefix + self.ops[0]):
                    module = self._builder()
                for op, fn in self._fakes.items():  # a load that failed half-way may be retried
                    if not torch_compat.has_fake_kernel(f"kprof::{self.prefix}{op}"):
                        torch.library.register_fake(f"kprof::{self.prefix}{op}", fn)
                for op in self.ops:
                    setattr(self, op, _entry(module, f"kprof::{self.prefix}{op}"))
                self._loaded = True
        return True


def _entry(module: types.ModuleType | None, op: str) -> Callable:
    """How Python calls ``op``: ``module``'s eager entry for it, which Dynamo traces as the ``OpOverload``, where the
    module has one; else the ``OpOverload``."""
    namespace, name = op.split("::")
    overload = getattr(getattr(torch.ops, namespace), name).default
    make = getattr(module, "fast", None)
    entry = make(op, overload) if make is not None else None
    if entry is None:
        return overload

    def traced(*args):
        return overload(*args)

    torch.compiler.substitute_in_graph(entry, skip_signature_check=True)(traced)
    return entry
