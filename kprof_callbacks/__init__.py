"""kprof-callbacks: profile real PyTorch training, read it fast, measure custom layers.

Front doors: ``session`` (plain loops), ``ProfilerCallback`` (Lightning), ``compare`` and ``swap`` (custom
layers), ``summarize`` (trace files -> Summary) and ``time_cuda`` (CUDA-event timing of one function).
Every public name is imported on first use, so ``import kprof_callbacks`` costs nothing and reading traces (the CLI,
``summarize``, ``diff``, the TensorBoard tab) never imports torch or Lightning.
"""

from __future__ import annotations

import sys
import types

from ._lazy import lazy_names

# Public name -> the module defining it. Three share their name with a submodule (session, swap, compare): the
# package keeps the name for the function, as ``from kprof_callbacks import session`` promises (see _Package).
_NAMES = {
    "Comparison": ".compare",
    "ComparisonError": ".compare",
    "compare": ".compare",
    "ProfileConfig": ".config",
    "Session": ".session",
    "session": ".session",
    "swap": ".swap",
    "time_cuda": ".timing",
    "ProfilerCallback": ".callback",
    "SwapCallback": ".swap_callback",
    "summarize": ".analysis",
    "Summary": ".analysis",
    "diff": ".analysis",
    "Diff": ".analysis",
    "kernels": ".kernels",
}
__all__ = sorted(_NAMES)
_getattr, __dir__ = lazy_names(__name__, _NAMES, modules=("kernels",))


def __getattr__(name: str):
    if name == "__version__":
        from importlib.metadata import version

        globals()[name] = value = version("kprof-callbacks")  # on first use: importlib.metadata takes ~20 ms
        return value
    return _getattr(name)


class _Package(types.ModuleType):
    """The package module: importing a submodule that shares a public function's name (``kprof_callbacks.session``)
    would bind the submodule over the function; that binding is dropped, and the name stays the function's."""

    def __setattr__(self, name: str, value: object) -> None:
        if (
            isinstance(value, types.ModuleType)
            and value.__name__ == f"{__name__}.{name}"
            and name in _NAMES
            and name != "kernels"
        ):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
