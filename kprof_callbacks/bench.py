"""Time kprof's kernels (square, add, GELU, bias + GELU, Linear + GELU, LayerNorm, RMSNorm, SwiGLU, and the fused
linear + cross-entropy in ``bench_loss.py``) and their Triton twins against PyTorch eager and ``torch.compile`` of the
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

import dataclasses
import datetime
import functools
import importlib.metadata
import json
import math
import platform
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

import kprof_callbacks as kprof
from kprof_callbacks import bench_loss, kernels, peaks
from kprof_callbacks.kernels import _triton
from kprof_callbacks.progress import Progress, ProgressArg

Inputs = list[torch.Tensor]


@dataclasses.dataclass(frozen=True)
class Op:
    """One layer to time: its kernel call (taking ``impl=``), the PyTorch reference, and how to make inputs of a
    size."""

    name: str
    kernel: Callable[..., torch.Tensor]
    reference: Callable[..., torch.Tensor]
    make: Callable[[tuple[int, ...], torch.dtype, str], Inputs]
    memory_bound: bool = True  # False: a matmul dominates, so GB/s and % of copy mean nothing
    triton: bool = False  # has a Triton twin (impl="triton")
    liger: str | None = None  # the liger_kernel.transformers.functional function doing the same, if any

    def impls(self, triton: bool) -> tuple[str | None, ...]:
        """The kernel impls to run: the C++/CUDA one (None: by device), and "triton" when asked and there is one."""
        return (None, "triton") if triton and self.triton else (None,)


def _inputs(full: int, rows: int = 0) -> Callable[[tuple[int, ...], torch.dtype, str], Inputs]:
    """Inputs of ``full`` tensors of the size's shape, then ``rows`` of its last dimension (a bias, a norm's weight)."""

    def make(shape: tuple[int, ...], dtype: torch.dtype, device: str) -> Inputs:
        sizes = [shape] * full + [shape[-1:]] * rows
        return [torch.randn(size, dtype=dtype, device=device) for size in sizes]

    return make


_one, _two, _with_bias, _weight_bias = _inputs(1), _inputs(2), _inputs(1, 1), _inputs(1, 2)


def _linear(shape, dtype, device):
    rows, k, n = shape
    return [
        torch.randn(rows, k, dtype=dtype, device=device),
        torch.randn(n, k, dtype=dtype, device=device) / k**0.5,
        torch.randn(n, dtype=dtype, device=device),
    ]


OPS = [
    Op("square", kernels.square, torch.square, _one),
    Op("square-grid2d", lambda x, impl=None: kernels.square(x, variant="grid2d", impl=impl), torch.square, _one),
    Op("add", kernels.add, torch.add, _two),
    Op("gelu", kernels.gelu, F.gelu, _one, triton=True),
    Op(
        "gelu-tanh",
        lambda x, impl=None: kernels.gelu(x, "tanh", impl=impl),
        lambda x: F.gelu(x, approximate="tanh"),
        _one,
        triton=True,
    ),
    Op("bias_gelu", kernels.bias_gelu, lambda x, b: F.gelu(x + b), _with_bias, triton=True),
    Op(
        "bias_gelu-tanh",
        lambda x, b, impl=None: kernels.bias_gelu(x, b, "tanh", impl=impl),
        lambda x, b: F.gelu(x + b, approximate="tanh"),
        _with_bias,
        triton=True,
    ),
    Op(
        "linear_gelu",
        lambda x, w, b, impl=None: kernels.bias_gelu(F.linear(x, w), b, impl=impl),
        lambda x, w, b: F.gelu(F.linear(x, w, b)),
        _linear,
        memory_bound=False,
        triton=True,
    ),
    Op(
        "layer_norm",
        lambda x, w, b, impl=None: kernels.layer_norm(x, x.shape[-1], w, b, impl=impl),
        lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b),
        _weight_bias,
        triton=True,
        liger="liger_layer_norm",
    ),
    Op(
        "rms_norm",
        lambda x, w, impl=None: kernels.rms_norm(x, x.shape[-1], w, impl=impl),
        lambda x, w: F.rms_norm(x, x.shape[-1:], w),
        _with_bias,
        triton=True,
        liger="liger_rms_norm",
    ),
    Op("swiglu", kernels.swiglu, lambda g, u: F.silu(g) * u, _two, triton=True, liger="liger_swiglu"),
]
# The eps of kprof's and torch's norms, given to Liger's (which has no default); Liger's own defaults otherwise
# (RMSNorm: "llama" casting, gradient written in place of the incoming one, as in the models it patches).
LIGER_ARGS = {"liger_layer_norm": (1e-5,), "liger_rms_norm": (torch.finfo(torch.float32).eps,)}


def liger(op: Op, device: str) -> Callable[..., torch.Tensor] | None:
    """Liger-Kernel's function for ``op`` when it has one and can run here (installed, CUDA), else None."""
    if op.liger is None or device != "cuda" or liger_version() is None:
        return None
    from liger_kernel.transformers import functional

    fn, extra = getattr(functional, op.liger), LIGER_ARGS.get(op.liger, ())
    return lambda *inputs: fn(*inputs, *extra)


