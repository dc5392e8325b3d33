"""Profiler ranges around the model's module calls, while a window records: ``kprof.module:<qualified name>``.

Two global forward hooks (``register_module_forward_pre_hook`` / ``register_module_forward_hook``) open and close a
range per call of a module of the model, named after ``model.named_modules()`` (``blocks.3.attn``; the root is ``""``;
``torch.compile``'s ``_orig_mod.`` left out); modules outside the model cost one dict lookup. The hooks exist only
while a window records, so a step outside windows runs no hook at all. Code that Dynamo traces sees hooks that do
nothing (``torch.compiler.is_compiling()``), so a compiled region records no range and puts none in its graph:
inductor's own record of each kernel (``graph_record``) names its modules instead. Around a compiled module's call
(``torch.compile(model)``, ``block.compile()``) the hooks run as they are: Dynamo compiles no frame of theirs.
"""

from __future__ import annotations

import inspect
import threading
import warnings
from collections.abc import Callable

from torch import nn
from torch.nn.modules import module as nn_module

from . import torch_compat
from .layout import MODULE_PREFIX as PREFIX  # every range's name starts so; the qualified name follows


def qualified_name(name: str) -> str:
    """A ``named_modules()`` name without ``torch.compile``'s ``_orig_mod`` parts."""
    return ".".join(part for part in name.split(".") if part and part != "_orig_mod")


def qualified_names(model: nn.Module) -> dict[int, str]:
    """``id(module)`` -> qualified name, for every module of ``model`` (a shared module keeps its first name)."""
    names: dict[int, str] = {}
    for name, module in model.named_modules():
        names.setdefault(id(module), qualified_name(name))
    return names


_ALWAYS_CALL = "always_call" in inspect.signature(nn_module.register_module_forward_hook).parameters
# torch warns that a compiled wrapper's own hooks fire too while global hooks exist: these do nothing for it
warnings.filterwarnings("ignore", message=r"Using `torch.compile\(module\)` when there are global hooks on modules")


class ModuleRanges:
    """The hooks of one model: ``start()`` at a window's start, ``stop()`` at its end."""

    def __init__(self, model: nn.Module) -> None:
        self._labels = {key: PREFIX + name for key, name in qualified_names(model).items()}
        self._handles: list = []
        self._local = threading.local()  # each thread's open ranges: its ``stack`` of [(module, range), ...]
        self._hooks = _hooks(self._labels, self._local)  # made once: the same functions in every window

    @property
    def active(self) -> bool:
        return bool(self._handles)

    def start(self) -> None:
        """Register the hooks (once)."""
        if self._handles:
            return
        enter, leave = self._hooks
        torch_compat.never_compiled_as_frames(enter, leave)
        post = {"always_call": True} if _ALWAYS_CALL else {}  # a forward that raises still closes its range
        self._handles = [
            nn_module.register_module_forward_pre_hook(enter),
            nn_module.register_module_forward_hook(leave, **post),
        ]

    def stop(self) -> None:
        """Remove the hooks; ranges a forward left open (it raised, without ``always_call``) are closed."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        stack = getattr(self._local, "stack", None)
        while stack:
            stack.pop()[1].__exit__(None, None, None)


def _hooks(labels: dict[int, str], local: threading.local) -> tuple[Callable, Callable]:
    """The pre- and post-hook of every module call: closures, so that each call reads only locals and cells (they
    run on every module call of the process while a window records: a few attribute lookups are a fair share)."""
    label_of, fast_range = labels.get, torch_compat.FastRange
    dynamo, compiler = torch_compat.is_dynamo_compiling, torch_compat.COMPILER

    def enter(module: nn.Module, args: tuple) -> None:
        if dynamo() or compiler._is_compiling_flag:  # torch.compiler.is_compiling(), at half the cost
            return
        label = label_of(id(module))
        if label is not None:
            rng = fast_range(label)
            rng.__enter__()
            try:
                local.stack.append((module, rng))
            except AttributeError:  # this thread's first range
                local.stack = [(module, rng)]

    def leave(module: nn.Module, args: tuple, output: object) -> None:
        if dynamo() or compiler._is_compiling_flag:
            return
        stack = getattr(local, "stack", None)
        if stack and stack[-1][0] is module:
            stack.pop()[1].__exit__(None, None, None)

    return enter, leave
