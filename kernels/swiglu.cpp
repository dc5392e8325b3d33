// SwiGLU, y = silu(gate) * up, as the operators kprof::swiglu and kprof::swiglu_backward: CPU kernels here
// (at::parallel_for, math in float, or double for double inputs), the CUDA launchers in swiglu.cu, autograd and
// the registration (see _dispatch.h). gate and up share one shape, dtype and device.
#include "_dispatch.h"
#include "_op.h"

#include <cmath>

#ifdef KPROF_WITH_CUDA
extern "C" {
cudaError_t kprof_swiglu_forward(int dtype, const void* gate, const void* up, void* y, int64_t n, cudaStream_t stream);
cudaError_t kprof_swiglu_backward(int dtype, const void* dy, const void* gate, const void* up, void* dgate,
                                  void* dup, int64_t n, cudaStream_t stream);
}
#endif

namespace {

using torch::autograd::variable_list;

constexpr const char* kOp = "kprof swiglu";

template <typename A>
A sigmoid(A g) {
  return A(1) / (A(1) + std::exp(-g));
}

at::Tensor swiglu_forward(const at::Tensor& gate_in, const at::Tensor& up_in) {
  const at::Tensor gate = kprof::checked(gate_in, kOp, "gate");
  const at::Tensor up = kprof::checked_like(gate, up_in, kOp, "up");
  at::Tensor y = kprof::empty_like(gate);
  if (gate.is_cuda()) {
    KPROF_CUDA_CALL(gate, kOp,
                    kprof_swiglu_forward(kprof::dtype_code(gate), gate.const_data_ptr(), up.const_data_ptr(),
                                         y.mutable_data_ptr(), gate.numel(), kprof::current_stream()));
    return y;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, gate.scalar_type(), kOp, [&] {
    kprof::cpu_map(gate.numel(), [](auto g, auto u) { return g * sigmoid(g) * u; }, y.mutable_data_ptr<scalar_t>(),
                   gate.const_data_ptr<scalar_t>(), up.const_data_ptr<scalar_t>());
  });
  return y;
}

// dgate = dy * up * s * (1 + gate * (1 - s)) with s = sigmoid(gate), dup = dy * gate * s.
std::tuple<at::Tensor, at::Tensor> swiglu_backward(const at::Tensor& grad, const at::Tensor& gate_in,
                                                   const at::Tensor& up_in) {
  const at::Tensor gate = kprof::checked(gate_in, kOp, "gate");
  const at::Tensor up = kprof::checked_like(gate, up_in, kOp, "up");
  const at::Tensor dy = kprof::checked_like(gate, grad, kOp, "grad");
  at::Tensor dgate = kprof::empty_like(gate), dup = kprof::empty_like(gate);
  if (gate.is_cuda()) {
    KPROF_CUDA_CALL(gate, kOp,
                    kprof_swiglu_backward(kprof::dtype_code(gate), dy.const_data_ptr(), gate.const_data_ptr(),
                                          up.const_data_ptr(), dgate.mutable_data_ptr(), dup.mutable_data_ptr(),
                                          gate.numel(), kprof::current_stream()));
    return {dgate, dup};
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, gate.scalar_type(), kOp, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t *d = dy.const_data_ptr<scalar_t>(), *g = gate.const_data_ptr<scalar_t>(),
                   *u = up.const_data_ptr<scalar_t>();
    scalar_t *dg = dgate.mutable_data_ptr<scalar_t>(), *du = dup.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, gate.numel(), kprof::kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const acc_t dv = d[i], gv = g[i], uv = u[i], s = sigmoid(gv);
        dg[i] = static_cast<scalar_t>(dv * uv * s * (acc_t(1) + gv * (acc_t(1) - s)));
        du[i] = static_cast<scalar_t>(dv * gv * s);
      }
    });
  });
  return {dgate, dup};
}

const auto& swiglu_op() { return kprof::op<swiglu_forward>("kprof::swiglu"); }
const auto& swiglu_backward_op() { return kprof::op<swiglu_backward>("kprof::swiglu_backward"); }

variable_list swiglu_grads(const at::Tensor& grad, const std::array<at::Tensor, 2>& saved, const kprof::NoConsts&) {
  auto [dgate, dup] = swiglu_backward_op().call(grad, saved[0], saved[1]);
  return {dgate, dup};
}

at::Tensor swiglu_autograd(const at::Tensor& gate, const at::Tensor& up) {
  at::Tensor y = kprof::call_below_autograd(swiglu_op(), gate, up);
  if (!kprof::records(gate, up)) return y;
  return kprof::recorded(std::move(y), "kprof::SwigluBackward", swiglu_grads, kprof::NoConsts{},
                         std::array{gate, up}, gate, up);
}

// The fast kernel, or under create_graph its twin from differentiable ATen ops (torch's own silu backward has no
// derivative; torch differentiates silu twice through sigmoid, as this does).
std::tuple<at::Tensor, at::Tensor> swiglu_backward_autograd(const at::Tensor& grad, const at::Tensor& gate,
                                                            const at::Tensor& up) {
  if (kprof::records(grad, gate, up)) {
    const at::Tensor s = gate.sigmoid();
    return {grad * up * s * (1 + gate * (1 - s)), grad * gate * s};
  }
  return kprof::call_below_autograd(swiglu_backward_op(), grad, gate, up);
}

void kernels(torch::Library& m) {
  m.impl("swiglu", &swiglu_forward);
  m.impl("swiglu_backward", &swiglu_backward);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kprof, m) {
  const std::vector<at::Tag> tags{at::Tag::pt2_compliant_tag};
  m.def("swiglu(Tensor gate, Tensor up) -> Tensor", tags);
  m.def("swiglu_backward(Tensor grad, Tensor gate, Tensor up) -> (Tensor, Tensor)", tags);
}

KPROF_CPU_AND_CUDA_KERNELS(kernels)

TORCH_LIBRARY_IMPL(kprof, Autograd, m) {
  m.impl("swiglu", &swiglu_autograd);
  m.impl("swiglu_backward", &swiglu_backward_autograd);
}

KPROF_AUTOCAST_LIKE("swiglu", swiglu_autograd, "aten::silu", "")

KPROF_PYTHON_MODULE(KPROF_FAST("swiglu", swiglu_autograd))
