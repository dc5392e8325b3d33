"""What the Triton twins share: how an operator is registered, its argument checks, launch settings, the
double-backward twin and autocast. Imported only through ``_triton.require`` (it imports triton).

Registration: with compiled kernels, ``torch.library.triton_op``, so torch.compile traces into the body and inductor
calls the Triton kernels from its own code. Under Triton's interpreter (``TRITON_INTERPRET=1`` before the kernels
load; CPU tensors, how CI runs them) torch cannot trace an interpreted kernel, so the same body is a
``torch.library.custom_op`` and also its own fake kernel: it checks and allocates as always and launches nothing on
fake tensors. Either way the operator has a schema, autograd (``register_autograd``) and torch's autocast policy.
"""

import contextlib
import functools
import math
from collections.abc import Callable, Sequence

import torch
import triton
from torch.library import wrap_triton

from .. import torch_compat
from ._norm import TRITON_MAX_COLS as MAX_ROW


@triton.jit
def _probe():
    pass  # never launched: what triton.jit made of it says whether TRITON_INTERPRET was on when the kernels loaded


INTERPRETED = not isinstance(_probe, triton.runtime.jit.JITFunction)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)

BLOCK = 1024  # elements per program of the elementwise kernels (inductor's pointwise default)
TILE = 4096  # elements per [rows, cols] tile of the row kernels
MAX_TILE_ROWS = 64
PROGRAMS_PER_SM = 2  # programs of the persistent backward kernels, each looping over tiles


def device_error(device: str) -> str | None:
    """None when the Triton kernels take tensors on ``device`` (a device type) in this process, else why not."""
    if device == "cuda" or INTERPRETED:
        return None
    return (
        f"the Triton kernels take CUDA tensors; {device} tensors run only in Triton's interpreter "
        "(TRITON_INTERPRET=1 in the environment before kprof loads the kernels)"
    )


def operator(fn: Callable) -> torch.library.CustomOpDef:
    """Registers ``fn`` (type-hinted, named ``<op>``; it checks, allocates and launches) as ``kprof::triton_<op>``."""
    name = f"kprof::triton_{fn.__name__}"
    if INTERPRETED:
        op = torch.library.custom_op(name, fn, mutates_args=())
        op.register_fake(fn)
        return op
    return torch.library.triton_op(name, fn, mutates_args=())


def launch(kernel: Callable, grid: tuple, *args: object, **meta: object) -> None:
    """``kernel[grid](*args, **meta)`` on the first tensor argument's device; nothing runs when that tensor is fake
    under the interpreter (the body running as its fake kernel)."""
    tensor = next(a for a in args if isinstance(a, torch.Tensor))
    if INTERPRETED and torch_compat.is_fake(tensor):
        return
    with torch.cuda.device(tensor.device) if tensor.is_cuda else contextlib.nullcontext():
        wrap_triton(kernel)[grid](*args, **meta)


def elementwise(kernel: Callable, n: int, *args: object, **meta: object) -> None:
    """``kernel`` (taking BLOCK) over ``n`` elements, BLOCK per program."""
    launch(kernel, (cdiv(n, BLOCK),), *args, BLOCK=BLOCK, num_warps=4, **meta)


# -- argument checks, before any launch (the C++ operators' rules and messages) ---------------------------------------
def checked(t: torch.Tensor, op: str, arg: str) -> torch.Tensor:
    """``t`` as the kernels read it (contiguous): float32/float16/bfloat16, on a device they take."""
    if t.dtype not in DTYPES:
        raise TypeError(f"{op}: {arg} is {dtype_name(t.dtype)} on {t.device}; supported: float32/float16/bfloat16")
    error = device_error(t.device.type)
    if error:
        raise ValueError(f"{op}: {arg} is on {t.device}: {error}")
    return t.contiguous()


def checked_like(
    a: torch.Tensor, b: torch.Tensor, op: str, arg: str, shape: Sequence[int] | None = None
) -> torch.Tensor:
    """``b`` checked as ``a``'s partner: ``shape`` (default: a's shape), a's dtype and device; made contiguous."""
    if b.dtype != a.dtype or b.device != a.device:
        raise TypeError(
            f"{op}: {arg} is {dtype_name(b.dtype)} on {b.device}, expected {dtype_name(a.dtype)} on {a.device}"
        )
    expected = list(a.shape if shape is None else shape)
    if list(b.shape) != expected:
        raise ValueError(f"{op}: {arg} has shape {list(b.shape)}, expected {expected}")
    return b.contiguous()


