"""Step time of a real model with and without ``kprof.swap``: the GPT of ``kprof_callbacks.models`` (GPT-2 small,
124M parameters, batch 8 x 512 tokens on a GPU; the tiny config on a CPU), AdamW, in eager fp32, eager bf16
autocast and ``torch.compile`` (bf16 autocast), each timed through ``kprof.compare``.

A bf16 step of this model on an H100 is host-bound (the GPU idles most of the step), so what a swapped layer costs
the host per call decides the step time as much as its kernel does. Target: the swapped model is never slower.
``compare``'s check runs too, without a tolerance: each variant against a float64 run of the torch model, the
swapped one held to twice torch's own error (bf16 autocast included).

    python benchmarks/real_model.py [--quick] [--modes fp32,bf16,compile] [--impl auto,cuda] [--steps 50]
                                    [--out r.json] [--logdir DIR]

``--impl`` names the swapped variants, one per ``kprof.swap(impl=)``: ``auto`` (impl=None: the device's C++/CUDA
kernels in eager; torch's math, which inductor fuses, under torch.compile), ``cuda``/``cpp`` (the kernels, also when
compiled: opaque operators inductor cannot fuse across), ``triton`` or ``torch``. ``--out`` writes the rows with the
device, versions and date (the results of record live in ``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

import kprof_callbacks as kprof
from kprof_callbacks import kernels, models

MODES = ("fp32", "bf16", "compile")


def step_fn(device: str, autocast: bool) -> Callable[[nn.Module, tuple], torch.Tensor]:
    """compare's step: the forward and loss (compare runs backward and the optimizer step), under bf16 autocast."""

    def step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        context = torch.autocast(device, dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
        with context:
            return model(*batch)

    return step


def variant_name(impl: str) -> str:
    return "kprof" if impl == "auto" else f"kprof-{impl}"


def run_mode(
    mode: str,
    cfg: models.GPTConfig,
    batch: int,
    device: str,
    steps: int,
    warmup: int,
    impls: list[str],
    logdir: Path | None = None,
) -> kprof.Comparison:
    """torch against ``kprof.swap(impl=...)`` for each impl ("auto": impl=None), timed and checked in one compare."""
    torch.manual_seed(0)
    model = models.GPT(cfg).to(device)
    variants: dict[str, nn.Module] = {"torch": model}
    for impl in impls:
        variants[variant_name(impl)] = swapped = kprof.swap(model, impl=None if impl == "auto" else impl)
    print(swapped.kprof_swap_report, file=sys.stderr, flush=True)
    torch.compiler.reset()
    return kprof.compare(
        variants,
        step_fn(device, autocast=mode != "fp32"),
        models.random_batches(cfg, 4, batch, device),
        steps=steps,
        warmup=warmup,
        compile=mode == "compile",
        optimizer=lambda params: torch.optim.AdamW(params, lr=3e-4),
        check="warn",  # a failed check still times
        logdir=None if logdir is None else logdir / mode,
    )


def rows(mode: str, result: kprof.Comparison) -> list[dict]:
    """One row per swapped variant of ``mode``: step times, speedup over torch with its interval, verdict, check."""
    base = result["torch"].timing
    out = []
    for name, run in result.variants.items():
        if name == "torch":
            continue
        out.append(
            {
                "mode": mode,
                "variant": name,
                "torch_ms": base.median_ms if base else None,
                "kprof_ms": run.timing.median_ms if run.timing else None,
                "speedup": run.speedup,
                "ci": list(run.ci) if run.ci else None,
                "verdict": run.verdict or run.error,
                "check": run.check_detail,
            }
        )
    return out


def _ms(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "-"


def table(rows: list[dict]) -> str:
    lines = [
        "| mode | variant | torch ms/step | variant ms/step | speedup [95% CI] | verdict | check |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for r in rows:
        ci = f" [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}]" if r["ci"] else ""
        speedup = f"{r['speedup']:.3f}{ci}" if r["speedup"] is not None else "-"
        lines.append(
            f"| {r['mode']} | {r['variant']} | {_ms(r['torch_ms'])} | {_ms(r['kprof_ms'])} | {speedup} | "
            f"{r['verdict']} | {r['check']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="20 timed steps after 3 warm-up (compile needs them)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {MODES}")
    parser.add_argument(
        "--impl",
        default="auto",
        help="comma-separated kprof.swap impls, one variant each: auto "
        f"(impl=None: the device's kernels; torch's math under torch.compile) or of {kernels.IMPLS}",
    )
    parser.add_argument("--steps", type=int, default=50, help="timed steps per variant (default: 50)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, help="also write the rows and the full comparisons as JSON here")
    parser.add_argument(
        "--logdir",
        type=Path,
        help="also profile each variant into LOGDIR/<mode>/<variant> "
        "(then: kprof diff LOGDIR/bf16/torch LOGDIR/bf16/kprof)",
    )
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - set(MODES):
        parser.error(f"--modes: choose from {MODES}, got {args.modes!r}")
    impls = [i for i in args.impl.split(",") if i]
    if not impls or set(impls) - {"auto", *kernels.IMPLS}:
        parser.error(f"--impl: choose from auto,{','.join(kernels.IMPLS)}, got {args.impl!r}")
    cfg, batch = (models.gpt2_small(), 8) if args.device == "cuda" else (models.tiny(), 4)
    steps, warmup = (20, 3) if args.quick else (args.steps, 5)
    results, table_rows = {}, []
    for mode in modes:
        print(f"[real_model] {mode} ...", file=sys.stderr, flush=True)
        result = run_mode(mode, cfg, batch, args.device, steps, warmup, impls, args.logdir)
        print(result, file=sys.stderr, flush=True)
        table_rows += rows(mode, result)
        results[mode] = result.to_dict()
    first = results[modes[0]]
    print(
        f"# GPT ({cfg.n_layer} x {cfg.n_embd}, vocab {cfg.vocab_size}, batch {batch} x {cfg.block_size}) on "
        f"{first['device']}, AdamW; kprof.compare median step time, {steps} timed steps per variant\n"
    )
    print(table(table_rows), flush=True)
    if args.out is not None:
        record = {
            "device": first["device"],
            "versions": first.get("versions"),
            "steps": steps,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "model": dataclasses.asdict(cfg),
            "batch": batch,
            "rows": table_rows,
            "comparisons": results,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
