// SwiGLU torch binding: y = silu(gate) * up and its backward, CPU kernels (at::parallel_for, math in
// float, or double for double inputs) and, with KPROF_WITH_CUDA, swiglu.cu's launchers. Outputs are
// caller-allocated; all tensors have one shape, dtype and device and are contiguous.
#include "_binding.h"

#include <cmath>

#ifdef KPROF_WITH_CUDA
extern "C" {
cudaError_t kprof_swiglu_forward(int dtype, const void* gate, const void* up, void* y, int64_t n, cudaStream_t stream);
cudaError_t kprof_swiglu_backward(int dtype, const void* dy, const void* gate, const void* up, void* dgate,
                                  void* dup, int64_t n, cudaStream_t stream);
}
#endif

namespace {

constexpr const char* kOp = "kprof swiglu";
constexpr int64_t kGrainElements = 32768;  // ATen's parallel grain

template <typename A>
A sigmoid(A g) {
  return A(1) / (A(1) + std::exp(-g));
}

void check_all(const at::Tensor& ref, std::initializer_list<std::pair<const at::Tensor*, const char*>> others) {
  kprof::check_input(ref, kOp, "gate");
  for (const auto& [t, name] : others) {
    kprof::check_input(*t, kOp, name);
    kprof::check_same(ref, *t, kOp, name);
  }
}

void swiglu_forward(const at::Tensor& gate, const at::Tensor& up, at::Tensor& y) {
  check_all(gate, {{&up, "up"}, {&y, "y"}});
  if (gate.is_cuda()) {
    KPROF_CUDA_CALL(gate, kOp,
                    kprof_swiglu_forward(kprof::dtype_code(gate), gate.const_data_ptr(), up.const_data_ptr(),
                                         y.mutable_data_ptr(), gate.numel(), kprof::current_stream()));
    return;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, gate.scalar_type(), "kprof swiglu", [&] {
    kprof::cpu_map(gate.numel(), [](auto g, auto u) { return g * sigmoid(g) * u; }, y.mutable_data_ptr<scalar_t>(),
                   gate.const_data_ptr<scalar_t>(), up.const_data_ptr<scalar_t>());
  });
}

// dgate = dy * up * s * (1 + gate * (1 - s)) with s = sigmoid(gate), dup = dy * gate * s.
void swiglu_backward(const at::Tensor& dy, const at::Tensor& gate, const at::Tensor& up, at::Tensor& dgate,
                     at::Tensor& dup) {
  check_all(gate, {{&dy, "dy"}, {&up, "up"}, {&dgate, "dgate"}, {&dup, "dup"}});
  if (gate.is_cuda()) {
    KPROF_CUDA_CALL(gate, kOp,
                    kprof_swiglu_backward(kprof::dtype_code(gate), dy.const_data_ptr(), gate.const_data_ptr(),
                                          up.const_data_ptr(), dgate.mutable_data_ptr(), dup.mutable_data_ptr(),
                                          gate.numel(), kprof::current_stream()));
    return;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, gate.scalar_type(), "kprof swiglu backward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t *d = dy.const_data_ptr<scalar_t>(), *g = gate.const_data_ptr<scalar_t>(),
                   *u = up.const_data_ptr<scalar_t>();
    scalar_t *dg = dgate.mutable_data_ptr<scalar_t>(), *du = dup.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, gate.numel(), kGrainElements, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const acc_t dv = d[i], gv = g[i], uv = u[i], s = sigmoid(gv);
        dg[i] = static_cast<scalar_t>(dv * uv * s * (acc_t(1) + gv * (acc_t(1) - s)));
        du[i] = static_cast<scalar_t>(dv * gv * s);
      }
    });
  });
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "kprof SwiGLU kernels (CPU, and CUDA when built with a GPU) writing caller-allocated outputs";
  m.def("forward", &swiglu_forward, "y <- silu(gate) * up", pybind11::arg("gate"), pybind11::arg("up"),
        pybind11::arg("y"));
  m.def("backward", &swiglu_backward, "dgate, dup <- SwiGLU backward", pybind11::arg("dy"), pybind11::arg("gate"),
        pybind11::arg("up"), pybind11::arg("dgate"), pybind11::arg("dup"));
}
