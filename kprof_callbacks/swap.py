"""``swap``: replace torch layers in a model with kprof's kernel layers, reporting what changed and why not.

The default mapping is a registry of torch layer type -> name of a class in ``kprof_callbacks.kernels``
(looked up at swap time, so a layer whose module is missing is reported, not fatal); adding a layer is
one line in ``DEFAULT_LAYERS``. Every kernel layer class provides ``from_module(torch_module, *, impl=None)``,
which keeps the parameters (shared, so state_dict keys and values are unchanged) and raises TypeError or
ValueError for configurations its kernels do not cover.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib
import logging
import warnings
from collections.abc import Callable, Mapping

from torch import nn

from .checks import check_bool
from .models import LMHead

logger = logging.getLogger(__name__)

DEFAULT_LAYERS: dict[type[nn.Module], str] = {
    nn.GELU: "GELU",
    nn.LayerNorm: "LayerNorm",
    nn.RMSNorm: "RMSNorm",
    LMHead: "LinearCrossEntropy",  # the output layer and loss of kprof's GPT (models.py): the fused loss
}

Factory = Callable[[nn.Module], nn.Module]


@dataclasses.dataclass(frozen=True)
class SwapEntry:
    """One matching module: where it sits, its torch type, and what became of it."""

    name: str
    source: str
    target: str | None
    reason: str = ""


@dataclasses.dataclass
class SwapReport:
    """What ``swap`` replaced and what it left alone (with the reason); attached to the returned
    model as ``kprof_swap_report``."""

    swapped: list[SwapEntry] = dataclasses.field(default_factory=list)
    skipped: list[SwapEntry] = dataclasses.field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"kprof.swap: {len(self.swapped)} swapped, {len(self.skipped)} skipped"]
        lines += [f"  swapped {e.name or '<root>'}: {e.source} -> {e.target}" for e in self.swapped]
        lines += [f"  skipped {e.name or '<root>'} ({e.source}): {e.reason}" for e in self.skipped]
        return "\n".join(lines)


def swap(
    model: nn.Module,
    mapping: Mapping[type[nn.Module], type[nn.Module] | Factory | str] | None = None,
    *,
    impl: str | None = None,
    inplace: bool = False,
    fallback: bool = False,
) -> nn.Module:
    """Replace every module whose type is a key of ``mapping`` (default: ``DEFAULT_LAYERS``) by the
    kernel layer built from it, and return the model (a deep copy unless ``inplace``).

    Mapping values: a class with ``from_module``, a callable taking the torch module, or the name of a
    class in ``kprof_callbacks.kernels``. Only exact type matches are swapped: a subclass may change
    ``forward``, so it is reported as skipped. ``impl`` picks the layers' implementation: None (the kernels of
    the input's device; under torch.compile, PyTorch's math, which inductor fuses with its neighbours), "cuda",
    "cpp", "triton" (the Triton twins) or "torch" (PyTorch's own op inside the kprof layer, to compare a model
    with itself); it reaches classes' ``from_module``, while a plain callable decides for itself. Each kernel
    layer's operators are built before this returns, so a compiler problem shows up here rather than
    mid-training; with ``fallback=True`` such layers keep their torch module (with a warning) instead of
    raising ``KernelBuildError``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    check_bool("inplace", inplace)
    check_bool("fallback", fallback)
    from .kernels import KernelBuildError, check_impl

    factories = _factories(DEFAULT_LAYERS if mapping is None else mapping, check_impl(impl))

    root = model if inplace else copy.deepcopy(model)
    report = SwapReport()
    replaced: dict[int, nn.Module | None] = {}  # id(torch module) -> its replacement; shared modules stay shared
    for name, module in list(root.named_modules(remove_duplicate=False)):
        if id(module) not in replaced:
            replaced[id(module)] = _swapped(name, module, factories, report, fallback, KernelBuildError)
        new = replaced[id(module)]
        if new is None:
            continue
        if not name:
            root = new
        else:
            parent_name, _, child = name.rpartition(".")
            setattr(root.get_submodule(parent_name), child, new)
    _log(report)
    root.kprof_swap_report = report
    return root


