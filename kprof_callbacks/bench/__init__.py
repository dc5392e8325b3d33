"""Time kprof's kernels (square, add, GELU, bias + GELU, Linear + GELU, LayerNorm, RMSNorm, SwiGLU, and the fused
linear + cross-entropy in ``loss.py``) and their Triton twins against PyTorch eager and ``torch.compile`` of the
same reference, forward and forward + backward.

For each op and size: the median time (CUDA events, after warm-up), the bytes the op must move at least (each input
read once, each output written once) over that time, that rate as a share of a device-to-device ``copy_`` moving the
same bytes (measured here, the practical ceiling of a memory-bound kernel) and of the device's datasheet bandwidth
(``peaks.py``); the same for the Triton twin (``impl="triton"``, where the op has one and triton is installed); the
times of PyTorch eager, ``torch.compile`` of the same reference and, where it has the op and is installed (``pip
install 'kprof-callbacks[bench]'``), Liger-Kernel; and each kprof kernel's speedup over the best of those three.
Prints markdown tables; ``--out`` writes JSON with the device, versions and date.

    kprof bench [--quick] [--check] [--no-compile] [--no-triton] [--largest] [--shapes full|gpt]
                [--ops gelu,bias_gelu,linear_cross_entropy] [--out r.json]      (or python benchmarks/kernels.py)

``--quick`` runs small sizes on the CPU in seconds (CI smoke), without Triton columns (on the CPU they run in
Triton's interpreter, which times Python). ``--check`` runs every kernel (and Triton twin, on CUDA or under
TRITON_INTERPRET=1) forward and backward once on small odd shapes against float64 (run it under compute-sanitizer).
Progress goes to stderr; the tables go to stdout in one piece at the end.
"""

from __future__ import annotations

import datetime
import json
import platform
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from ..checks import UsageError
from ..kernels import _triton
from . import loss
from .check import check
from .ops import OPS, QUICK_SIZES, SHAPES, largest, liger_version
from .timing import TABLE_HEADER, format_row, run_benchmarks


def environment(device: str) -> dict:
    return {
        "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "liger_kernel": liger_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def run(
    *,
    quick: bool = False,
    check_only: bool = False,
    compile_ref: bool = True,
    triton: bool = True,
    largest_only: bool = False,
    ops: str = "",
    shapes: str = "full",
    out: Path | None = None,
) -> int:
    """Check or time the ops named in ``ops`` (comma-separated; all when empty) at ``shapes`` ("full": large
    shapes of every family; "gpt": the layers' shapes in GPT-2 small and medium), with their Triton twins when
    ``triton`` and they can run here; the exit status of ``kprof bench``."""
    names = [n for n in ops.split(",") if n]
    known = [op.name for op in OPS] + [loss.NAME]
    if set(names) - set(known):
        raise UsageError(f"--ops: unknown op(s) {sorted(set(names) - set(known))}; known: {','.join(known)}")
    if shapes not in SHAPES:
        raise UsageError(f"--shapes must be one of {tuple(SHAPES)}, got {shapes!r}")
    chosen, with_loss = [op for op in OPS if not names or op.name in names], not names or loss.NAME in names
    device = "cuda" if torch.cuda.is_available() and not quick else "cpu"
    triton = triton and _triton_runs(device, check_only)
    if check_only:
        return 0 if check(chosen, device, triton) & (not with_loss or loss.check(device)) else 1
    if device == "cuda" and liger_version() is None:
        print("[kprof bench] no Liger-Kernel columns: pip install 'kprof-callbacks[bench]'", file=sys.stderr)
    if device == "cpu" and not quick:
        raise UsageError("no CUDA device: use --quick (CPU smoke run) or --check")
    env = environment(device)
    record: dict = {**env, "rows": []}

    def save(key: str) -> Callable[[list[dict]], None]:
        def write(done: list[dict]) -> None:  # after each row, so a cut-short run keeps its rows
            record[key] = list(done)
            if out is not None:
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps(record, indent=1))

        return write

    sizes = QUICK_SIZES if quick else largest(SHAPES[shapes]) if largest_only else SHAPES[shapes]
    warmup, iters, compiled = (2, 5, False) if quick else (10, 50, compile_ref)
    rows = run_benchmarks(chosen, sizes, device, compiled, triton, warmup, iters, save("rows"), sys.stderr.isatty())
    loss_sizes = loss.sizes(quick, largest_only, shapes)
    loss_rows = loss.run_rows(loss_sizes, device, compiled, warmup, iters, save("loss_rows")) if with_loss else []
    liger_note = f", Liger-Kernel {env['liger_kernel']}" if env["liger_kernel"] else ""
    print(f"# kprof kernels on {env['device']} (torch {env['torch']}, CUDA {env['cuda']}{liger_note}, {env['date']})\n")
    for header, fmt, table in (
        (TABLE_HEADER, format_row, rows),
        (loss.TABLE_HEADER, loss.format_row, loss_rows),
    ):
        if table:
            print("\n".join([header, *map(fmt, table), ""]), flush=True)
    return 0


def _triton_runs(device: str, check_only: bool) -> bool:
    """Whether the Triton twins run (or are checked) here; why not on stderr."""
    why_not = (
        "on the CPU the Triton kernels run in Triton's interpreter, which times Python, not kernels"
        if device == "cpu" and not check_only
        else _triton.unavailable(device)
    )
    if why_not:
        print(f"[kprof bench] no Triton {'checks' if check_only else 'columns'}: {why_not}", file=sys.stderr)
    return why_not is None
