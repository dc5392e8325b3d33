// GELU (erf or tanh form) and the fused bias + GELU as the operators kprof::gelu, kprof::bias_gelu and their
// backwards: CPU kernels here (math in at::opmath_type: float for half/bfloat16, double for double), the CUDA
// launchers in gelu.cu, autograd and the registration (see _dispatch.h).
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>

#include "_dispatch.h"
#include "_gelu_math.h"
#include "_op.h"

#ifdef KPROF_WITH_CUDA
extern "C" {
cudaError_t kprof_gelu_forward(int dtype, const void* x, void* y, int64_t n, bool tanh_approx, cudaStream_t stream);
cudaError_t kprof_gelu_backward(int dtype, const void* dy, const void* x, void* dx, int64_t n, bool tanh_approx,
                                cudaStream_t stream);
cudaError_t kprof_bias_gelu_forward(int dtype, const void* x, const void* bias, void* y, int64_t rows, int64_t cols,
                                    bool tanh_approx, cudaStream_t stream);
cudaError_t kprof_bias_gelu_backward(int dtype, const void* dy, const void* x, const void* bias, void* dx,
                                     float* partial, int64_t* partial_rows, int64_t rows, int64_t cols,
                                     bool tanh_approx, cudaStream_t stream);
}
#endif

namespace {

namespace gelu = kprof::gelu;
using torch::autograd::variable_list;

#define KPROF_FLOAT_DISPATCH(t, op, ...) \
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, (t).scalar_type(), op, __VA_ARGS__)

constexpr const char* kGelu = "kprof gelu";
constexpr const char* kBiasGelu = "kprof bias_gelu";

// True for the tanh form; a ValueError for anything but torch's two choices.
bool tanh_form(c10::string_view approximate, const char* op) {
  TORCH_CHECK_VALUE(approximate == "none" || approximate == "tanh", kprof::msg(op,
                    ": approximate must be 'none' or 'tanh', got '", approximate, "'"));
  return approximate == "tanh";
}

at::Tensor gelu_forward(const at::Tensor& input, c10::string_view approximate) {
  const bool tanh_approx = tanh_form(approximate, kGelu);
  const at::Tensor x = kprof::checked(input, kGelu, "x");
  at::Tensor y = kprof::empty_like(x);
  if (x.is_cuda()) {
    KPROF_CUDA_CALL(x, kGelu, kprof_gelu_forward(kprof::dtype_code(x), x.const_data_ptr(), y.mutable_data_ptr(),
                                                 x.numel(), tanh_approx, kprof::current_stream()));
    return y;
  }
  KPROF_FLOAT_DISPATCH(x, kGelu, [&] {
    kprof::cpu_map(x.numel(), [=](auto v) { return gelu::forward(v, tanh_approx); }, y.mutable_data_ptr<scalar_t>(),
                   x.const_data_ptr<scalar_t>());
  });
  return y;
}

// dx = dy * gelu'(x).
at::Tensor gelu_backward(const at::Tensor& grad, const at::Tensor& input, c10::string_view approximate) {
  const bool tanh_approx = tanh_form(approximate, kGelu);
  const at::Tensor x = kprof::checked(input, kGelu, "x");
  const at::Tensor dy = kprof::checked_like(x, grad, kGelu, "grad");
  at::Tensor dx = kprof::empty_like(x);
  if (x.is_cuda()) {
    KPROF_CUDA_CALL(x, kGelu, kprof_gelu_backward(kprof::dtype_code(x), dy.const_data_ptr(), x.const_data_ptr(),
                                                  dx.mutable_data_ptr(), x.numel(), tanh_approx,
                                                  kprof::current_stream()));
    return dx;
  }
  KPROF_FLOAT_DISPATCH(x, kGelu, [&] {
    kprof::cpu_map(x.numel(), [=](auto g, auto v) { return g * gelu::derivative(v, tanh_approx); },
                   dx.mutable_data_ptr<scalar_t>(), dy.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>());
  });
  return dx;
}

// bias checked against x ([..., cols], at least one dimension): [cols], x's dtype and device.
at::Tensor checked_bias(const at::Tensor& x, const at::Tensor& bias) {
  TORCH_CHECK_VALUE(x.dim() >= 1, kprof::msg(kBiasGelu, ": x must have at least one dimension"));
  return kprof::checked_like(x, bias, kBiasGelu, "bias", at::IntArrayRef{x.size(-1)});
}

