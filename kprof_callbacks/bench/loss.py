"""``kprof bench --ops linear_cross_entropy``: the fused linear + cross-entropy, forward + backward, timed and its peak
memory measured against the losses people use: eager PyTorch with float32 logits (nanoGPT's, and what autocast does)
and with bf16 logits, ``torch.compile`` of the first, and, where installed, Liger-Kernel's
``LigerFusedLinearCrossEntropyLoss`` and Apple's Cut Cross-Entropy (``cut_cross_entropy.linear_cross_entropy``, with
its default gradient filtering). Shapes: tokens x hidden x vocabulary of GPT-2 small and medium and of Llama 3's
vocabulary, bf16. Peak memory is what the call allocates beyond its inputs (gradients included), in GiB.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

import kprof_callbacks as kprof
from kprof_callbacks import kernels

NAME = "linear_cross_entropy"
# (tokens, hidden, vocab): GPT-2 small and medium at 8 x 512 tokens, and Llama 3's vocabulary at hidden 4096
SIZES = {
    "full": [(4096, 768, 50304), (4096, 1024, 50304), (4096, 4096, 128256)],
    "gpt": [(4096, 768, 50304), (4096, 1024, 50304), (16384, 768, 50304)],
}
QUICK_SIZES = [(256, 64, 1000)]
CHECK_SIZES = [(37, 24, 1009), (1, 8, 3), (130, 16, 4099)]
COLUMNS = ("eager_fp32", "eager_bf16", "compile", "liger", "cce")
TORCH_COLUMNS = ("eager_fp32", "eager_bf16", "compile")

Loss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def sizes(quick: bool, largest_only: bool, shapes: str) -> list[tuple[int, int, int]]:
    """The sizes ``kprof bench`` times: tiny with ``--quick``, the largest of ``shapes`` with ``--largest``."""
    return QUICK_SIZES if quick else SIZES[shapes][-1:] if largest_only else SIZES[shapes]


def _eager_fp32(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(F.linear(h, w).float(), t)


def _eager(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(F.linear(h, w), t)


def contenders(device: str, compile_ref: bool) -> dict[str, Loss | None]:
    """The losses timed, by column (None: not available here)."""
    out: dict[str, Loss | None] = {
        "kprof": lambda h, w, t: kernels.linear_cross_entropy(h, w, t),
        "eager_fp32": _eager_fp32,
        "eager_bf16": _eager,
        "compile": torch.compile(_eager_fp32, dynamic=False) if compile_ref else None,
        "liger": None,
        "cce": None,
    }
    if device == "cuda":
        try:
            from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

            liger = LigerFusedLinearCrossEntropyLoss()
            out["liger"] = lambda h, w, t: liger(w, h, t)
        except Exception as exc:  # noqa: BLE001 (not installed, or not importable beside this torch)
            print(f"[kprof bench] no Liger-Kernel column: {exc}", file=sys.stderr)
        try:
            from cut_cross_entropy import linear_cross_entropy as cce

            out["cce"] = lambda h, w, t: cce(h, w, t)
        except Exception as exc:  # noqa: BLE001
            print(f"[kprof bench] no Cut Cross-Entropy column: {exc}", file=sys.stderr)
    return out


def make(shape: tuple[int, int, int], dtype: torch.dtype, device: str) -> tuple[torch.Tensor, ...]:
    """hidden and weight (requiring grad; logits of a few units' spread) and targets of one size."""
    rows, width, vocab = shape
    hidden = torch.randn(rows, width, device=device, dtype=dtype, requires_grad=True)
    weight = (torch.randn(vocab, width, device=device) * 2 / width**0.5).to(dtype).requires_grad_()
    return hidden, weight, torch.randint(vocab, (rows,), device=device)


def measure(fn: Loss, inputs: tuple[torch.Tensor, ...], device: str, warmup: int, iters: int) -> tuple[float, float]:
    """(median ms, peak GiB beyond the inputs) of loss + d hidden + d weight; NaNs when the call fails (out of
    memory, a library that does not run here), said on stderr."""
    hidden, weight, target = inputs

    def step() -> tuple[torch.Tensor, ...]:
        return torch.autograd.grad(fn(hidden, weight, target), (hidden, weight))

    try:
        peak = math.nan
        if device == "cuda":
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            step()
            torch.cuda.synchronize()
            peak = (torch.cuda.max_memory_allocated() - base) / 2**30
        return kprof.time_cuda(step, warmup=warmup, iters=iters, device=device).median_ms, peak
    except Exception as exc:  # noqa: BLE001 (a contender's failure is a row's NaN, not the benchmark's end)
        print(f"[kprof bench] {NAME}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
        return math.nan, math.nan


def run_rows(sizes: list, device: str, compile_ref: bool, warmup: int, iters: int, on_row: Callable) -> list[dict]:
    """One row per size: each contender's time and peak memory, and kprof's speedups."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    fns = contenders(device, compile_ref)
    rows = []
    for shape in sizes:
        inputs = make(shape, dtype, device)
        row = {"op": NAME, "dtype": str(dtype).removeprefix("torch."), "shape": list(shape), "pass": "fwd+bwd"}
        for name, fn in fns.items():
            ms, peak = measure(fn, inputs, device, warmup, iters) if fn is not None else (math.nan, math.nan)
            row[f"{name}_ms" if name != "kprof" else "ms"] = ms
            row[f"{name}_peak_gib" if name != "kprof" else "peak_gib"] = peak
        best = min((row[f"{c}_ms"] for c in TORCH_COLUMNS if not math.isnan(row[f"{c}_ms"])), default=math.nan)
        row["best_torch_x"] = best / row["ms"]
        row["liger_x"] = row["liger_ms"] / row["ms"]
        rows.append(row)
        print(f"[kprof bench] {format_row(row)}", flush=True)
        on_row(rows)
        del inputs
        torch.compiler.reset()
    return rows


def _f(value: float, spec: str) -> str:
    return "—" if value is None or math.isnan(value) else format(value, spec)


TABLE_HEADER = (
    "| tokens x hidden x vocab | dtype | kprof ms | eager fp32 ms | eager bf16 ms | compile ms | liger ms | cce ms "
    "| kprof × best torch | kprof × liger | peak GiB: kprof / eager fp32 / eager bf16 / compile / liger / cce |\n"
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"
)


def format_row(r: dict) -> str:
    peaks = " / ".join(_f(r[key], ".2f") for key in ("peak_gib", *(f"{c}_peak_gib" for c in COLUMNS)))
    times = " | ".join(_f(r[f"{c}_ms"], ".3f") for c in COLUMNS)
    return (
        f"| {'x'.join(map(str, r['shape']))} | {r['dtype']} | {r['ms']:.3f} | {times} | "
        f"{_f(r['best_torch_x'], '.2f')} | {_f(r['liger_x'], '.2f')} | {peaks} |"
    )


def check(device: str) -> bool:
    """The fused loss and its gradients against float64 on small odd shapes, every dtype the device takes."""
    ok = True
    dtypes = [torch.float32, torch.bfloat16, torch.float16] if device == "cuda" else [torch.float32, torch.float64]
    tol = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 4e-2, torch.float16: 8e-3}
    for shape in CHECK_SIZES:
        for dtype in dtypes:
            hidden, weight, target = make(shape, dtype, device)
            target[2::5] = -100
            got = [kernels.linear_cross_entropy(hidden, weight, target, label_smoothing=0.1)]
            got += torch.autograd.grad(got[0], (hidden, weight))
            ref_in = [t.detach().double().requires_grad_() for t in (hidden, weight)]
            want = [F.cross_entropy(F.linear(*ref_in), target, label_smoothing=0.1)]
            want += torch.autograd.grad(want[0], ref_in)
            error = max(((g.double() - w).norm() / w.norm()).item() for g, w in zip(got, want, strict=True))
            passed = math.isfinite(error) and error < tol[dtype]
            ok &= passed
            print(
                f"{'ok  ' if passed else 'FAIL'} {NAME:24s} {str(dtype):15s} {str(shape):15s} max rel err {error:.2e}"
            )
    return ok
