// What the row-norm operators (layernorm.cpp, rmsnorm.cpp) share: argument checks (normalized_shape, the parameter
// dtype rule, eps, the CUDA row limit), the statistics' dtype, the CPU row loops including the two-stage
// (per-chunk partials, then a column sum) reduction of parameter gradients that mirrors the CUDA backward, and the
// float32 (float64) upcast that the twice-differentiable backward twins compute in.
#pragma once

#include "_op.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

namespace kprof {

// Longest row the CUDA kernels take: kMaxCols in _reduce.cuh (each thread holds 16 elements, 512 threads).
constexpr int64_t kCudaMaxCols = 8192;

// Mean/rstd (and the CPU accumulation) are double for double x, float otherwise.
inline at::ScalarType norm_stats_dtype(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// A norm call's tensors as the kernels read them, contiguous: x holds `rows` rows of n elements (n = the product of
// normalized_shape), weight (and bias) n elements. No views are made: each would be a dispatcher call per call.
struct NormArgs {
  at::Tensor x, weight;
  std::optional<at::Tensor> bias;
  int64_t rows, n;
};

// A parameter: normalized_shape on x's device, in x's dtype or float32 for float16/bfloat16 x.
inline at::Tensor norm_param(const char* op, const char* arg, const at::Tensor& x, at::IntArrayRef shape,
                             const at::Tensor& p) {
  TORCH_CHECK_VALUE(p.sizes() == shape && p.device() == x.device(), kprof::msg(op, ": ", arg, " is ", p.sizes(), " on ",
                    p.device(), ", expected ", shape, " on ", x.device()));
  const auto xt = x.scalar_type(), pt = p.scalar_type();
  const bool reduced = xt == at::kHalf || xt == at::kBFloat16;
  TORCH_CHECK_TYPE(pt == xt || (pt == at::kFloat && reduced), kprof::msg(op, ": ", arg, " dtype ", pt,
                   " does not go with x dtype ", xt, " (use x's dtype, or float32 for float16/bfloat16 x)"));
  return p.contiguous();
}

// Checks a norm call (x [..., *normalized_shape], weight, optional bias, eps) before any launch.
inline NormArgs norm_args(const char* op, const at::Tensor& x_in, at::IntArrayRef shape, const at::Tensor& weight,
                          const std::optional<at::Tensor>& bias, double eps) {
  TORCH_CHECK_VALUE(!shape.empty() && std::all_of(shape.begin(), shape.end(), [](int64_t d) { return d >= 1; }),
                    kprof::msg(op, ": normalized_shape must be a non-empty list of positive sizes, got ", shape));
  const at::Tensor x = checked(x_in, op, "x");
  const auto dims = static_cast<int64_t>(shape.size());
  TORCH_CHECK_VALUE(x.dim() >= dims && x.sizes().slice(x.dim() - dims) == shape,
                    kprof::msg(op, ": x of shape ", x.sizes(), " does not end in normalized_shape ", shape));
  TORCH_CHECK_VALUE(eps >= 0, kprof::msg(op, ": eps must be a number >= 0, got ", eps));
  NormArgs a{x, norm_param(op, "weight", x, shape, weight), std::nullopt, 0, 1};
  if (bias) {
    a.bias = norm_param(op, "bias", x, shape, *bias);
    TORCH_CHECK_TYPE(a.bias->scalar_type() == a.weight.scalar_type(),
                     kprof::msg(op, ": weight and bias dtypes differ: ", a.weight.scalar_type(), ", ",
                                a.bias->scalar_type()));
  }
  for (const int64_t d : shape) a.n *= d;
  a.rows = a.n == 0 ? 0 : x.numel() / a.n;
  TORCH_CHECK_VALUE(!x.is_cuda() || a.n <= kCudaMaxCols,
                    kprof::msg(op, ": the CUDA kernels take rows of at most ", kCudaMaxCols,
                               " elements, normalized_shape ", shape, " has ", a.n,
                               "; use impl='torch' for this layer"));
  return a;
}

// A saved statistic (mean or rstd): [rows] in norm_stats_dtype on x's device, made contiguous.
inline at::Tensor norm_stat(const char* op, const char* arg, const NormArgs& a, const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.dim() == 1 && t.size(0) == a.rows && t.device() == a.x.device(), kprof::msg(op, ": ", arg,
                    " must have shape [", a.rows, "] on ", a.x.device(), ", got ", t.sizes(), " on ", t.device()));
  TORCH_CHECK_TYPE(t.scalar_type() == norm_stats_dtype(a.x), kprof::msg(op, ": ", arg, " has dtype ", t.scalar_type(),
                   ", expected ", norm_stats_dtype(a.x)));
  return t.contiguous();
}

// A backward's incoming gradient: x's shape, dtype and device, contiguous.
inline at::Tensor norm_grad(const char* op, const at::Tensor& x_in, const at::Tensor& grad) {
  return checked_like(x_in, grad, op, "grad");
}

// The accumulation dtype of a twin: float64 for float64 x, float32 otherwise.
inline at::Tensor upcast(const at::Tensor& t, const at::Tensor& x) { return t.to(norm_stats_dtype(x)); }

// Row length as the CUDA launchers take it (norm_args limited it to kCudaMaxCols).
inline int cuda_cols(const NormArgs& a) { return static_cast<int>(a.n); }

#ifdef KPROF_WITH_CUDA
// Runs a CUDA backward launcher twice, CUB-style: run(nullptr, &floats) asks for the float workspace it
// needs, run(workspace, &floats) launches with one allocated on x's device.
template <typename Run>
cudaError_t with_workspace(const at::Tensor& x, Run&& run) {
  int64_t floats = 0;
  const cudaError_t err = run(nullptr, &floats);
  if (err != cudaSuccess) return err;
  at::Tensor workspace = at::empty({floats}, x.options().dtype(at::kFloat));
  return run(workspace.mutable_data_ptr<float>(), &floats);
}
#endif

// Runs f(T{}, W{}) for x's dtype T and the weight's dtype W (a pair norm_param accepted).
template <typename F>
void norm_dispatch_cpu(const at::Tensor& x, const at::Tensor& w, F&& f) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "kprof norm (CPU)", [&] {
    if (w.scalar_type() == x.scalar_type()) {
      f(scalar_t{}, scalar_t{});
    } else {
      f(scalar_t{}, float{});
    }
  });
}

