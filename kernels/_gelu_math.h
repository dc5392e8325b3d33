// GELU and its derivative, exact (erf) and tanh forms, written once for the CUDA kernels (gelu.cu) and
// the CPU loops (gelu.cpp). Same formulas as PyTorch's own GELU kernels.
#pragma once

#include <cmath>

#ifdef __CUDACC__
#define KPROF_HD __host__ __device__ __forceinline__
#else
#define KPROF_HD inline
#endif

namespace kprof::gelu {

constexpr double kSqrtHalf = 0.70710678118654752440;   // 1 / sqrt(2)
constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1 / sqrt(2 pi)
constexpr double kSqrt2OverPi = 0.79788456080286535588; // sqrt(2 / pi)
constexpr double kKappa = 0.044715;

// A is the arithmetic type: float for float/half/bfloat16 data, double for double.
template <typename A>
KPROF_HD A forward(A x, bool tanh_approx) {
  if (tanh_approx) {
    const A inner = A(kSqrt2OverPi) * (x + A(kKappa) * x * x * x);
    return A(0.5) * x * (A(1) + std::tanh(inner));
  }
  return A(0.5) * x * (A(1) + std::erf(x * A(kSqrtHalf)));
}

// d gelu(x) / dx.
template <typename A>
KPROF_HD A derivative(A x, bool tanh_approx) {
  if (tanh_approx) {
    const A x_sq = x * x;
    const A t = std::tanh(A(kSqrt2OverPi) * (x + A(kKappa) * x_sq * x));
    return A(0.5) * (A(1) + t) + A(0.5) * x * (A(1) - t * t) * A(kSqrt2OverPi) * (A(1) + A(3 * kKappa) * x_sq);
  }
  const A cdf = A(0.5) * (A(1) + std::erf(x * A(kSqrtHalf)));
  return cdf + x * A(kInvSqrt2Pi) * std::exp(A(-0.5) * x * x);
}

}  // namespace kprof::gelu
