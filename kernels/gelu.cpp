// Torch binding and CPU kernels of kprof GELU (erf or tanh form) and the fused bias + GELU, forward and
// backward. CPU math runs in at::opmath_type (float for half/bfloat16, double for double).
#include <ATen/ops/empty.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros_like.h>

#include "_binding.h"
#include "_gelu_math.h"

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

#define KPROF_FLOAT_DISPATCH(t, op, ...) AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, (t).scalar_type(), op, __VA_ARGS__)

at::Tensor gelu_forward(const at::Tensor& x, bool tanh_approx) {
  kprof::check_input(x, "kprof gelu", "x");
  at::Tensor y = at::empty_like(x);
  if (x.is_cuda()) {
    KPROF_CUDA_CALL(x, "kprof gelu", kprof_gelu_forward(kprof::dtype_code(x), x.const_data_ptr(), y.mutable_data_ptr(),
                                                        x.numel(), tanh_approx, kprof::current_stream()));
    return y;
  }
  KPROF_FLOAT_DISPATCH(x, "kprof gelu", [&] {
    kprof::cpu_map(x.numel(), [=](auto v) { return gelu::forward(v, tanh_approx); }, y.mutable_data_ptr<scalar_t>(),
                   x.const_data_ptr<scalar_t>());
  });
  return y;
}

at::Tensor gelu_backward(const at::Tensor& dy, const at::Tensor& x, bool tanh_approx) {
  kprof::check_input(x, "kprof gelu backward", "x");
  kprof::check_input(dy, "kprof gelu backward", "grad");
  kprof::check_same(x, dy, "kprof gelu backward", "grad");
  at::Tensor dx = at::empty_like(x);
  if (x.is_cuda()) {
    KPROF_CUDA_CALL(x, "kprof gelu backward",
                    kprof_gelu_backward(kprof::dtype_code(x), dy.const_data_ptr(), x.const_data_ptr(),
                                        dx.mutable_data_ptr(), x.numel(), tanh_approx, kprof::current_stream()));
    return dx;
  }
  KPROF_FLOAT_DISPATCH(x, "kprof gelu backward", [&] {
    kprof::cpu_map(x.numel(), [=](auto g, auto v) { return g * gelu::derivative(v, tanh_approx); },
                   dx.mutable_data_ptr<scalar_t>(), dy.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>());
  });
  return dx;
}

// x is [..., cols] with cols == bias.numel(); returns the number of rows.
int64_t check_bias(const at::Tensor& x, const at::Tensor& bias, const char* op) {
  kprof::check_input(x, op, "x");
  kprof::check_input(bias, op, "bias");
  TORCH_CHECK_VALUE(bias.dim() == 1 && x.dim() >= 1 && x.size(-1) == bias.size(0), op, ": bias has shape ",
                    bias.sizes(), ", expected [", x.dim() >= 1 ? x.size(-1) : 0, "] (the last dimension of x)");
  TORCH_CHECK_TYPE(bias.scalar_type() == x.scalar_type() && bias.device() == x.device(), op, ": bias is ",
                   bias.scalar_type(), " on ", bias.device(), ", expected ", x.scalar_type(), " on ", x.device());
  return bias.numel() == 0 ? 0 : x.numel() / bias.numel();
}

at::Tensor bias_gelu_forward(const at::Tensor& x, const at::Tensor& bias, bool tanh_approx) {
  const int64_t rows = check_bias(x, bias, "kprof bias_gelu");
  const int64_t cols = bias.numel();
  at::Tensor y = at::empty_like(x);
  if (x.is_cuda()) {
    KPROF_CUDA_CALL(x, "kprof bias_gelu",
                    kprof_bias_gelu_forward(kprof::dtype_code(x), x.const_data_ptr(), bias.const_data_ptr(),
                                            y.mutable_data_ptr(), rows, cols, tanh_approx, kprof::current_stream()));
    return y;
  }
  KPROF_FLOAT_DISPATCH(x, "kprof bias_gelu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* bp = bias.const_data_ptr<scalar_t>();
    scalar_t* yp = y.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, rows, kprof::kGrain / std::max<int64_t>(cols, 1), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          yp[r * cols + c] = static_cast<scalar_t>(
              gelu::forward(static_cast<acc_t>(xp[r * cols + c]) + static_cast<acc_t>(bp[c]), tanh_approx));
        }
      }
    });
  });
  return y;
}