// f(r) for every row r < rows (of n elements), rows split over CPU threads in chunks of about 32768 elements
// (ATen's grain).
template <typename F>
void for_each_row(int64_t rows, int64_t n, F&& f) {
  const int64_t grain = std::max<int64_t>(1, kGrain / n);
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) f(r);
  });
}

// f(r, part) for every row r < rows (of n elements), where part[k] is a zeroed [n] accumulator for gradient k
// private to the row's chunk; afterwards grads[k][c] = sum over chunks of part[k][c]. A fixed chunk count keeps
// the result independent of the thread count.
template <typename Acc, typename W, typename F>
void rows_with_partials(int64_t rows, int64_t n, const std::vector<W*>& grads, F&& f) {
  constexpr int64_t kChunks = 64;
  const int64_t chunks = std::min(rows, kChunks);
  const auto k_grads = static_cast<int64_t>(grads.size());
  std::vector<Acc> part(static_cast<size_t>(chunks * k_grads * n), Acc(0));
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t chunk = begin; chunk < end; ++chunk) {
      std::vector<Acc*> mine;
      for (int64_t k = 0; k < k_grads; ++k) mine.push_back(part.data() + (chunk * k_grads + k) * n);
      for (int64_t r = rows * chunk / chunks; r < rows * (chunk + 1) / chunks; ++r) f(r, mine.data());
    }
  });
  at::parallel_for(0, n, 1024, [&](int64_t begin, int64_t end) {
    for (int64_t k = 0; k < k_grads; ++k) {
      for (int64_t c = begin; c < end; ++c) {
        Acc total = 0;
        for (int64_t chunk = 0; chunk < chunks; ++chunk) total += part[(chunk * k_grads + k) * n + c];
        grads[k][c] = static_cast<W>(total);
      }
    }
  });
}

}  // namespace kprof
