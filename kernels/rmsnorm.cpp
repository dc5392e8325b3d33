// RMSNorm as torch operators: kprof::rms_norm (the public one, F.rms_norm's signature with a weight required,
// differentiable), kprof::rms_norm_fwd (y, rstd: what it runs below autograd) and kprof::rms_norm_backward. CPU
// kernels here (at::parallel_for over rows, accumulation in float, or double for double inputs), the CUDA launchers
// in rmsnorm.cu, autograd, autocast as torch's rms_norm, and the registration (see _dispatch.h). Same conventions as
// layernorm.cpp; eps=None is torch's default, the machine epsilon of the accumulation type.
#include "_dispatch.h"
#include "_norm_op.h"

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

using at::Tensor;
using torch::autograd::variable_list;

constexpr const char* kOp = "kprof rms_norm";

// eps, or torch's default for x: the epsilon of the accumulation type.
double resolve_eps(const Tensor& x, std::optional<double> eps) {
  return eps.value_or(x.scalar_type() == at::kDouble ? std::numeric_limits<double>::epsilon()
                                                     : std::numeric_limits<float>::epsilon());
}

template <typename T, typename W>
void forward_cpu(const kprof::NormArgs& a, double eps, Tensor& y, Tensor& rstd) {
  using acc_t = at::opmath_type<T>;
  const int64_t n = a.n;
  const T* xp = a.x.const_data_ptr<T>();
  const W* wp = a.weight.const_data_ptr<W>();
  T* yp = y.mutable_data_ptr<T>();
  acc_t* rp = rstd.mutable_data_ptr<acc_t>();
  kprof::for_each_row(a.rows, n, [&](int64_t r) {
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
void backward_cpu(const kprof::NormArgs& a, const Tensor& dy, const Tensor& rstd, Tensor& dx, Tensor& dw) {
  using acc_t = at::opmath_type<T>;
  const int64_t n = a.n;
  const T *dyp = dy.const_data_ptr<T>(), *xp = a.x.const_data_ptr<T>();
  const W* wp = a.weight.const_data_ptr<W>();
  const acc_t* rp = rstd.const_data_ptr<acc_t>();
  T* dxp = dx.mutable_data_ptr<T>();
  const std::vector<W*> grads{dw.mutable_data_ptr<W>()};
  kprof::rows_with_partials<acc_t>(a.rows, n, grads, [&](int64_t r, acc_t* const* part) {
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

std::tuple<Tensor, Tensor> rms_norm_fwd(const Tensor& x, c10::SymIntArrayRef normalized_shape, const Tensor& weight,
                                        std::optional<double> eps_in) {
  const double eps = resolve_eps(x, eps_in);
  const auto a = kprof::norm_args(kOp, x, C10_AS_INTARRAYREF_SLOW(normalized_shape), weight, std::nullopt, eps);
  Tensor y = at::empty(x.sizes(), a.x.options());
  Tensor rstd = at::empty({a.rows}, a.x.options().dtype(kprof::norm_stats_dtype(a.x)));
  if (a.x.is_cuda()) {
    KPROF_CUDA_CALL(a.x, kOp,
                    kprof_rmsnorm_fwd_cuda(a.x.const_data_ptr(), a.weight.const_data_ptr(), y.mutable_data_ptr(),
                                           rstd.mutable_data_ptr<float>(), a.rows, kprof::cuda_cols(a),
                                           static_cast<float>(eps), kprof::dtype_code(a.x),
                                           kprof::dtype_code(a.weight), kprof::current_stream()));
    return {y, rstd};
  }
  kprof::norm_dispatch_cpu(a.x, a.weight, [&](auto t, auto w) {
    forward_cpu<decltype(t), decltype(w)>(a, eps, y, rstd);
  });
  return {y, rstd};
}

std::tuple<Tensor, Tensor> rms_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& weight,
                                             const Tensor& rstd_in, double eps) {
  const auto a = kprof::norm_args(kOp, x, weight.sizes(), weight, std::nullopt, eps);
  const Tensor dy = kprof::norm_grad(kOp, x, grad);
  const Tensor rstd = kprof::norm_stat(kOp, "rstd", a, rstd_in);
  Tensor dx = at::empty(x.sizes(), a.x.options());
  Tensor dw = at::empty(weight.sizes(), a.weight.options());
  if (a.rows == 0) return {dx, dw.zero_()};
  if (a.x.is_cuda()) {
    KPROF_CUDA_CALL(a.x, kOp, kprof::with_workspace(a.x, [&](float* workspace, int64_t* floats) {
      return kprof_rmsnorm_bwd_cuda(dy.const_data_ptr(), a.x.const_data_ptr(), a.weight.const_data_ptr(),
                                    rstd.const_data_ptr<float>(), dx.mutable_data_ptr(), dw.mutable_data_ptr(),
                                    workspace, floats, a.rows, kprof::cuda_cols(a), kprof::dtype_code(a.x),
                                    kprof::dtype_code(a.weight), kprof::current_stream());
    }));
    return {dx, dw};
  }
  kprof::norm_dispatch_cpu(a.x, a.weight, [&](auto t, auto w) {
    backward_cpu<decltype(t), decltype(w)>(a, dy, rstd, dx, dw);
  });
  return {dx, dw};
}

const auto& fwd_op() { return kprof::op<rms_norm_fwd>("kprof::rms_norm_fwd"); }
const auto& backward_op() { return kprof::op<rms_norm_backward>("kprof::rms_norm_backward"); }

// The public operator below autograd (and on meta/fake tensors): the forward's output without its statistic.
Tensor rms_norm(const Tensor& x, c10::SymIntArrayRef normalized_shape, const Tensor& weight,
                std::optional<double> eps) {
  return std::get<0>(fwd_op().call(x, normalized_shape, weight, eps));
}

// Autograd of the public operator: rstd stays in the node (see layer_norm_autograd).
variable_list rms_norm_grads(const Tensor& grad, const std::array<Tensor, 3>& s, const double& eps) {
  auto [dx, dw] = backward_op().call(grad, s[0], s[1], s[2], eps);
  return {dx, dw};
}

Tensor rms_norm_autograd(const Tensor& x, c10::SymIntArrayRef normalized_shape, const Tensor& weight,
                         std::optional<double> eps) {
  auto [y, rstd] = kprof::call_below_autograd(fwd_op(), x, normalized_shape, weight, eps);
  if (!kprof::records(x, weight)) return y;
  return kprof::recorded(std::move(y), "kprof::RMSNormBackward", rms_norm_grads, resolve_eps(x, eps),
                         std::array{x, weight, rstd}, x, weight);
}

// The backward from differentiable ATen ops, rstd recomputed from x, in float32 (float64 for float64 x): what runs
// under create_graph, so a second derivative through the layer is right.
std::tuple<Tensor, Tensor> rms_norm_backward_twin(const Tensor& grad, const Tensor& x, const Tensor& weight,
                                                  double eps) {
  const c10::SymInt n = weight.sym_numel();
  const Tensor xr = kprof::upcast(x.reshape_symint({-1, n}), x), g = kprof::upcast(grad.reshape_symint({-1, n}), x);
  const Tensor rstd = (xr.square().mean(-1, true) + eps).rsqrt();
  const Tensor gw = g * kprof::upcast(weight.reshape_symint({n}), x);
  const Tensor dx = rstd * gw - xr * rstd.pow(3) * (gw * xr).mean(-1, true);
  return {dx.to(x.scalar_type()).view_symint(x.sym_sizes()),
          (g * xr * rstd).sum(0).to(weight.scalar_type()).view_symint(weight.sym_sizes())};
}

std::tuple<Tensor, Tensor> rms_norm_backward_autograd(const Tensor& grad, const Tensor& x, const Tensor& weight,
                                                      const Tensor& rstd, double eps) {
  if (kprof::records(grad, x, weight)) return rms_norm_backward_twin(grad, x, weight, eps);
  return kprof::call_below_autograd(backward_op(), grad, x, weight, rstd, eps);
}

void kernels(torch::Library& m) {
  m.impl("rms_norm_fwd", &rms_norm_fwd);
  m.impl("rms_norm_backward", &rms_norm_backward);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kprof, m) {
  const std::vector<at::Tag> tags{at::Tag::pt2_compliant_tag};
  m.def("rms_norm(Tensor x, SymInt[] normalized_shape, Tensor weight, float? eps=None) -> Tensor", tags);
  m.def("rms_norm_fwd(Tensor x, SymInt[] normalized_shape, Tensor weight, float? eps) -> (Tensor, Tensor)", tags);
  m.def("rms_norm_backward(Tensor grad, Tensor x, Tensor weight, Tensor rstd, float eps) -> (Tensor, Tensor)", tags);
}

KPROF_CPU_AND_CUDA_KERNELS(kernels)

TORCH_LIBRARY_IMPL(kprof, CompositeExplicitAutograd, m) { m.impl("rms_norm", &rms_norm); }

TORCH_LIBRARY_IMPL(kprof, Autograd, m) {
  m.impl("rms_norm", &rms_norm_autograd);
  m.impl("rms_norm_fwd", torch::CppFunction::makeFromBoxedFunction<&kprof::no_autograd_of_its_own>());
  m.impl("rms_norm_backward", &rms_norm_backward_autograd);
}

KPROF_AUTOCAST_LIKE("rms_norm", rms_norm_autograd, "aten::rms_norm", "")

KPROF_PYTHON_MODULE(KPROF_FAST("rms_norm", rms_norm_autograd))