// y = gelu(x + bias), bias broadcast over the rows of x.
at::Tensor bias_gelu_forward(const at::Tensor& input, const at::Tensor& bias_in, c10::string_view approximate) {
  const bool tanh_approx = tanh_form(approximate, kBiasGelu);
  const at::Tensor x = kprof::checked(input, kBiasGelu, "x");
  const at::Tensor bias = checked_bias(x, bias_in);
  at::Tensor y = kprof::empty_like(x);
  const int64_t cols = bias.numel(), rows = cols == 0 ? 0 : x.numel() / cols;
  if (x.is_cuda()) {
    KPROF_CUDA_CALL(x, kBiasGelu,
                    kprof_bias_gelu_forward(kprof::dtype_code(x), x.const_data_ptr(), bias.const_data_ptr(),
                                            y.mutable_data_ptr(), rows, cols, tanh_approx, kprof::current_stream()));
    return y;
  }
  KPROF_FLOAT_DISPATCH(x, kBiasGelu, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* bp = bias.const_data_ptr<scalar_t>();
    scalar_t* yp = y.mutable_data_ptr<scalar_t>();
    const int64_t grain = std::max<int64_t>(kprof::kGrain / std::max<int64_t>(cols, 1), 1);
    at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0 * cols; i < r1 * cols; ++i) {
        const acc_t v = static_cast<acc_t>(xp[i]) + static_cast<acc_t>(bp[i % cols]);
        yp[i] = static_cast<scalar_t>(gelu::forward(v, tanh_approx));
      }
    });
  });
  return y;
}

#ifdef KPROF_WITH_CUDA
// One kernel writes dx and per-block column sums of it; their sum over blocks is the bias gradient.
at::Tensor bias_gelu_backward_cuda(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& bias,
                                   const at::Tensor& dx, int64_t rows, bool tanh_approx) {
  const int64_t cols = bias.numel();
  int64_t partial_rows = 0;
  const auto call = [&](float* partial) {
    return kprof_bias_gelu_backward(kprof::dtype_code(x), dy.const_data_ptr(), x.const_data_ptr(),
                                    bias.const_data_ptr(), dx.mutable_data_ptr(), partial, &partial_rows, rows, cols,
                                    tanh_approx, kprof::current_stream());
  };
  kprof::check_cuda(call(nullptr), kBiasGelu);
  at::Tensor partial = at::empty({partial_rows, cols}, x.options().dtype(at::kFloat));
  kprof::check_cuda(call(partial.mutable_data_ptr<float>()), kBiasGelu);
  return partial.sum(0).to(bias.scalar_type());
}
#endif

// (dx, dbias): dx = dy * gelu'(x + bias), dbias its sum over rows before rounding to x's dtype, in double on the
// CPU (which can afford it; the CUDA kernel sums in float). The CPU splits the columns over threads.
std::tuple<at::Tensor, at::Tensor> bias_gelu_backward(const at::Tensor& grad, const at::Tensor& input,
                                                      const at::Tensor& bias_in, c10::string_view approximate) {
  const bool tanh_approx = tanh_form(approximate, kBiasGelu);
  const at::Tensor x = kprof::checked(input, kBiasGelu, "x");
  const at::Tensor bias = checked_bias(x, bias_in);
  const at::Tensor dy = kprof::checked_like(x, grad, kBiasGelu, "grad");
  at::Tensor dx = kprof::empty_like(x);
  const int64_t cols = bias.numel(), rows = cols == 0 ? 0 : x.numel() / cols;
  if (x.numel() == 0) return {dx, at::zeros({cols}, bias.options())};
  if (x.is_cuda()) {
    KPROF_ON_CUDA(x, kBiasGelu, return std::make_tuple(dx, bias_gelu_backward_cuda(dy, x, bias, dx, rows,
                                                                                     tanh_approx)));
  }
  at::Tensor grad_bias = at::empty({cols}, bias.options().dtype(at::kDouble));
  double* dbp = grad_bias.mutable_data_ptr<double>();
  KPROF_FLOAT_DISPATCH(x, kBiasGelu, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* gp = dy.const_data_ptr<scalar_t>();
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* bp = bias.const_data_ptr<scalar_t>();
    scalar_t* dxp = dx.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, cols, std::max<int64_t>(kprof::kGrain / rows, 1), [&](int64_t c0, int64_t c1) {
      std::fill(dbp + c0, dbp + c1, 0.0);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          const int64_t i = r * cols + c;
          const acc_t g = static_cast<acc_t>(gp[i]) *
                          gelu::derivative(static_cast<acc_t>(xp[i]) + static_cast<acc_t>(bp[c]), tanh_approx);
          dxp[i] = static_cast<scalar_t>(g);
          dbp[c] += static_cast<double>(g);
        }
      }
    });
  });
  return {dx, grad_bias.to(bias.scalar_type())};
}

