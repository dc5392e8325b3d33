"""Public names imported on first use (PEP 562), so importing a package costs only what its caller uses: reading
traces never imports torch through ``kprof_callbacks`` or ``kprof_callbacks.analysis``."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Collection, Mapping
from typing import Any


def lazy_names(
    package: str, names: Mapping[str, str], modules: Collection[str] = ()
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``names`` maps each public name to the module defining it
    (relative to the package); a name in ``modules`` is that module itself. Once imported, a name is kept in the
    package's namespace."""
    namespace = vars(sys.modules[package])

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(names[name], package)
        namespace[name] = value = module if name in modules else getattr(module, name)
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *names})

    return __getattr__, __dir__
