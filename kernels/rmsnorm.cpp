// RMSNorm torch binding: CPU kernels (at::parallel_for over rows, accumulation in float, or double for
// double inputs) and, with KPROF_WITH_CUDA, rmsnorm.cu's launchers. Same conventions as layernorm.cpp:
// caller-allocated outputs, x [rows, n] contiguous, rstd [rows] in norm_stats_dtype, weight [n].
#include "_norm_binding.h"

#ifdef KPROF_WITH_CUDA
extern "C" {
cudaError_t kprof_rmsnorm_fwd_cuda(const void* x, const void* w, void* y, float* rstd, int64_t rows, int n, float eps,
                                   int x_dtype, int w_dtype, cudaStream_t stream);
cudaError_t kprof_rmsnorm_bwd_cuda(const void* dy, const void* x, const void* w, const float* rstd, void* dx, void* dw,
                                   float* workspace, int64_t* workspace_floats, int64_t rows, int n, int x_dtype,
                                   int w_dtype, cudaStream_t stream);
}
#endif

namespace {

constexpr const char* kOp = "kprof rms_norm";

template <typename T, typename W>
void forward_cpu(const at::Tensor& x, const at::Tensor& w, double eps, at::Tensor& y, at::Tensor& rstd) {
  using acc_t = at::opmath_type<T>;
  const int64_t n = x.size(1);
  const T* xp = x.const_data_ptr<T>();
  const W* wp = w.const_data_ptr<W>();
  T* yp = y.mutable_data_ptr<T>();
  acc_t* rp = rstd.mutable_data_ptr<acc_t>();
  kprof::for_each_row(x, [&](int64_t r) {
    const T* xr = xp + r * n;
    acc_t sq = 0;
    for (int64_t c = 0; c < n; ++c) sq += static_cast<acc_t>(xr[c]) * static_cast<acc_t>(xr[c]);
    const acc_t rs = acc_t(1) / std::sqrt(sq / n + static_cast<acc_t>(eps));
    T* yr = yp + r * n;
    for (int64_t c = 0; c < n; ++c) yr[c] = static_cast<T>(static_cast<acc_t>(xr[c]) * rs * static_cast<acc_t>(wp[c]));
    rp[r] = rs;
  });
}

// dx = rstd * g - x * rstd^3 * mean(g * x), g = w * dy; dw = sum over rows of dy * x * rstd.
template <typename T, typename W>
void backward_cpu(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w, const at::Tensor& rstd,
                  at::Tensor& dx, at::Tensor& dw) {
  using acc_t = at::opmath_type<T>;
  const int64_t n = x.size(1);
  const T *dyp = dy.const_data_ptr<T>(), *xp = x.const_data_ptr<T>();
  const W* wp = w.const_data_ptr<W>();
  const acc_t* rp = rstd.const_data_ptr<acc_t>();
  T* dxp = dx.mutable_data_ptr<T>();
  kprof::rows_with_partials<acc_t>(x, std::vector<W*>{dw.mutable_data_ptr<W>()}, [&](int64_t r, acc_t* const* part) {
    const T *xr = xp + r * n, *dyr = dyp + r * n;
    const acc_t rs = rp[r];
    acc_t s_gx = 0;
    for (int64_t c = 0; c < n; ++c) {
      const acc_t xv = static_cast<acc_t>(xr[c]), d = static_cast<acc_t>(dyr[c]);
      s_gx += d * static_cast<acc_t>(wp[c]) * xv;
      part[0][c] += d * xv * rs;
    }
    const acc_t k = rs * rs * rs * s_gx / n;
    T* dxr = dxp + r * n;
    for (int64_t c = 0; c < n; ++c) {
      const acc_t g = static_cast<acc_t>(dyr[c]) * static_cast<acc_t>(wp[c]);
      dxr[c] = static_cast<T>(rs * g - static_cast<acc_t>(xr[c]) * k);
    }
  });
}

#ifdef KPROF_WITH_CUDA
cudaError_t backward_cuda(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w, const at::Tensor& rstd,
                          at::Tensor& dx, at::Tensor& dw) {
  return kprof::with_workspace(x, [&](float* workspace, int64_t* floats) {
    return kprof_rmsnorm_bwd_cuda(dy.const_data_ptr(), x.const_data_ptr(), w.const_data_ptr(),
                                  rstd.const_data_ptr<float>(), dx.mutable_data_ptr(), dw.mutable_data_ptr(),
                                  workspace, floats, x.size(0), kprof::cuda_cols(x), kprof::dtype_code(x),
                                  kprof::dtype_code(w), kprof::current_stream());
  });
}
#endif

void rmsnorm_forward(const at::Tensor& x, const at::Tensor& weight, double eps, at::Tensor& y, at::Tensor& rstd) {
  kprof::norm_check_rows(x, kOp, "x");
  kprof::norm_check_param(x, weight, kOp, "weight");
  kprof::norm_check_out(x, y, x.sizes(), x.scalar_type(), kOp, "y");
  kprof::norm_check_out(x, rstd, {x.size(0)}, kprof::norm_stats_dtype(x), kOp, "rstd");
  if (x.is_cuda()) {
    KPROF_CUDA_CALL(x, kOp,
                    kprof_rmsnorm_fwd_cuda(x.const_data_ptr(), weight.const_data_ptr(), y.mutable_data_ptr(),
                                           rstd.mutable_data_ptr<float>(), x.size(0), kprof::cuda_cols(x),
                                           static_cast<float>(eps), kprof::dtype_code(x), kprof::dtype_code(weight),
                                           kprof::current_stream()));
    return;
  }
  kprof::norm_dispatch_cpu(x, weight, [&](auto t, auto w) {
    forward_cpu<decltype(t), decltype(w)>(x, weight, eps, y, rstd);
  });
}

void rmsnorm_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& rstd,
                      at::Tensor& dx, at::Tensor& dweight) {
  kprof::norm_check_rows(x, kOp, "x");
  kprof::norm_check_param(x, weight, kOp, "weight");
  kprof::norm_check_out(x, dy, x.sizes(), x.scalar_type(), kOp, "dy");
  kprof::norm_check_out(x, rstd, {x.size(0)}, kprof::norm_stats_dtype(x), kOp, "rstd");
  kprof::norm_check_out(x, dx, x.sizes(), x.scalar_type(), kOp, "dx");
  kprof::norm_check_out(x, dweight, weight.sizes(), weight.scalar_type(), kOp, "dweight");
  if (x.size(0) == 0) {
    dweight.zero_();
    return;
  }
  if (x.is_cuda()) {
    KPROF_CUDA_CALL(x, kOp, backward_cuda(dy, x, weight, rstd, dx, dweight));
    return;
  }
  kprof::norm_dispatch_cpu(x, weight, [&](auto t, auto w) {
    backward_cpu<decltype(t), decltype(w)>(dy, x, weight, rstd, dx, dweight);
  });
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "kprof RMSNorm kernels (CPU, and CUDA when built with a GPU) writing caller-allocated outputs";
  m.def("forward", &rmsnorm_forward, "y, rstd <- RMSNorm of x [rows, n] (weight, eps)", pybind11::arg("x"),
        pybind11::arg("weight"), pybind11::arg("eps"), pybind11::arg("y"), pybind11::arg("rstd"));
  m.def("backward", &rmsnorm_backward, "dx, dweight <- RMSNorm backward", pybind11::arg("dy"), pybind11::arg("x"),
        pybind11::arg("weight"), pybind11::arg("rstd"), pybind11::arg("dx"), pybind11::arg("dweight"));
}