const auto& gelu_op() { return kprof::op<gelu_forward>("kprof::gelu"); }
const auto& gelu_backward_op() { return kprof::op<gelu_backward>("kprof::gelu_backward"); }
const auto& bias_gelu_op() { return kprof::op<bias_gelu_forward>("kprof::bias_gelu"); }
const auto& bias_gelu_backward_op() { return kprof::op<bias_gelu_backward>("kprof::bias_gelu_backward"); }

variable_list gelu_grads(const at::Tensor& grad, const std::array<at::Tensor, 1>& saved, const bool& tanh) {
  return {gelu_backward_op().call(grad, saved[0], tanh ? "tanh" : "none")};
}

variable_list bias_gelu_grads(const at::Tensor& grad, const std::array<at::Tensor, 2>& saved, const bool& tanh) {
  auto [dx, dbias] = bias_gelu_backward_op().call(grad, saved[0], saved[1], tanh ? "tanh" : "none");
  return {dx, dbias};
}

// The forward checks `approximate`; the node keeps it as a bool (no string per call).
at::Tensor gelu_autograd(const at::Tensor& x, c10::string_view approximate) {
  at::Tensor y = kprof::call_below_autograd(gelu_op(), x, approximate);
  if (!kprof::records(x)) return y;
  return kprof::recorded(std::move(y), "kprof::GeluBackward", gelu_grads, approximate == "tanh", std::array{x}, x);
}

at::Tensor bias_gelu_autograd(const at::Tensor& x, const at::Tensor& bias, c10::string_view approximate) {
  at::Tensor y = kprof::call_below_autograd(bias_gelu_op(), x, bias, approximate);
  if (!kprof::records(x, bias)) return y;
  return kprof::recorded(std::move(y), "kprof::BiasGeluBackward", bias_gelu_grads, approximate == "tanh",
                         std::array{x, bias}, x, bias);
}

// The backwards' Autograd kernels: the fast kernel, or under create_graph its twin from differentiable ATen ops
// (at::gelu_backward is torch's own GELU backward, with its double backward).
at::Tensor gelu_backward_autograd(const at::Tensor& grad, const at::Tensor& x, c10::string_view approximate) {
  if (kprof::records(grad, x)) return at::gelu_backward(grad, x, approximate);
  return kprof::call_below_autograd(gelu_backward_op(), grad, x, approximate);
}

std::tuple<at::Tensor, at::Tensor> bias_gelu_backward_autograd(const at::Tensor& grad, const at::Tensor& x,
                                                               const at::Tensor& bias, c10::string_view approximate) {
  if (kprof::records(grad, x, bias)) {
    at::Tensor dx = at::gelu_backward(grad, x + bias, approximate);
    return {dx, dx.sum_to_size(bias.sizes())};
  }
  return kprof::call_below_autograd(bias_gelu_backward_op(), grad, x, bias, approximate);
}

void kernels(torch::Library& m) {
  m.impl("gelu", &gelu_forward);
  m.impl("gelu_backward", &gelu_backward);
  m.impl("bias_gelu", &bias_gelu_forward);
  m.impl("bias_gelu_backward", &bias_gelu_backward);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kprof, m) {
  const std::vector<at::Tag> tags{at::Tag::pt2_compliant_tag};
  m.def("gelu(Tensor x, str approximate='none') -> Tensor", tags);
  m.def("gelu_backward(Tensor grad, Tensor x, str approximate='none') -> Tensor", tags);
  m.def("bias_gelu(Tensor x, Tensor bias, str approximate='none') -> Tensor", tags);
  m.def("bias_gelu_backward(Tensor grad, Tensor x, Tensor bias, str approximate='none') -> (Tensor, Tensor)", tags);
}

KPROF_CPU_AND_CUDA_KERNELS(kernels)

TORCH_LIBRARY_IMPL(kprof, Autograd, m) {
  m.impl("gelu", &gelu_autograd);
  m.impl("gelu_backward", &gelu_backward_autograd);
  m.impl("bias_gelu", &bias_gelu_autograd);
  m.impl("bias_gelu_backward", &bias_gelu_backward_autograd);
}

KPROF_AUTOCAST_LIKE("gelu", gelu_autograd, "aten::gelu", "")
KPROF_AUTOCAST_LIKE("bias_gelu", bias_gelu_autograd, "aten::gelu", "")

KPROF_PYTHON_MODULE(KPROF_FAST("gelu", gelu_autograd), KPROF_FAST("bias_gelu", bias_gelu_autograd))
