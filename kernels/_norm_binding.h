// Helpers shared by the row-norm torch bindings (layernorm.cpp, rmsnorm.cpp): argument checks, the
// parameter dtype rule, and the CPU row loops, including the two-stage (per-chunk partials, then a column
// sum) reduction of parameter gradients that mirrors the CUDA backward.
#pragma once

#include "_binding.h"

#include <ATen/ops/empty.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

namespace kprof {

// Mean/rstd (and the CPU accumulation) are double for double x, float otherwise.
inline at::ScalarType norm_stats_dtype(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// x: a contiguous [rows, n] tensor, n >= 1, of a dtype the kernels take on its device.
inline void norm_check_rows(const at::Tensor& x, const char* op, const char* arg) {
  check_input(x, op, arg);
  TORCH_CHECK_VALUE(x.dim() == 2 && x.size(1) >= 1, op, ": ", arg, " must be [rows, n] with n >= 1, got shape ",
                    x.sizes());
}

// A parameter: [n] on x's device, contiguous, in x's dtype or float32 for float16/bfloat16 x (and in
// `dtype` when given, e.g. the bias matching the weight).
inline void norm_check_param(const at::Tensor& x, const at::Tensor& p, const char* op, const char* arg,
                             std::optional<at::ScalarType> dtype = std::nullopt) {
  TORCH_CHECK_VALUE(p.device() == x.device(), op, ": ", arg, " is on ", p.device(), " but x is on ", x.device());
  TORCH_CHECK_VALUE(p.dim() == 1 && p.size(0) == x.size(1) && p.is_contiguous(), op, ": ", arg,
                    " must be contiguous with shape [", x.size(1), "], got ", p.sizes());
  const auto xt = x.scalar_type(), pt = p.scalar_type();
  const bool reduced = xt == at::kHalf || xt == at::kBFloat16;
  TORCH_CHECK_TYPE(pt == xt || (pt == at::kFloat && reduced), op, ": ", arg, " dtype ", pt,
                   " does not go with x dtype ", xt, " (use x's dtype, or float32 for float16/bfloat16 x)");
  TORCH_CHECK_TYPE(!dtype || pt == *dtype, op, ": ", arg, " dtype ", pt, " differs from the weight's ", *dtype);
}

// A caller-allocated output (or saved input) that the op reads or fills whole.
inline void norm_check_out(const at::Tensor& x, const at::Tensor& t, at::IntArrayRef shape, at::ScalarType dtype,
                           const char* op, const char* arg) {
  TORCH_CHECK_VALUE(t.device() == x.device(), op, ": ", arg, " is on ", t.device(), " but x is on ", x.device());
  TORCH_CHECK_VALUE(t.sizes() == shape && t.is_contiguous(), op, ": ", arg, " must be contiguous with shape ", shape,
                    ", got ", t.sizes());
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, op, ": ", arg, " has dtype ", t.scalar_type(), ", expected ", dtype);
}

// Row length as the CUDA launchers take it (they reject rows longer than their limit themselves).
inline int cuda_cols(const at::Tensor& x) {
  TORCH_CHECK_VALUE(x.size(1) <= std::numeric_limits<int>::max(), "rows too long for the CUDA kernels");
  return static_cast<int>(x.size(1));
}

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

// Runs f(T{}, W{}) for x's dtype T and the weight's dtype W (a pair norm_check_param accepted).
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

// f(r) for every row r of x, rows split over CPU threads in chunks of about 32768 elements (ATen's grain).
template <typename F>
void for_each_row(const at::Tensor& x, F&& f) {
  constexpr int64_t kGrainElements = 32768;
  const int64_t grain = std::max<int64_t>(1, kGrainElements / x.size(1));
  at::parallel_for(0, x.size(0), grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) f(r);
  });
}

// f(r, part) for every row r of x, where part[k] is a zeroed [n] accumulator for gradient k private to
// the row's chunk; afterwards grads[k][c] = sum over chunks of part[k][c]. A fixed chunk count keeps the
// result independent of the thread count.
template <typename Acc, typename W, typename F>
void rows_with_partials(const at::Tensor& x, const std::vector<W*>& grads, F&& f) {
  constexpr int64_t kChunks = 64;
  const int64_t rows = x.size(0), n = x.size(1), chunks = std::min(rows, kChunks);
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
