// Torch binding and CPU kernels of kprof GELU (erf or tanh form) and the fused bias + GELU, forward and
// backward. Results go to caller-allocated buffers. CPU math runs in at::opmath_type (float for
// half/bfloat16, double for double).
#include <ATen/ops/empty.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>

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

#define KPROF_FLOAT_DISPATCH(t, op, ...) \
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, (t).scalar_type(), op, __VA_ARGS__)

// y = gelu(x).
void gelu_forward(const at::Tensor& x, const at::Tensor& y, bool tanh_approx) {
  kprof::check_input(x, "kprof gelu", "x");
  kprof::check_same(x, y, "kprof gelu", "y");
  if (x.is_cuda()) {
    KPROF_CUDA_CALL(x, "kprof gelu", kprof_gelu_forward(kprof::dtype_code(x), x.const_data_ptr(), y.mutable_data_ptr(),
                                                        x.numel(), tanh_approx, kprof::current_stream()));
    return;
  }
  KPROF_FLOAT_DISPATCH(x, "kprof gelu", [&] {
    kprof::cpu_map(x.numel(), [=](auto v) { return gelu::forward(v, tanh_approx); }, y.mutable_data_ptr<scalar_t>(),
                   x.const_data_ptr<scalar_t>());
  });
}

// dx = dy * gelu'(x).
void gelu_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& dx, bool tanh_approx) {
  kprof::check_input(x, "kprof gelu backward", "x");
  kprof::check_same(x, dy, "kprof gelu backward", "grad");
  kprof::check_same(x, dx, "kprof gelu backward", "grad_x");
  if (x.is_cuda()) {
    KPROF_CUDA_CALL(x, "kprof gelu backward",
                    kprof_gelu_backward(kprof::dtype_code(x), dy.const_data_ptr(), x.const_data_ptr(),
                                        dx.mutable_data_ptr(), x.numel(), tanh_approx, kprof::current_stream()));
    return;
  }
  KPROF_FLOAT_DISPATCH(x, "kprof gelu backward", [&] {
    kprof::cpu_map(x.numel(), [=](auto g, auto v) { return g * gelu::derivative(v, tanh_approx); },
                   dx.mutable_data_ptr<scalar_t>(), dy.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>());
  });
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

// y = gelu(x + bias), bias broadcast over the rows of x.
void bias_gelu_forward(const at::Tensor& x, const at::Tensor& bias, const at::Tensor& y, bool tanh_approx) {
  const int64_t rows = check_bias(x, bias, "kprof bias_gelu");
  kprof::check_same(x, y, "kprof bias_gelu", "y");
  const int64_t cols = bias.numel();
  if (x.is_cuda()) {
    KPROF_CUDA_CALL(x, "kprof bias_gelu",
                    kprof_bias_gelu_forward(kprof::dtype_code(x), x.const_data_ptr(), bias.const_data_ptr(),
                                            y.mutable_data_ptr(), rows, cols, tanh_approx, kprof::current_stream()));
    return;
  }
  KPROF_FLOAT_DISPATCH(x, "kprof bias_gelu", [&] {
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
  kprof::check_cuda(call(nullptr), "kprof bias_gelu backward");
  at::Tensor partial = at::empty({partial_rows, cols}, x.options().dtype(at::kFloat));
  kprof::check_cuda(call(partial.mutable_data_ptr<float>()), "kprof bias_gelu backward");
  return partial.sum(0).to(bias.scalar_type());
}
#endif

// dx = dy * gelu'(x + bias); returns the bias gradient: dx summed over rows before rounding to x's dtype, in
// double (the CPU can afford it; the CUDA kernel sums in float). The CPU splits the columns over threads.
at::Tensor bias_gelu_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& bias, const at::Tensor& dx,
                              bool tanh_approx) {
  const int64_t rows = check_bias(x, bias, "kprof bias_gelu backward");
  kprof::check_same(x, dy, "kprof bias_gelu backward", "grad");
  kprof::check_same(x, dx, "kprof bias_gelu backward", "grad_x");
  const int64_t cols = bias.numel();
  if (x.numel() == 0) return at::zeros({cols}, bias.options());
  if (x.is_cuda()) {
    KPROF_ON_CUDA(x, "kprof bias_gelu backward", return bias_gelu_backward_cuda(dy, x, bias, dx, rows, tanh_approx));
  }
  at::Tensor grad_bias = at::empty({cols}, bias.options().dtype(at::kDouble));
  double* dbp = grad_bias.mutable_data_ptr<double>();
  KPROF_FLOAT_DISPATCH(x, "kprof bias_gelu backward", [&] {
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
  return grad_bias.to(bias.scalar_type());
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using pybind11::arg;
  m.def("forward", &gelu_forward, "y = gelu(x)", arg("x"), arg("y"), arg("tanh_approx"));
  m.def("backward", &gelu_backward, "grad_x = grad * gelu'(x)", arg("grad"), arg("x"), arg("grad_x"),
        arg("tanh_approx"));
  m.def("bias_forward", &bias_gelu_forward, "y = gelu(x + bias), bias over the last dim", arg("x"), arg("bias"),
        arg("y"), arg("tanh_approx"));
  m.def("bias_backward", &bias_gelu_backward, "grad_x of gelu(x + bias); returns grad bias", arg("grad"), arg("x"),
        arg("bias"), arg("grad_x"), arg("tanh_approx"));
}
