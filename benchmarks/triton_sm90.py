"""Compile every launch of kprof's Triton operators for an H100 (sm_90) on a machine without a GPU, and print each
kernel's registers per thread and stack (local memory) per thread, read from the cubin with the ``cuobjdump`` that
Triton's wheel bundles. A stack above 0 means spilled registers: slower, though correct.

A stand-in for the CUDA driver names sm_90 as Triton's target, CPU tensors pass the operators' device check, and each
launch compiles (``JITFunction.warmup``, Triton IR to cubin with the bundled ptxas) instead of running, with the
launch settings the operators choose (block, tile, warps). tests/test_kernels_triton.py uses the same machinery.

    python benchmarks/triton_sm90.py [--lengths 64 1000 4096 8192 16384] [--dtypes float32 bfloat16]

Run without TRITON_INTERPRET (the interpreter compiles nothing).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from collections.abc import Iterable

import torch
import triton
from triton.backends.compiler import GPUTarget

from kprof_callbacks import kernels
from kprof_callbacks.kernels import _triton


class H100Target:
    """The parts of Triton's CUDA driver that compiling asks for: an sm_90 target on device 0."""

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0


def as_on_an_h100():
    """Make Triton compile for sm_90 and let CPU tensors through kprof's device check; the Triton machinery module."""
    triton.runtime.driver.set_active(H100Target())
    machinery = _triton.require()
    if machinery.INTERPRETED:
        raise SystemExit("TRITON_INTERPRET is set: the interpreter compiles nothing; unset it")
    machinery.device_error = lambda device: None
    return machinery


def compile_every_launch(dtypes: Iterable[torch.dtype], lengths: Iterable[int]) -> list[tuple[object, object, dict]]:
    """(kernel, compiled kernel, launch settings) of every launch the Triton layers make, forward and backward, for
    inputs of 8 rows of each length in each dtype; nothing runs."""
    machinery = as_on_an_h100()
    launches = []

    def compile_launch(kernel, grid, *args, **meta):
        launches.append((kernel, kernel.warmup(*args, grid=grid, **meta), meta))

    machinery.launch = compile_launch
    for dtype in dtypes:
        for n in lengths:
            x, w = torch.randn(8, n, dtype=dtype, requires_grad=True), torch.randn(n, requires_grad=True)
            outs = [kernels.gelu(x, form, impl="triton") for form in ("none", "tanh")]
            outs += [kernels.bias_gelu(x, w.to(dtype), form, impl="triton") for form in ("none", "tanh")]
            outs += [
                kernels.swiglu(x, x, impl="triton"),
                kernels.layer_norm(x, n, w, w, impl="triton"),
                kernels.layer_norm(x, n, w, impl="triton"),
                kernels.rms_norm(x, n, w, impl="triton"),
            ]
            torch.autograd.grad(sum(o.float().sum() for o in outs), [x, w])
    return launches


def kernel_name(kernel) -> str:
    """``<module>.<function>`` of a Triton kernel, e.g. ``norm_triton._backward``."""
    return f"{kernel.fn.__module__.rsplit('.', 1)[-1]}.{kernel.fn.__name__}"


def resources(compiled) -> tuple[int, int]:
    """(registers per thread, stack bytes per thread) of a compiled kernel's cubin."""
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        out = subprocess.run([cuobjdump, "-res-usage", cubin.name], capture_output=True, text=True, check=True).stdout
    regs, stack = re.search(r"REG:(\d+) STACK:(\d+)", out).groups()
    return int(regs), int(stack)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        default=[64, 1000, 4096, 8192, 16384],
        help="row lengths (hidden sizes) to compile for",
    )
    parser.add_argument(
        "--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16", "float16"]
    )
    args = parser.parse_args(argv)
    rows = {}
    for kernel, compiled, meta in compile_every_launch([getattr(torch, d) for d in args.dtypes], args.lengths):
        settings = ", ".join(f"{k}={v}" for k, v in sorted(meta.items()))
        dtype = str(compiled.src.signature[kernel.arg_names[0]]).removeprefix("*")
        rows.setdefault((kernel_name(kernel), dtype, settings), resources(compiled))
    print(f"# Triton {triton.__version__}, torch {torch.__version__}, sm_90 (compiled without a GPU)\n")
    print("| kernel | first input | launch settings | registers | stack bytes |\n|---|---|---|---:|---:|")
    for (name, dtype, settings), (regs, stack) in sorted(rows.items()):
        print(f"| {name} | {dtype} | {settings} | {regs} | {stack} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
