"""``kprof compare``: a model with and without ``kprof.swap``, timed and checked (the command's arguments are in
``kprof_callbacks/cli.py``)."""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable

import torch
from torch import nn

from .. import exits
from .check import ComparisonError
from .result import Comparison
from .run import compare


def run_cli(
    model: str,
    *,
    steps: int,
    warmup: int,
    device: str | None,
    logdir: str | None,
    check: str,
    impls: str = "",
    width: int,
    depth: int,
    batch_size: int,
    markdown: bool = False,
    fail_if_slower: float | None = None,
) -> int:
    """Compare ``model`` ('builtin' or MODULE:ATTR) with its ``kprof.swap`` copies (one per impl in the comma-separated
    ``impls``, or one choosing by device) and print the table (as Markdown with ``markdown``); exit status 0, 1 when
    a variant failed (its code raised, or the check), 2 for bad arguments, 3 when ``fail_if_slower`` is given and a
    variant is slower than the baseline by more than that many percent (``Comparison.regressed``)."""
    from ..config import ProfileConfig

    if logdir is not None:
        try:
            ProfileConfig.own_schedule(logdir=logdir)  # KPROF=maybe: said before any model is built
        except ValueError as exc:
            raise _bad_argument(str(exc)) from None
    swapped = _swapped_variants(impls)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if model == "builtin":
        net, step_fn, batches = _builtin_setup(device, width, depth, batch_size)
    else:
        net, step_fn, batches = _user_setup(model, device)
    try:
        result = compare(
            {"torch": net, **{name: functools.partial(make, net) for name, make in swapped.items()}},
            step_fn,
            batches,
            steps=steps,
            warmup=warmup,
            check={"raise": True, "warn": "warn", "off": False}[check],
            logdir=logdir,
            optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
            progress=sys.stderr.isatty(),
        )
    except ComparisonError as exc:
        print(f"kprof compare: check failed, nothing timed: {exc}")
        return exits.FAILED
    _print_result(result, markdown, bool(logdir))
    slower = [] if fail_if_slower is None else result.regressed(fail_if_slower)
    if slower:
        print(
            f"kprof compare: slower than {result.baseline} by more than {fail_if_slower:g}%: {', '.join(slower)}",
            file=sys.stderr,
        )
        return exits.REGRESSION
    return exits.OK if all(v.status == "ok" for v in result.variants.values()) else exits.FAILED


def _print_result(result: Comparison, markdown: bool, profiled: bool) -> None:
    """The table (as Markdown with ``markdown``), and where the profiled runs are to be seen when they were
    profiled (on stderr under Markdown, which is meant for a pull-request comment)."""
    from ..tensorboard.launch import open_hint

    print(result.to_markdown() if markdown else result)
    if profiled:
        print(open_hint(result.settings["logdir"]), file=sys.stderr if markdown else sys.stdout)
        print(
            "  the kprof tab shows this comparison, and each variant's profiled run",
            file=sys.stderr if markdown else sys.stdout,
        )


def _swapped_variants(impls: str) -> dict[str, Callable[[nn.Module], nn.Module]]:
    """Variant name -> the swap making it: "kprof.swap-<impl>" per impl named, else "kprof.swap" (kernels by device)."""
    from ..kernels import check_impl
    from ..swap import swap

    names = [name.strip() for name in impls.split(",") if name.strip()]
    try:
        for name in names:
            check_impl(name)
    except ValueError as exc:
        raise _bad_argument(f"--impls: {exc}") from None
    if not names:
        return {"kprof.swap": swap}
    return {f"kprof.swap-{name}": functools.partial(swap, impl=name) for name in names}


def _builtin_setup(device: str, width: int, depth: int, batch_size: int):
    """The demo's ToyModel on its synthetic task: 8 distinct batches, cycled."""
    from ..demo import ToyModel, synthetic_batches

    torch.manual_seed(0)
    model = ToyModel(width=width, depth=depth).to(device)
    return model, _cross_entropy_step, list(synthetic_batches(8, batch=batch_size, device=device))


def _cross_entropy_step(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def _user_setup(spec: str, device: str):
    """Import MODULE:ATTR and call it with the device; it must return (model, step_fn, batches)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise _bad_argument(f"--model must be 'builtin' or MODULE:ATTR, got {spec!r}")
    obj = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    setup = obj(device)
    if not (isinstance(setup, tuple) and len(setup) == 3 and isinstance(setup[0], nn.Module)):
        raise _bad_argument(f"--model: {spec}(device) must return (model, step_fn, batches)")
    return setup


def _bad_argument(message: str) -> SystemExit:
    """Exit status 2 (bad arguments, as argparse's), after saying why on stderr."""
    print(f"kprof compare: {message}", file=sys.stderr)
    return SystemExit(exits.USAGE)