def liger_version() -> str | None:
    try:
        return importlib.metadata.version("liger-kernel")
    except importlib.metadata.PackageNotFoundError:
        return None


# (dtype, shape) per op family; [rows, cols] for the elementwise ops (grid2d's 2-D view), all > L2.
FULL_SIZES = {
    "elementwise": [(torch.float32, (4096, 4096)), (torch.float32, (16384, 16384)), (torch.bfloat16, (16384, 16384))],
    "bias": [(torch.float32, (8192, 4096)), (torch.float32, (32768, 8192)), (torch.bfloat16, (32768, 8192))],
    "linear": [(torch.bfloat16, (16384, 4096, 4096))],
    "norm": [
        (torch.float32, (16384, 1024)),
        (torch.float32, (16384, 4096)),
        (torch.bfloat16, (16384, 1024)),
        (torch.bfloat16, (16384, 4096)),
    ],
}
# The layers' shapes inside GPT-2 small (hidden 768) and medium (1024) at 4096 and 16384 tokens a step: rows of
# hidden (norms), rows of 4 x hidden (GELU after c_fc), and c_fc itself for Linear + GELU; fp32 norms are the residual
# stream under bf16 autocast (torch's autocast runs layer_norm in float32).
GPT_SIZES = {
    "elementwise": [(torch.bfloat16, (rows, 4 * h)) for h in (768, 1024) for rows in (4096, 16384)],
    "bias": [(torch.bfloat16, (rows, 4 * h)) for h in (768, 1024) for rows in (4096, 16384)],
    "linear": [(torch.bfloat16, (rows, h, 4 * h)) for h in (768, 1024) for rows in (4096, 16384)],
    "norm": [
        (dtype, (rows, h)) for dtype in (torch.float32, torch.bfloat16) for h in (768, 1024) for rows in (4096, 16384)
    ],
}
SHAPES = {"full": FULL_SIZES, "gpt": GPT_SIZES}
QUICK_SIZES = {
    "elementwise": [(torch.float32, (256, 1000))],
    "bias": [(torch.float32, (256, 1000))],
    "linear": [(torch.float32, (256, 128, 256))],
    "norm": [(torch.float32, (256, 1000))],
}
CHECK_SHAPES = {
    "elementwise": [(3, 1001), (1,)],
    "bias": [(3, 1001), (5, 64)],
    "linear": [(7, 24, 40)],
    "norm": [(3, 1001), (37, 520), (5, 64), (2, 8192)],
}
CHECK_DTYPES = [torch.float32, torch.bfloat16, torch.float16]
CPU_CHECK_DTYPES = {None: [torch.float32, torch.float64], "triton": [torch.float32]}  # Triton takes no float64
CHECK_TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 3e-3}


def largest(sizes: dict) -> dict:
    """Per family, the largest shape of each dtype."""
    out = {}
    for fam, entries in sizes.items():
        best: dict[torch.dtype, tuple] = {}
        for dtype, shape in entries:
            if dtype not in best or math.prod(shape) > math.prod(best[dtype]):
                best[dtype] = shape
        out[fam] = list(best.items())
    return out


def family(op: Op) -> str:
    if op.name.endswith("_norm"):
        return "norm"
    return "linear" if op.name.startswith("linear") else "bias" if op.name.startswith("bias") else "elementwise"


def min_bytes(op: Op, inputs: Inputs, backward: bool) -> int:
    """Bytes the op must move: inputs read and outputs written once; the backward reads grad and the saved
    input(s) and writes one gradient per differentiable input (add's gradients are the incoming grad itself)."""
    size = [t.numel() * t.element_size() for t in inputs]
    out = size[0]
    forward = sum(size) + out
    if not backward:
        return forward
    if op.name == "add":
        return forward
    return forward + out + sum(size) + sum(size)  # grad in, saved inputs re-read, input gradients out


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
            grads = [t.detach().requires_grad_() for t in inputs]
            dy = torch.randn_like(op.reference(*inputs))
            compiled = torch.compile(op.reference, dynamic=False) if compile_ref else None
            theirs = liger(op, device)
            for backward in (False, True):
                args, kwargs = (grads, {"grad": dy}) if backward else (inputs, {})
                wrap = fwd_bwd if backward else (lambda f: f)
                ours, tri = (
                    timer(wrap(functools.partial(op.kernel, impl=impl)), *args, **kwargs)
                    if impl in op.impls(triton)
                    else math.nan
                    for impl in (None, "triton")
                )
                eager = timer(wrap(op.reference), *args, **kwargs)
                comp = timer(wrap(compiled), *args, **kwargs) if compiled is not None else math.nan
                lig = timer(wrap(theirs), *args, **kwargs) if theirs is not None else math.nan
                nbytes = min_bytes(op, inputs, backward)
                copy = copy_ms(nbytes, device, timer) if op.memory_bound else math.nan
                row = {
                    "op": op.name,
                    "dtype": str(dtype).removeprefix("torch."),
                    "shape": list(shape),
                    "pass": "fwd+bwd" if backward else "fwd",
                    "ms": ours,
                    "eager_ms": eager,
                    "compile_ms": comp,
                    "triton_ms": tri,
                    "liger_ms": lig,
                    "bytes": nbytes if op.memory_bound else None,
                    "gbps": nbytes / ours / 1e6 if op.memory_bound else None,
                    "copy_gbps": nbytes / copy / 1e6 if op.memory_bound else None,
                    "spec_gbps": spec_tbps * 1e3 if spec_tbps and op.memory_bound else None,
                }
                rows.append(row)
                meter.write(f"[kprof bench] {format_row(row)}")
                meter.add()
                on_row(rows)
            torch.compiler.reset()
    meter.close()
    return rows


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


