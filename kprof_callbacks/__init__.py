"""kprof-callbacks: profile real PyTorch training, read it fast, measure custom layers.

Front doors: ``session`` (plain loops), ``ProfilerCallback`` (Lightning), ``compare`` and ``swap`` (custom
layers), ``summarize`` (trace files -> Summary) and ``time_cuda`` (CUDA-event timing of one function).
Heavy pieces (Lightning, the analysis, the kernels) are imported on first use, so ``import kprof_callbacks``
stays cheap inside a training script.
"""

from __future__ import annotations

import importlib
from importlib.metadata import version

from .compare import Comparison, ComparisonError, compare
from .config import ProfileConfig
from .session import Session, session
from .swap import swap
from .timing import time_cuda

__version__ = version("kprof-callbacks")

# Names whose module is heavy (Lightning) or builds on demand; none shares its name with a submodule, since
# ``import kprof_callbacks.<name>`` would then replace the function with the module.
_LAZY = {
    "ProfilerCallback": ".callback",
    "SwapCallback": ".swap_callback",
    "summarize": ".analysis",
    "Summary": ".analysis",
    "diff": ".analysis",
    "Diff": ".analysis",
    "kernels": ".kernels",
}

__all__ = [
    "Comparison", "ComparisonError", "ProfileConfig", "Session", "compare", "session", "swap", "time_cuda", *_LAZY
]


def __getattr__(name: str):
    if name in _LAZY:
        module = importlib.import_module(_LAZY[name], __name__)
        return module if name == "kernels" else getattr(module, name)
    raise AttributeError(f"module 'kprof_callbacks' has no attribute {name!r}")
