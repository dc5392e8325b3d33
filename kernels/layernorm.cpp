// LayerNorm torch binding: CPU kernels (at::parallel_for over rows, accumulation in float, or double for
// double inputs) and, with KPROF_WITH_CUDA, layernorm.cu's launchers. Ops write into caller-allocated
// outputs, so callers (and tests) own the buffers: x is [rows, n] contiguous, mean/rstd are [rows] in the
// accumulation type (norm_stats_dtype), weight/bias are [n] in x's dtype or float32 (norm_check_param).
#include "_norm_binding.h"

#ifdef KPROF_WITH_CUDA
extern "C" {
cudaError_t kprof_layernorm_fwd_cuda(const void* x, const void* w, const void* b, void* y, float* mean, float* rstd,
                                     int64_t rows, int n, float eps, int x_dtype, int w_dtype, cudaStream_t stream);
cudaError_t kprof_layernorm_bwd_cuda(const void* dy, const void* x, const void* w, const float* mean,
                                     const float* rstd, void* dx, void* dw, void* db, float* workspace,
                                     int64_t* workspace_floats, int64_t rows, int n, int x_dtype, int w_dtype,
                                     cudaStream_t stream);
}
#endif

namespace {

constexpr const char* kOp = "kprof layer_norm";

template <typename T, typename W>
void forward_cpu(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b, double eps,
                 at::Tensor& y, at::Tensor& mean, at::Tensor& rstd) {
  using acc_t = at::opmath_type<T>;
  const int64_t n = x.size(1);
  const T* xp = x.const_data_ptr<T>();
  const W* wp = w.const_data_ptr<W>();
  const W* bp = b ? b->const_data_ptr<W>() : nullptr;
  T* yp = y.mutable_data_ptr<T>();
  acc_t* mp = mean.mutable_data_ptr<acc_t>();
  acc_t* rp = rstd.mutable_data_ptr<acc_t>();
  kprof::for_each_row(x, [&](int64_t r) {
    const T* xr = xp + r * n;
    acc_t sum = 0;
    for (int64_t c = 0; c < n; ++c) sum += static_cast<acc_t>(xr[c]);
    const acc_t mu = sum / n;
    acc_t sq = 0;
    for (int64_t c = 0; c < n; ++c) sq += (static_cast<acc_t>(xr[c]) - mu) * (static_cast<acc_t>(xr[c]) - mu);
    const acc_t rs = acc_t(1) / std::sqrt(sq / n + static_cast<acc_t>(eps));
    T* yr = yp + r * n;
    for (int64_t c = 0; c < n; ++c) {
      const acc_t shift = bp != nullptr ? static_cast<acc_t>(bp[c]) : acc_t(0);
      yr[c] = static_cast<T>((static_cast<acc_t>(xr[c]) - mu) * rs * static_cast<acc_t>(wp[c]) + shift);
    }
    mp[r] = mu;
    rp[r] = rs;
  });
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = w * dy; dw = sum of dy * xhat, db = sum of dy.
template <typename T, typename W>
void backward_cpu(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w, const at::Tensor& mean,
                  const at::Tensor& rstd, at::Tensor& dx, at::Tensor& dw, const std::optional<at::Tensor>& db) {
  using acc_t = at::opmath_type<T>;
  const int64_t n = x.size(1);
  const T *dyp = dy.const_data_ptr<T>(), *xp = x.const_data_ptr<T>();
  const W* wp = w.const_data_ptr<W>();
  const acc_t *mp = mean.const_data_ptr<acc_t>(), *rp = rstd.const_data_ptr<acc_t>();
  T* dxp = dx.mutable_data_ptr<T>();
  std::vector<W*> grads{dw.mutable_data_ptr<W>()};
  if (db) grads.push_back(db->mutable_data_ptr<W>());
  kprof::rows_with_partials<acc_t>(x, grads, [&](int64_t r, acc_t* const* part) {
    const T *xr = xp + r * n, *dyr = dyp + r * n;
    const acc_t mu = mp[r], rs = rp[r];
    acc_t s_gx = 0, s_g = 0;
    for (int64_t c = 0; c < n; ++c) {
      const acc_t xh = (static_cast<acc_t>(xr[c]) - mu) * rs, d = static_cast<acc_t>(dyr[c]);
      const acc_t g = d * static_cast<acc_t>(wp[c]);
      s_gx += g * xh;
      s_g += g;
      part[0][c] += d * xh;
      if (db) part[1][c] += d;
    }
    const acc_t c1 = s_gx / n, c2 = s_g / n;
    T* dxr = dxp + r * n;
    for (int64_t c = 0; c < n; ++c) {
      const acc_t xh = (static_cast<acc_t>(xr[c]) - mu) * rs;
      const acc_t g = static_cast<acc_t>(dyr[c]) * static_cast<acc_t>(wp[c]);
      dxr[c] = static_cast<T>(rs * (g - c2 - xh * c1));
    }
  });
}

#ifdef KPROF_WITH_CUDA
cudaError_t backward_cuda(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w, const at::Tensor& mean,
                          const at::Tensor& rstd, at::Tensor& dx, at::Tensor& dw,
                          const std::optional<at::Tensor>& db) {
  return kprof::with_workspace(x, [&](float* workspace, int64_t* floats) {
    return kprof_layernorm_bwd_cuda(dy.const_data_ptr(), x.const_data_ptr(), w.const_data_ptr(),
                                    mean.const_data_ptr<float>(), rstd.const_data_ptr<float>(), dx.mutable_data_ptr(),
                                    dw.mutable_data_ptr(), db ? db->mutable_data_ptr() : nullptr, workspace, floats,
                                    x.size(0), kprof::cuda_cols(x), kprof::dtype_code(x), kprof::dtype_code(w),
                                    kprof::current_stream());
  });
}
#endif

void layernorm_forward(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       double eps, at::Tensor& y, at::Tensor& mean, at::Tensor& rstd) {
  kprof::norm_check_rows(x, kOp, "x");
  kprof::norm_check_param(x, weight, kOp, "weight");
  if (bias) kprof::norm_check_param(x, *bias, kOp, "bias", weight.scalar_type());
  kprof::norm_check_out(x, y, x.sizes(), x.scalar_type(), kOp, "y");
  kprof::norm_check_out(x, mean, {x.size(0)}, kprof::norm_stats_dtype(x), kOp, "mean");
  kprof::norm_check_out(x, rstd, {x.size(0)}, kprof::norm_stats_dtype(x), kOp, "rstd");
  if (x.is_cuda()) {
    KPROF_CUDA_CALL(x, kOp,
                    kprof_layernorm_fwd_cuda(x.const_data_ptr(), weight.const_data_ptr(),
                                             bias ? bias->const_data_ptr() : nullptr, y.mutable_data_ptr(),
                                             mean.mutable_data_ptr<float>(), rstd.mutable_data_ptr<float>(),
                                             x.size(0), kprof::cuda_cols(x), static_cast<float>(eps),
                                             kprof::dtype_code(x), kprof::dtype_code(weight), kprof::current_stream()));
    return;
  }
  kprof::norm_dispatch_cpu(x, weight, [&](auto t, auto w) {
    forward_cpu<decltype(t), decltype(w)>(x, weight, bias, eps, y, mean, rstd);
  });
}

void layernorm_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& mean,
                        const at::Tensor& rstd, at::Tensor& dx, at::Tensor& dweight,
                        const std::optional<at::Tensor>& dbias) {
  kprof::norm_check_rows(x, kOp, "x");
  kprof::norm_check_param(x, weight, kOp, "weight");
  kprof::norm_check_out(x, dy, x.sizes(), x.scalar_type(), kOp, "dy");
  kprof::norm_check_out(x, mean, {x.size(0)}, kprof::norm_stats_dtype(x), kOp, "mean");
  kprof::norm_check_out(x, rstd, {x.size(0)}, kprof::norm_stats_dtype(x), kOp, "rstd");
  kprof::norm_check_out(x, dx, x.sizes(), x.scalar_type(), kOp, "dx");
  kprof::norm_check_out(x, dweight, weight.sizes(), weight.scalar_type(), kOp, "dweight");
  if (dbias) kprof::norm_check_out(x, *dbias, weight.sizes(), weight.scalar_type(), kOp, "dbias");
  if (x.size(0) == 0) {
    dweight.zero_();
    if (dbias) dbias->zero_();
    return;
  }
  if (x.is_cuda()) {
    KPROF_CUDA_CALL(x, kOp, backward_cuda(dy, x, weight, mean, rstd, dx, dweight, dbias));
    return;
  }
  kprof::norm_dispatch_cpu(x, weight, [&](auto t, auto w) {
    backward_cpu<decltype(t), decltype(w)>(dy, x, weight, mean, rstd, dx, dweight, dbias);
  });
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "kprof LayerNorm kernels (CPU, and CUDA when built with a GPU) writing caller-allocated outputs";
  m.def("forward", &layernorm_forward, "y, mean, rstd <- LayerNorm of x [rows, n] (weight, optional bias, eps)",
        pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("bias"), pybind11::arg("eps"), pybind11::arg("y"),
        pybind11::arg("mean"), pybind11::arg("rstd"));
  m.def("backward", &layernorm_backward, "dx, dweight, dbias (optional) <- LayerNorm backward", pybind11::arg("dy"),
        pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("mean"), pybind11::arg("rstd"), pybind11::arg("dx"),
        pybind11::arg("dweight"), pybind11::arg("dbias"));
}