def environment(device: str) -> dict:
    return {
        "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "liger_kernel": liger_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def check(ops: list[Op], device: str, triton: bool) -> bool:
    """Every kernel (and Triton twin when ``triton``) forward and backward once on small odd shapes, against float64;
    True when all pass."""
    ok = True
    for op in ops:
        for impl in op.impls(triton):
            kernel = functools.partial(op.kernel, impl=impl)
            for shape in CHECK_SHAPES[family(op)]:
                for dtype in CHECK_DTYPES if device == "cuda" else CPU_CHECK_DTYPES[impl]:
                    passed, error = _check_one(op, kernel, shape, dtype, device)
                    ok &= passed
                    name = op.name + (" (triton)" if impl else "")
                    print(
                        f"{'ok  ' if passed else 'FAIL'} {name:24s} {str(dtype):15s} {str(shape):15s} "
                        f"max rel err {error:.2e}",
                        flush=True,
                    )
    if device == "cuda":
        torch.cuda.synchronize()
    return ok


def _check_one(
    op: Op, kernel: Callable[..., torch.Tensor], shape: tuple[int, ...], dtype: torch.dtype, device: str
) -> tuple[bool, float]:
    """(passed, the largest relative error) of kernel's output and input gradients against float64."""
    inputs = [t.requires_grad_() for t in op.make(shape, dtype, device)]
    out = kernel(*inputs)
    dy = torch.randn_like(out)
    got = [out, *torch.autograd.grad(out, inputs, dy)]
    ref_inputs = [t.detach().double().requires_grad_() for t in inputs]
    ref_out = op.reference(*ref_inputs)
    want = [ref_out, *torch.autograd.grad(ref_out, ref_inputs, dy.double())]
    errors = [((g.double() - w).norm() / (w.norm() + 1e-6)).item() for g, w in zip(got, want, strict=True)]
    tol = CHECK_TOL.get(dtype, 1e-10) * (20 if op.name.startswith("linear") else 4)
    return all(math.isfinite(e) and e < tol for e in errors), max(errors)


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
    known = [op.name for op in OPS] + [bench_loss.NAME]
    if set(names) - set(known):
        raise ValueError(f"--ops: unknown op(s) {sorted(set(names) - set(known))}; known: {','.join(known)}")
    if shapes not in SHAPES:
        raise ValueError(f"--shapes must be one of {tuple(SHAPES)}, got {shapes!r}")
    chosen, loss = [op for op in OPS if not names or op.name in names], not names or bench_loss.NAME in names
    device = "cuda" if torch.cuda.is_available() and not quick else "cpu"
    triton = triton and _triton_runs(device, check_only)
    if check_only:
        return 0 if check(chosen, device, triton) & (not loss or bench_loss.check(device)) else 1
    if device == "cuda" and liger_version() is None:
        print("[kprof bench] no Liger-Kernel columns: pip install 'kprof-callbacks[bench]'", file=sys.stderr)
    if device == "cpu" and not quick:
        raise ValueError("no CUDA device: use --quick (CPU smoke run) or --check")
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
    loss_sizes = bench_loss.sizes(quick, largest_only, shapes)
    loss_rows = bench_loss.run_rows(loss_sizes, device, compiled, warmup, iters, save("loss_rows")) if loss else []
    liger_note = f", Liger-Kernel {env['liger_kernel']}" if env["liger_kernel"] else ""
    print(f"# kprof kernels on {env['device']} (torch {env['torch']}, CUDA {env['cuda']}{liger_note}, {env['date']})\n")
    for header, fmt, table in (
        (TABLE_HEADER, format_row, rows),
        (bench_loss.TABLE_HEADER, bench_loss.format_row, loss_rows),
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
