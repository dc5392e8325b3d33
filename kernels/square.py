"""``kernels.square``: x * x built with ``load_inline`` from the source strings below, as in the seed.

Two CUDA forwards are kept so their difference can be measured: ``grid2d`` is the seed's
``square_matrix_kernel`` (one thread per element on a 16 x 16 block grid over [rows, last dim]),
``vectorized`` a grid-stride kernel moving 16 bytes per access. The backward (2 * x * grad) is the
vectorized kernel for both. The operators are ``torch.ops.kprof.square`` and ``square_backward``.
"""

from __future__ import annotations

import torch

from . import _build
from ._layer import KernelLayer, Kernels, check_choice, use_reference
from ._library import OpLibrary

VARIANTS = ("grid2d", "vectorized")

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
// kprof::square(x, variant) and kprof::square_backward(grad, x): CPU kernels here, the CUDA launchers in
// CUDA_SOURCE, autograd and the registration (see _dispatch.h).
#include "_dispatch.h"
#include "_op.h"

#ifdef KPROF_WITH_CUDA
extern "C" {
cudaError_t kprof_square_grid2d(int dtype, const void* x, void* y, int height, int width, cudaStream_t stream);
cudaError_t kprof_square_forward(int dtype, const void* x, void* y, int64_t n, cudaStream_t stream);
cudaError_t kprof_square_backward(int dtype, const void* dy, const void* x, void* dx, int64_t n,
                                  cudaStream_t stream);
}
#endif

namespace {

using torch::autograd::variable_list;

constexpr const char* kOp = "kprof square";

// True for the seed's 2-D grid kernel; a ValueError for anything but the two variants.
bool grid2d_variant(c10::string_view variant) {
  TORCH_CHECK_VALUE(variant == "vectorized" || variant == "grid2d", kprof::msg(kOp,
                    ": variant must be 'vectorized' or 'grid2d', got '", variant, "'"));
  return variant == "grid2d";
}

// y = x * x; on CUDA, grid2d runs the seed's 2-D kernel over [numel / last dim, last dim].
at::Tensor square(const at::Tensor& input, c10::string_view variant) {
  const bool grid2d = grid2d_variant(variant);
  const at::Tensor x = kprof::checked(input, kOp, "x");
  at::Tensor y = kprof::empty_like(x);
  if (x.is_cuda() && grid2d) {
    const int64_t width = x.dim() == 0 ? 1 : x.size(-1);
    const int64_t height = width == 0 ? 0 : x.numel() / width;
    TORCH_CHECK_VALUE(height <= 65535 * 16 && width <= INT32_MAX, kprof::msg(kOp, ": variant='grid2d' handles at most ",
                      65535 * 16, " rows of at most 2^31 - 1; got ", height, " x ", width, ": use 'vectorized'"));
    if (x.numel() > 0) {
      KPROF_CUDA_CALL(x, kOp, kprof_square_grid2d(kprof::dtype_code(x), x.const_data_ptr(), y.mutable_data_ptr(),
                                                  static_cast<int>(height), static_cast<int>(width),
                                                  kprof::current_stream()));
    }
    return y;
  }
  if (x.is_cuda()) {
    KPROF_CUDA_CALL(x, kOp, kprof_square_forward(kprof::dtype_code(x), x.const_data_ptr(), y.mutable_data_ptr(),
                                                 x.numel(), kprof::current_stream()));
    return y;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), kOp, [&] {
    kprof::cpu_map(x.numel(), [](auto v) { return v * v; }, y.mutable_data_ptr<scalar_t>(),
                   x.const_data_ptr<scalar_t>());
  });
  return y;
}