def norm_args(
    op: str,
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, int]:
    """A norm call checked: (x, weight, bias) contiguous and the row length n = prod(normalized_shape)."""
    shape = list(normalized_shape)
    if not shape or not all(d >= 1 for d in shape):
        raise ValueError(f"{op}: normalized_shape must be a non-empty list of positive sizes, got {shape}")
    x = checked(x, op, "x")
    if x.dim() < len(shape) or list(x.shape[x.dim() - len(shape) :]) != shape:
        raise ValueError(f"{op}: x of shape {list(x.shape)} does not end in normalized_shape {shape}")
    if not eps >= 0:
        raise ValueError(f"{op}: eps must be a number >= 0, got {eps:g}")
    weight = norm_param(op, "weight", x, shape, weight)
    if bias is not None:
        bias = norm_param(op, "bias", x, shape, bias)
        if bias.dtype != weight.dtype:
            raise TypeError(
                f"{op}: weight and bias dtypes differ: {dtype_name(weight.dtype)}, {dtype_name(bias.dtype)}"
            )
    n = math.prod(shape)
    if n > MAX_ROW:
        raise ValueError(
            f"{op}: the Triton kernels take rows of at most {MAX_ROW} elements, normalized_shape {shape} "
            f"has {n}; use impl='torch' for this layer"
        )
    return x, weight, bias, n


def norm_param(op: str, arg: str, x: torch.Tensor, shape: list[int], p: torch.Tensor) -> torch.Tensor:
    """A norm parameter: ``shape`` on x's device, in x's dtype or float32 for float16/bfloat16 x; contiguous."""
    if list(p.shape) != shape or p.device != x.device:
        raise ValueError(f"{op}: {arg} is {list(p.shape)} on {p.device}, expected {shape} on {x.device}")
    if not (p.dtype == x.dtype or (p.dtype == torch.float32 and x.dtype in (torch.float16, torch.bfloat16))):
        raise TypeError(
            f"{op}: {arg} dtype {dtype_name(p.dtype)} does not go with x dtype {dtype_name(x.dtype)} "
            "(use x's dtype, or float32 for float16/bfloat16 x)"
        )
    return p.contiguous()


def stat(op: str, arg: str, t: torch.Tensor, rows: int, x: torch.Tensor) -> torch.Tensor:
    """A saved per-row statistic (mean or rstd): float32 [rows] on x's device; contiguous."""
    if t.dim() != 1 or t.shape[0] != rows or t.device != x.device:
        raise ValueError(f"{op}: {arg} must have shape [{rows}] on {x.device}, got {list(t.shape)} on {t.device}")
    if t.dtype != torch.float32:
        raise TypeError(f"{op}: {arg} has dtype {dtype_name(t.dtype)}, expected float32")
    return t.contiguous()


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# -- launch settings ------------------------------------------------------------------------------------------------
# Plain integer math on the host: triton.cdiv and triton.next_power_of_2 are constexpr_functions, ~2.5 us of Python a
# call (Triton 3.9), several per layer call.
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 1 else 1


def warps(elements: int) -> int:
    """Warps for a program holding ``elements`` values per tensor (Liger-Kernel's calculate_settings)."""
    return 32 if elements >= 32768 else 16 if elements >= 8192 else 8 if elements >= 2048 else 4


def tile(cols: int, max_cols: int) -> tuple[int, int]:
    """(rows, cols) of a tile over rows of ``cols`` elements: a power of two of at most ``max_cols`` columns, and as
    many rows as make about TILE elements."""
    block_cols = min(next_power_of_2(int(cols)), max_cols)
    return max(1, min(MAX_TILE_ROWS, TILE // block_cols)), block_cols


def programs(x: torch.Tensor, tiles: int, columns: int = 1) -> int:
    """Row programs of a persistent kernel over ``tiles`` row tiles times ``columns`` column blocks: about
    PROGRAMS_PER_SM per SM of x's GPU in all (one SM off a GPU), at least one, so that every program writes its
    partial sums (zeros when it gets no tile)."""
    sms = _sm_count(x.device.index if x.device.index is not None else torch.cuda.current_device()) if x.is_cuda else 1
    return max(1, min(tiles, PROGRAMS_PER_SM * sms // columns))


@functools.cache
def _sm_count(device: int) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


# -- autograd and autocast ------------------------------------------------------------------------------------------
def records(*tensors: torch.Tensor | None) -> bool:
    """True when autograd records this computation: grad mode on (in a backward: create_graph=True) and a tensor
    requiring grad. A backward then computes with ``twin`` instead of its kernel."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def twin(
    reference: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor | None], grad: torch.Tensor
) -> tuple[torch.Tensor | None, ...]:
    """The gradients of ``reference(*inputs)`` for ``grad`` from differentiable PyTorch ops, in float32 for
    float16/bfloat16 (as the kernels accumulate): a backward's result when autograd records it, so second derivatives
    through a Triton layer are torch's. None for None inputs."""
    leaves = [t if t is None or t.requires_grad else t.detach().requires_grad_() for t in inputs]
    with torch.enable_grad():
        out = reference(*(None if t is None else _upcast(t) for t in leaves))
    grads = iter(torch.autograd.grad(out, [t for t in leaves if t is not None], _upcast(grad), create_graph=True))
    return tuple(None if t is None else next(grads) for t in leaves)


def _upcast(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def autocast_like(op: torch.library.CustomOpDef, twin_op: str) -> None:
    """Under autocast ``op`` runs as torch runs ``twin_op`` (``"aten::layer_norm"``) on each device: its floating
    inputs cast to float32 where torch gives the twin that policy, left alone where torch has none for it."""
    for device in ("cpu", "cuda"):
        if torch_compat.autocasts(twin_op, device):
            op.register_autocast(device, torch.float32)
