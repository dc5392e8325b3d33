"""``kernels.square``: x * x built with ``load_inline`` from the source strings below, as in the seed.

Two CUDA forwards are kept so their difference can be measured: ``grid2d`` is the seed's
``square_matrix_kernel`` (one thread per element on a 16 x 16 block grid over [rows, last dim]),
``vectorized`` a grid-stride kernel moving 16 bytes per access. The backward (2 * x * grad) is the
vectorized kernel for both.
"""

from __future__ import annotations

import functools
import types

import torch
from . import _build
from ._layer import KernelLayer, check_choice, check_impl, check_tensor, label, resolve_impl

VARIANTS = ("grid2d", "vectorized")
GRID2D_BLOCK = 16
GRID2D_MAX_ROWS = 65535 * GRID2D_BLOCK  # gridDim.y is at most 65535

CUDA_SOURCE = r"""
#include "_elementwise.cuh"

namespace {
using namespace kprof::elementwise;

// The seed's kernel, with a 64-bit index so matrices past 2^31 elements stay correct.
template <typename T>
__global__ void square_matrix_kernel(const T* matrix, T* result, int width, int height) {
  const int row = blockIdx.y * blockDim.y + threadIdx.y;
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (row < height && col < width) {
    const int64_t idx = static_cast<int64_t>(row) * width + col;
    const float v = to_float(matrix[idx]);
    result[idx] = from_float<T>(v * v);
  }
}

struct Square {
  __device__ float operator()(float x) const { return x * x; }
};

struct SquareBackward {
  __device__ float operator()(float dy, float x) const { return 2.f * x * dy; }
};
}  // namespace

extern "C" cudaError_t kprof_square_grid2d(int dtype, const void* x, void* y, int height, int width,
                                           cudaStream_t stream) {
  return with_dtype(dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    const dim3 threads_per_block(16, 16);
    const dim3 number_of_blocks((width + threads_per_block.x - 1) / threads_per_block.x,
                                (height + threads_per_block.y - 1) / threads_per_block.y);
    square_matrix_kernel<T><<<number_of_blocks, threads_per_block, 0, stream>>>(
        static_cast<const T*>(x), static_cast<T*>(y), width, height);
    return cudaGetLastError();
  });
}

extern "C" cudaError_t kprof_square_forward(int dtype, const void* x, void* y, int64_t n, cudaStream_t stream) {
  return with_dtype(dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    return map(stream, n, Square{}, static_cast<T*>(y), static_cast<const T*>(x));
  });
}

extern "C" cudaError_t kprof_square_backward(int dtype, const void* dy, const void* x, void* dx, int64_t n,
                                             cudaStream_t stream) {
  return with_dtype(dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    return map(stream, n, SquareBackward{}, static_cast<T*>(dx), static_cast<const T*>(dy),
               static_cast<const T*>(x));
  });
}
"""

CPP_SOURCE = r"""
#include "_binding.h"

#ifdef KPROF_WITH_CUDA
extern "C" {
cudaError_t kprof_square_grid2d(int dtype, const void* x, void* y, int height, int width, cudaStream_t stream);
cudaError_t kprof_square_forward(int dtype, const void* x, void* y, int64_t n, cudaStream_t stream);
cudaError_t kprof_square_backward(int dtype, const void* dy, const void* x, void* dx, int64_t n,
                                  cudaStream_t stream);
}
#endif

// y = x * x; on CUDA, grid2d picks the seed's 2-D kernel over [numel / last dim, last dim].
void square_forward(const at::Tensor& x, const at::Tensor& y, bool grid2d) {
  kprof::check_input(x, "kprof square", "x");
  kprof::check_same(x, y, "kprof square", "y");
  if (x.is_cuda() && grid2d) {
    const int64_t width = x.dim() == 0 ? 1 : x.size(-1);
    const int64_t height = width == 0 ? 0 : x.numel() / width;
    TORCH_CHECK_VALUE(height <= 65535 * 16 && width <= INT32_MAX, "kprof square: variant='grid2d' handles at most ",
                      65535 * 16, " rows of at most 2^31 - 1; got ", height, " x ", width, ": use 'vectorized'");
    if (x.numel() > 0) {
      KPROF_CUDA_CALL(x, "kprof square",
                      kprof_square_grid2d(kprof::dtype_code(x), x.const_data_ptr(), y.mutable_data_ptr(),
                                          static_cast<int>(height), static_cast<int>(width), kprof::current_stream()));
    }
    return;
  }
  if (x.is_cuda()) {
    KPROF_CUDA_CALL(x, "kprof square", kprof_square_forward(kprof::dtype_code(x), x.const_data_ptr(),
                    y.mutable_data_ptr(), x.numel(), kprof::current_stream()));
    return;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "kprof square", [&] {
    kprof::cpu_map(x.numel(), [](auto v) { return v * v; }, y.mutable_data_ptr<scalar_t>(),
                   x.const_data_ptr<scalar_t>());
  });
}

// grad_x = 2 * x * grad.
void square_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& dx) {
  kprof::check_input(x, "kprof square backward", "x");
  kprof::check_same(x, dy, "kprof square backward", "grad");
  kprof::check_same(x, dx, "kprof square backward", "grad_x");
  if (x.is_cuda()) {
    KPROF_CUDA_CALL(x, "kprof square backward", kprof_square_backward(kprof::dtype_code(x), dy.const_data_ptr(),
                    x.const_data_ptr(), dx.mutable_data_ptr(), x.numel(), kprof::current_stream()));
    return;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "kprof square backward", [&] {
    kprof::cpu_map(x.numel(), [](auto g, auto v) { return decltype(v)(2) * v * g; }, dx.mutable_data_ptr<scalar_t>(),
                   dy.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>());
  });
}
"""


@functools.cache
def _ext() -> types.ModuleType:
    return _build.load_inline("square", CPP_SOURCE, CUDA_SOURCE, ["square_forward", "square_backward"])


def _check_variant(variant: str) -> bool:
    """True for the seed's 2-D grid kernel."""
    return check_choice("variant", variant, VARIANTS) == "grid2d"


class SquareFunction(torch.autograd.Function):
    """x * x with kprof's kernels; saves x for the backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, grid2d: bool) -> torch.Tensor:
        ctx.save_for_backward(x)
        y = torch.empty_like(x)
        _ext().square_forward(x, y, grid2d)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (x,) = ctx.saved_tensors
        grad_x = torch.empty_like(x)
        _ext().square_backward(grad.contiguous(), x, grad_x)
        return grad_x, None


def square(x: torch.Tensor, *, variant: str = "vectorized", impl: str | None = None) -> torch.Tensor:
    """``torch.square`` with kprof kernels. A strided ``x`` is copied to contiguous memory first.
    ``variant`` ("vectorized" or the seed's "grid2d") picks the CUDA forward; ``impl``: None (by
    device), "cuda", "cpp" or "torch"."""
    grid2d = _check_variant(variant)
    x = check_tensor(x, "x", "kprof square")
    impl = resolve_impl(check_impl(impl), x, "kprof square")
    with label("square"):
        return torch.square(x) if impl == "torch" else SquareFunction.apply(x, grid2d)


class Square(KernelLayer):
    """``square`` as a module, so one model can run it with each variant and implementation."""

    _load = staticmethod(_ext)

    def __init__(self, *, variant: str = "vectorized", impl: str | None = None) -> None:
        super().__init__(impl)
        _check_variant(variant)
        self.variant = variant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return square(x, variant=self.variant, impl=self.impl)

    def extra_repr(self) -> str:
        return f"variant={self.variant!r}, {self.impl_repr()}"