// grad_x = 2 * x * grad.
at::Tensor square_backward(const at::Tensor& grad, const at::Tensor& input) {
  const at::Tensor x = kprof::checked(input, kOp, "x");
  const at::Tensor dy = kprof::checked_like(x, grad, kOp, "grad");
  at::Tensor dx = kprof::empty_like(x);
  if (x.is_cuda()) {
    KPROF_CUDA_CALL(x, kOp, kprof_square_backward(kprof::dtype_code(x), dy.const_data_ptr(), x.const_data_ptr(),
                                                  dx.mutable_data_ptr(), x.numel(), kprof::current_stream()));
    return dx;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), kOp, [&] {
    kprof::cpu_map(x.numel(), [](auto g, auto v) { return decltype(v)(2) * v * g; }, dx.mutable_data_ptr<scalar_t>(),
                   dy.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>());
  });
  return dx;
}

const auto& square_op() { return kprof::op<square>("kprof::square"); }
const auto& square_backward_op() { return kprof::op<square_backward>("kprof::square_backward"); }

variable_list square_grads(const at::Tensor& grad, const std::array<at::Tensor, 1>& saved, const kprof::NoConsts&) {
  return {square_backward_op().call(grad, saved[0])};
}

at::Tensor square_autograd(const at::Tensor& x, c10::string_view variant) {
  at::Tensor y = kprof::call_below_autograd(square_op(), x, variant);
  if (!kprof::records(x)) return y;
  return kprof::recorded(std::move(y), "kprof::SquareBackward", square_grads, kprof::NoConsts{}, std::array{x}, x);
}

// The fast kernel, or under create_graph its twin from differentiable ATen ops.
at::Tensor square_backward_autograd(const at::Tensor& grad, const at::Tensor& x) {
  if (kprof::records(grad, x)) return grad * (x * 2);
  return kprof::call_below_autograd(square_backward_op(), grad, x);
}

void kernels(torch::Library& m) {
  m.impl("square", &square);
  m.impl("square_backward", &square_backward);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kprof, m) {
  const std::vector<at::Tag> tags{at::Tag::pt2_compliant_tag};
  m.def("square(Tensor x, str variant='vectorized') -> Tensor", tags);
  m.def("square_backward(Tensor grad, Tensor x) -> Tensor", tags);
}

KPROF_CPU_AND_CUDA_KERNELS(kernels)

TORCH_LIBRARY_IMPL(kprof, Autograd, m) {
  m.impl("square", &square_autograd);
  m.impl("square_backward", &square_backward_autograd);
}

KPROF_AUTOCAST_LIKE("square", square_autograd, "aten::pow", "Tensor_Scalar")  // torch.square(x) is pow(x, 2)

KPROF_PYTHON_MODULE()
"""

LIBRARY = OpLibrary(
    "square", lambda: _build.load_inline("square", CPP_SOURCE, CUDA_SOURCE), ops=("square", "square_backward")
)
KERNELS = Kernels(LIBRARY)  # no Triton twin


@LIBRARY.fake("square")
def _square_fake(x: torch.Tensor, variant: str = "vectorized") -> torch.Tensor:
    return x.new_empty(x.shape)


@LIBRARY.fake("square_backward")
def _square_backward_fake(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape)


def square(x: torch.Tensor, *, variant: str = "vectorized", impl: str | None = None) -> torch.Tensor:
    """``torch.square`` with kprof kernels; a strided ``x`` is read through a contiguous copy. ``variant``
    ("vectorized" or the seed's "grid2d") picks the CUDA forward; ``impl``: None (by device), "cuda", "cpp" or
    "torch"."""
    if use_reference(impl):
        return torch.square(x)
    return KERNELS.pick(impl, x, "kprof square").square(x, variant)


class Square(KernelLayer):
    """``square`` as a module, so one model can run it with each variant and implementation."""

    kernels = KERNELS

    def __init__(self, *, variant: str = "vectorized", impl: str | None = None) -> None:
        super().__init__(impl)
        self.variant = check_choice("variant", variant, VARIANTS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return square(x, variant=self.variant, impl=self.impl)

    def extra_repr(self) -> str:
        return f"variant={self.variant!r}, {self.impl_repr()}"
