"""Timing the ops: every contender at every size, forward and forward + backward, and the rows as a Markdown table."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

import kprof_callbacks as kprof

from .. import peaks
from ..progress import Progress, ProgressArg
from .ops import Op, family, liger, min_bytes


def fwd_bwd(fn: Callable[..., torch.Tensor]) -> Callable[..., tuple[torch.Tensor, ...]]:
    """fn's forward and backward with a fixed incoming gradient; autograd.grad leaves no .grad to accumulate."""

    def run(*inputs: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.autograd.grad(fn(*inputs), inputs, grad)

    return run


def copy_ms(nbytes: int, device: str, timer: Callable) -> float:
    """Median time of a device-to-device copy that reads nbytes / 2 and writes nbytes / 2."""
    src = torch.empty(max(nbytes // 2, 1), dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    return timer(dst.copy_, src)


def run_benchmarks(
    ops: list[Op],
    sizes: dict,
    device: str,
    compile_ref: bool,
    triton: bool,
    warmup: int,
    iters: int,
    on_row: Callable[[list[dict]], None],
    progress: ProgressArg = False,
) -> list[dict]:
    """Time every op at every size (and its Triton twin when ``triton``, and Liger-Kernel's where it can run);
    ``on_row(rows so far)`` runs after each row (so a cut-short run keeps its rows). Each row is printed on stderr
    as it is measured, under a progress bar with ``progress=True`` (``kprof_callbacks.progress``)."""

    def timer(fn, *args, **kwargs) -> float:
        return kprof.time_cuda(fn, *args, warmup=warmup, iters=iters, device=device, **kwargs).median_ms

    spec_tbps = peaks.memory_tbps(torch.cuda.get_device_name()) if device == "cuda" else None
    rows = []
    meter = Progress(progress, 2 * sum(len(sizes[family(op)]) for op in ops), "kprof bench", unit="row")
    for op in ops:
        for dtype, shape in sizes[family(op)]:
            inputs = op.make(shape, dtype, device)
            contenders = {
                "ms": functools.partial(op.kernel, impl=None) if None in op.impls(triton) else None,
                "triton_ms": functools.partial(op.kernel, impl="triton") if "triton" in op.impls(triton) else None,
                "eager_ms": op.reference,
                "compile_ms": torch.compile(op.reference, dynamic=False) if compile_ref else None,
                "liger_ms": liger(op, device),
            }
            for backward in (False, True):
                row = {"op": op.name, "dtype": str(dtype).removeprefix("torch."), "shape": list(shape)}
                row.update(_timed(op, inputs, backward, contenders, timer, device))
                row["spec_gbps"] = spec_tbps * 1e3 if spec_tbps and op.memory_bound else None
                rows.append(row)
                meter.write(f"[kprof bench] {format_row(row)}")
                meter.add()
                on_row(rows)
            torch.compiler.reset()
    meter.close()
    return rows


def _timed(
    op: Op, inputs: list, backward: bool, contenders: dict[str, Callable | None], timer: Callable, device: str
) -> dict:
    """A row's measurements: each contender (None: not run) timed on ``inputs``, forward or forward + backward,
    and the bytes the op must move with the rates they give."""
    if backward:
        args = [t.detach().requires_grad_() for t in inputs]
        kwargs, wrap = {"grad": torch.randn_like(op.reference(*inputs))}, fwd_bwd
    else:
        args, kwargs, wrap = inputs, {}, (lambda f: f)
    times = {key: math.nan if fn is None else timer(wrap(fn), *args, **kwargs) for key, fn in contenders.items()}
    nbytes = min_bytes(op, inputs, backward)
    copy = copy_ms(nbytes, device, timer) if op.memory_bound else math.nan
    return {
        "pass": "fwd+bwd" if backward else "fwd",
        **times,
        "bytes": nbytes if op.memory_bound else None,
        "gbps": nbytes / times["ms"] / 1e6 if op.memory_bound else None,
        "copy_gbps": nbytes / copy / 1e6 if op.memory_bound else None,
    }


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


TABLE_HEADER = (
    "| op | dtype | shape | pass | kprof ms | GB/s | % of copy | % of spec | triton ms | triton % of copy "
    "| eager ms | compile ms | liger ms | kprof × best other | triton × best other |\n"
    "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def best_other_ms(r: dict) -> float:
    """The fastest of eager, ``torch.compile`` and Liger-Kernel on this row (the ones that ran)."""
    return min(r[key] for key in ("eager_ms", "compile_ms", "liger_ms") if not math.isnan(r.get(key, math.nan)))


def format_row(r: dict) -> str:
    """A table row; "× best other" is the fastest other's time over the kernel's (above 1: the kernel is faster)."""
    gbps, triton, best = r["gbps"], r.get("triton_ms", math.nan), best_other_ms(r)
    share = gbps / r["copy_gbps"] * 100 if gbps is not None else None
    spec = gbps / r["spec_gbps"] * 100 if gbps is not None and r.get("spec_gbps") else None
    triton_share = share * r["ms"] / triton if share is not None else None
    return (
        f"| {r['op']} | {r['dtype']} | {'x'.join(map(str, r['shape']))} | {r['pass']} | {r['ms']:.4f} | "
        f"{_fmt(gbps, '.0f')} | {_fmt(share, '.1f')} | {_fmt(spec, '.1f')} | {_fmt(triton, '.4f')} | "
        f"{_fmt(triton_share, '.1f')} | {r['eager_ms']:.4f} | {_fmt(r['compile_ms'], '.4f')} | "
        f"{_fmt(r.get('liger_ms', math.nan), '.4f')} | {best / r['ms']:.2f} | {_fmt(best / triton, '.2f')} |"
    )