def _swapped(
    name: str,
    module: nn.Module,
    factories: dict[type[nn.Module], Factory],
    report: SwapReport,
    fallback: bool,
    build_error: type[Exception],
) -> nn.Module | None:
    """``module``'s replacement, or None: its type is no key of ``factories`` (a subclass of one is reported as
    skipped: its forward may differ), or its kernel layer could not be made (recorded in ``report``)."""
    source = type(module)
    if source in factories:
        return _replacement(name, module, factories[source], report, fallback, build_error)
    parent = next((t for t in factories if isinstance(module, t)), None)
    if parent is not None:
        reason = f"subclass of {_type_name(parent)} (its forward may differ)"
        report.skipped.append(SwapEntry(name, _type_name(source), None, reason))
    return None


def _log(report: SwapReport) -> None:
    for entry in report.skipped:
        logger.info("kprof.swap skipped %s (%s): %s", entry.name or "<root>", entry.source, entry.reason)
    logger.info(
        "kprof.swap replaced %d module(s): %s",
        len(report.swapped),
        ", ".join(f"{e.name or '<root>'} -> {e.target}" for e in report.swapped) or "none",
    )


def _type_name(cls: type) -> str:
    """``nn.GELU`` / ``kernels.GELU`` / ``models.LMHead`` for the libraries' layers, the qualified name otherwise."""
    for prefix, short in (
        ("torch.nn.", "nn"),
        ("kprof_callbacks.kernels", "kernels"),
        ("kprof_callbacks.models", "models"),
    ):
        if cls.__module__.startswith(prefix):
            return f"{short}.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def _replacement(
    name: str, module: nn.Module, factory: Factory, report: SwapReport, fallback: bool, build_error: type[Exception]
) -> nn.Module | None:
    """The kernel layer for ``module`` with its extension built, or None (recorded in ``report``)."""
    source = _type_name(type(module))
    try:
        new = factory(module)
        build = getattr(new, "build", None)
        if callable(build):
            build()  # cached per extension after the first layer
    except (TypeError, ValueError) as exc:
        report.skipped.append(SwapEntry(name, source, None, str(exc)))
        return None
    except build_error as exc:
        if not fallback:
            raise
        warnings.warn(f"kprof.swap: keeping {source} at {name or '<root>'}: kernel build failed: {exc}", stacklevel=3)
        report.skipped.append(SwapEntry(name, source, None, f"kernel build failed (fallback): {exc}"))
        return None
    report.swapped.append(SwapEntry(name, source, _type_name(type(new))))
    return new


def _factories(
    mapping: Mapping[type[nn.Module], type[nn.Module] | Factory | str], impl: str | None
) -> dict[type[nn.Module], Factory]:
    """Each mapping value as a callable torch module -> kernel module; names are looked up in kernels, and classes
    get ``impl`` (when one is asked for)."""
    if not isinstance(mapping, Mapping):
        raise TypeError(f"mapping must be a dict of nn.Module type -> layer, got {type(mapping).__name__}")
    factories: dict[type[nn.Module], Factory] = {}
    for source, target in mapping.items():
        if not (isinstance(source, type) and issubclass(source, nn.Module)):
            raise TypeError(f"mapping keys must be nn.Module subclasses, got {source!r}")
        if isinstance(target, str):
            factories[source] = _named_factory(target, impl)
        elif isinstance(target, type) and hasattr(target, "from_module"):
            factories[source] = target.from_module if impl is None else functools.partial(target.from_module, impl=impl)
        elif callable(target):
            factories[source] = target
        else:
            raise TypeError(
                f"mapping[{source.__name__}] must be a class with from_module, a callable or a "
                f"kernels class name, got {target!r}"
            )
    return factories


def _named_factory(name: str, impl: str | None) -> Factory:
    """``kernels.<name>.from_module``, resolved at first use; a missing class skips the layer (ValueError)."""

    def factory(module: nn.Module) -> nn.Module:
        kernels = importlib.import_module(".kernels", __package__)
        try:
            cls = getattr(kernels, name)
        except (AttributeError, ImportError) as exc:
            raise ValueError(f"kprof_callbacks.kernels.{name} is not available ({exc})") from exc
        return cls.from_module(module, impl=impl)

    return factory