#ifdef KPROF_WITH_CUDA
std::tuple<at::Tensor, at::Tensor> bias_gelu_backward_cuda(const at::Tensor& dy, const at::Tensor& x,
                                                           const at::Tensor& bias, bool tanh_approx) {
  const int64_t cols = bias.numel(), rows = x.numel() / cols;
  at::Tensor dx = at::empty_like(x);
  int64_t partial_rows = 0;
  const auto call = [&](float* partial) {
    return kprof_bias_gelu_backward(kprof::dtype_code(x), dy.const_data_ptr(), x.const_data_ptr(),
                                    bias.const_data_ptr(), dx.mutable_data_ptr(), partial, &partial_rows, rows, cols,
                                    tanh_approx, kprof::current_stream());
  };
  kprof::check_cuda(call(nullptr), "kprof bias_gelu backward");
  at::Tensor partial = at::empty({partial_rows, cols}, x.options().dtype(at::kFloat));
  kprof::check_cuda(call(partial.mutable_data_ptr<float>()), "kprof bias_gelu backward");
  return {dx, partial.sum(0).to(bias.scalar_type())};
}
#endif

// Returns (grad x, grad bias). On CUDA one kernel writes grad x and per-block column sums of it; their
// sum over blocks is the bias gradient. On the CPU the bias gradient is a sum over rows in opmath.
std::tuple<at::Tensor, at::Tensor> bias_gelu_backward(const at::Tensor& dy, const at::Tensor& x,
                                                      const at::Tensor& bias, bool tanh_approx) {
  const int64_t rows = check_bias(x, bias, "kprof bias_gelu backward");
  kprof::check_input(dy, "kprof bias_gelu backward", "grad");
  kprof::check_same(x, dy, "kprof bias_gelu backward", "grad");
  if (x.numel() == 0) return {at::empty_like(x), at::zeros_like(bias)};
  if (x.is_cuda()) KPROF_ON_CUDA(x, "kprof bias_gelu backward", return bias_gelu_backward_cuda(dy, x, bias, tanh_approx));
  const int64_t cols = bias.numel();
  at::Tensor dx = at::empty_like(x);
  KPROF_FLOAT_DISPATCH(x, "kprof bias_gelu backward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* gp = dy.const_data_ptr<scalar_t>();
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* bp = bias.const_data_ptr<scalar_t>();
    scalar_t* dxp = dx.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, rows, kprof::kGrain / std::max<int64_t>(cols, 1), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t i = r * cols + c;
          const acc_t v = static_cast<acc_t>(xp[i]) + static_cast<acc_t>(bp[c]);
          dxp[i] = static_cast<scalar_t>(static_cast<acc_t>(gp[i]) * gelu::derivative(v, tanh_approx));
        }
      }
    });
  });
  const auto acc_type = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  return {dx, dx.reshape({rows, cols}).sum(0, false, acc_type).to(bias.scalar_type())};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using pybind11::arg;
  m.def("forward", &gelu_forward, "y = gelu(x)", arg("x"), arg("tanh_approx"));
  m.def("backward", &gelu_backward, "grad x of gelu", arg("grad"), arg("x"), arg("tanh_approx"));
  m.def("bias_forward", &bias_gelu_forward, "y = gelu(x + bias), bias over the last dim", arg("x"), arg("bias"),
        arg("tanh_approx"));
  m.def("bias_backward", &bias_gelu_backward, "(grad x, grad bias) of gelu(x + bias)", arg("grad"), arg("x"),
        arg("bias"), arg("tanh_approx"));
}
