// What the kernels of every kprof operator share: input checks (TORCH_CHECK, raised before any launch, so a bad
// input is a Python exception and never a crash), the dtype code handed to the CUDA launchers, the CPU map, and
// KPROF_CUDA_CALL, which runs a launcher on the tensor's device and current stream when the library was built
// with CUDA. Operators allocate their own outputs: nothing a caller passes is ever written.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <cstdio>
#include <string>
#include <type_traits>
#include <ATen/ops/empty.h>

#ifdef KPROF_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace kprof {

// The launchers take c10::ScalarType's numbers (see _elementwise.cuh); CUDA kernels exist for these.
static_assert(static_cast<int>(at::ScalarType::Half) == 5 && static_cast<int>(at::ScalarType::Float) == 6 &&
              static_cast<int>(at::ScalarType::BFloat16) == 15);

inline int dtype_code(const at::Tensor& t) { return static_cast<int>(t.scalar_type()); }

// Error messages are one std::string assembled from these pieces, never formatted through iostreams: with the
// compiler of the H100 machine (Ubuntu's GCC 13.3, against torch 2.11's wheel), a number written to a
// std::ostream from inside an extension crashed the process (SIGSEGV) instead of raising the check's exception;
// torch's own TORCH_CHECK formats its extra arguments that way. Numbers go through std::to_string/snprintf here.
inline std::string piece(const char* s) { return s; }
inline std::string piece(const std::string& s) { return s; }
inline std::string piece(c10::string_view s) { return std::string(s.data(), s.size()); }
inline std::string piece(at::ScalarType t) { return c10::toString(t); }
inline std::string piece(const c10::Device& d) { return d.str(); }
template <typename T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
std::string piece(T v) { return std::to_string(v); }
template <typename T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
std::string piece(T v) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%g", static_cast<double>(v));
  return buffer;
}
inline std::string piece(at::IntArrayRef sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + "]";
}

// The message of a failed check: msg(op, ": x has shape ", x.sizes()) -> "kprof gelu: x has shape [5]".
template <typename... Parts>
std::string msg(const Parts&... parts) {
  std::string out;
  ((out += piece(parts)), ...);
  return out;
}

// t as the kernels read it: a float32/float16/bfloat16 CUDA tensor or a float32/float64/float16/bfloat16 CPU
// tensor, made contiguous (a copy only when it is a strided view).
inline at::Tensor checked(const at::Tensor& t, const char* op, const char* arg) {
  const auto dtype = t.scalar_type();
  const bool cuda_ok = dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16;
  TORCH_CHECK_TYPE(t.is_cuda() ? cuda_ok : (t.is_cpu() && (cuda_ok || dtype == at::kDouble)), msg(op, ": ", arg,
                   " is ", dtype, " on ", t.device(), "; supported: float32/float16/bfloat16 on CUDA, "
                   "float32/float64/float16/bfloat16 on the CPU"));
  return t.contiguous();
}

// b checked as a's partner: `shape` (default: a's shape), a's dtype and device; made contiguous.
inline at::Tensor checked_like(const at::Tensor& a, const at::Tensor& b, const char* op, const char* arg,
                               at::OptionalIntArrayRef shape = std::nullopt) {
  TORCH_CHECK_TYPE(a.scalar_type() == b.scalar_type() && a.device() == b.device(), msg(op, ": ", arg, " is ",
                   b.scalar_type(), " on ", b.device(), ", expected ", a.scalar_type(), " on ", a.device()));
  const auto expected = shape.value_or(a.sizes());
  TORCH_CHECK_VALUE(b.sizes() == expected, msg(op, ": ", arg, " has shape ", b.sizes(), ", expected ", expected));
  return b.contiguous();
}

// A new contiguous tensor shaped and typed like t (the output of an elementwise op).
inline at::Tensor empty_like(const at::Tensor& t) { return at::empty(t.sizes(), t.options()); }

// Elements per CPU task below which at::parallel_for stays on one thread (ATen's own grain size).
constexpr int64_t kGrain = 32768;

// out[i] = f(in[i]...) computed in at::opmath_type (float for half/bfloat16), split over CPU threads.
template <typename scalar_t, typename F, typename... In>
void cpu_map(int64_t n, F f, scalar_t* out, const In*... in) {
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      out[i] = static_cast<scalar_t>(f(static_cast<at::opmath_type<In>>(in[i])...));
    }
  });
}

#ifdef KPROF_WITH_CUDA
inline cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

inline void check_cuda(cudaError_t err, const char* op) {
  TORCH_CHECK(err == cudaSuccess, msg(op, ": CUDA kernel launch failed: ", cudaGetErrorString(err)));
}

// Runs `stmt` under a guard for the tensor's device; without CUDA code in the build, raises instead.
#define KPROF_ON_CUDA(tensor, op, stmt)                         \
  do {                                                          \
    const c10::cuda::CUDAGuard kprof_guard_((tensor).device()); \
    stmt;                                                       \
  } while (0)
#else
#define KPROF_ON_CUDA(tensor, op, stmt)                                                      \
  TORCH_CHECK(false, ::kprof::msg(op, ": this build of kprof's kernels has no CUDA code (torch or nvcc had " \
                                      "no CUDA at build time)"))
#endif

// Calls a launcher on the tensor's device and raises if it reports an error.
#define KPROF_CUDA_CALL(tensor, op, call) KPROF_ON_CUDA(tensor, op, ::kprof::check_cuda((call), (op)))

}  // namespace kprof
