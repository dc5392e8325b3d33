// LayerNorm as torch operators: kprof::layer_norm (the public one, F.layer_norm's signature with a weight required,
// differentiable), kprof::layer_norm_fwd (y, mean, rstd: what it runs below autograd) and
// kprof::layer_norm_backward. CPU kernels here (at::parallel_for over rows, accumulation in float, or double for
// double inputs), the CUDA launchers in layernorm.cu, autograd, autocast as torch's layer_norm, and the registration
// (see _dispatch.h). Weight and bias are in x's dtype or float32 for float16/bfloat16 x; mean/rstd are [rows] in the
// accumulation type (norm_stats_dtype).
#include "_dispatch.h"
#include "_norm_op.h"

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

using at::Tensor;
using torch::autograd::variable_list;

constexpr const char* kOp = "kprof layer_norm";

template <typename T, typename W>
void forward_cpu(const kprof::NormArgs& a, double eps, Tensor& y, Tensor& mean, Tensor& rstd) {
  using acc_t = at::opmath_type<T>;
  const int64_t n = a.n;
  const T* xp = a.x.const_data_ptr<T>();
  const W* wp = a.weight.const_data_ptr<W>();
  const W* bp = a.bias ? a.bias->const_data_ptr<W>() : nullptr;
  T* yp = y.mutable_data_ptr<T>();
  acc_t* mp = mean.mutable_data_ptr<acc_t>();
  acc_t* rp = rstd.mutable_data_ptr<acc_t>();
  kprof::for_each_row(a.rows, n, [&](int64_t r) {
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
void backward_cpu(const kprof::NormArgs& a, const Tensor& dy, const Tensor& mean, const Tensor& rstd, Tensor& dx,
                  Tensor& dw, Tensor* db) {
  using acc_t = at::opmath_type<T>;
  const int64_t n = a.n;
  const T *dyp = dy.const_data_ptr<T>(), *xp = a.x.const_data_ptr<T>();
  const W* wp = a.weight.const_data_ptr<W>();
  const acc_t *mp = mean.const_data_ptr<acc_t>(), *rp = rstd.const_data_ptr<acc_t>();
  T* dxp = dx.mutable_data_ptr<T>();
  std::vector<W*> grads{dw.mutable_data_ptr<W>()};
  if (db != nullptr) grads.push_back(db->mutable_data_ptr<W>());
  kprof::rows_with_partials<acc_t>(a.rows, n, grads, [&](int64_t r, acc_t* const* part) {
    const T *xr = xp + r * n, *dyr = dyp + r * n;
    const acc_t mu = mp[r], rs = rp[r];
    acc_t s_gx = 0, s_g = 0;
    for (int64_t c = 0; c < n; ++c) {
      const acc_t xh = (static_cast<acc_t>(xr[c]) - mu) * rs, d = static_cast<acc_t>(dyr[c]);
      const acc_t g = d * static_cast<acc_t>(wp[c]);
      s_gx += g * xh;
      s_g += g;
      part[0][c] += d * xh;
      if (db != nullptr) part[1][c] += d;
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

std::tuple<Tensor, Tensor, Tensor> layer_norm_fwd(const Tensor& x, c10::SymIntArrayRef normalized_shape,
                                                  const Tensor& weight, const std::optional<Tensor>& bias,
                                                  double eps) {
  const auto a = kprof::norm_args(kOp, x, C10_AS_INTARRAYREF_SLOW(normalized_shape), weight, bias, eps);
  Tensor y = at::empty(x.sizes(), a.x.options());
  Tensor mean = at::empty({a.rows}, a.x.options().dtype(kprof::norm_stats_dtype(a.x)));
  Tensor rstd = at::empty_like(mean);
  if (a.x.is_cuda()) {
    KPROF_CUDA_CALL(a.x, kOp,
                    kprof_layernorm_fwd_cuda(a.x.const_data_ptr(), a.weight.const_data_ptr(),
                                             a.bias ? a.bias->const_data_ptr() : nullptr, y.mutable_data_ptr(),
                                             mean.mutable_data_ptr<float>(), rstd.mutable_data_ptr<float>(), a.rows,
                                             kprof::cuda_cols(a), static_cast<float>(eps), kprof::dtype_code(a.x),
                                             kprof::dtype_code(a.weight), kprof::current_stream()));
    return {y, mean, rstd};
  }
  kprof::norm_dispatch_cpu(a.x, a.weight, [&](auto t, auto w) {
    forward_cpu<decltype(t), decltype(w)>(a, eps, y, mean, rstd);
  });
  return {y, mean, rstd};
}

// (dx, dweight, dbias); dbias is empty ([0]) when the forward had no bias.
std::tuple<Tensor, Tensor, Tensor> layer_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& weight,
                                                       const Tensor& mean_in, const Tensor& rstd_in, double eps,
                                                       bool bias) {
  const auto a = kprof::norm_args(kOp, x, weight.sizes(), weight, std::nullopt, eps);
  const Tensor dy = kprof::norm_grad(kOp, x, grad);
  const Tensor mean = kprof::norm_stat(kOp, "mean", a, mean_in), rstd = kprof::norm_stat(kOp, "rstd", a, rstd_in);
  Tensor dx = at::empty(x.sizes(), a.x.options());
  Tensor dw = at::empty(weight.sizes(), a.weight.options());
  Tensor db = at::empty(bias ? weight.sizes() : at::IntArrayRef{0}, a.weight.options());
  Tensor* db_out = bias ? &db : nullptr;
  if (a.rows == 0) {
    dw.zero_();
    db.zero_();
    return {dx, dw, db};
  }
  if (a.x.is_cuda()) {
    KPROF_CUDA_CALL(a.x, kOp, kprof::with_workspace(a.x, [&](float* workspace, int64_t* floats) {
      return kprof_layernorm_bwd_cuda(dy.const_data_ptr(), a.x.const_data_ptr(), a.weight.const_data_ptr(),
                                      mean.const_data_ptr<float>(), rstd.const_data_ptr<float>(),
                                      dx.mutable_data_ptr(), dw.mutable_data_ptr(),
                                      bias ? db.mutable_data_ptr() : nullptr, workspace, floats, a.rows,
                                      kprof::cuda_cols(a), kprof::dtype_code(a.x), kprof::dtype_code(a.weight),
                                      kprof::current_stream());
    }));
    return {dx, dw, db};
  }
  kprof::norm_dispatch_cpu(a.x, a.weight, [&](auto t, auto w) {
    backward_cpu<decltype(t), decltype(w)>(a, dy, mean, rstd, dx, dw, db_out);
  });
  return {dx, dw, db};
}

const auto& fwd_op() { return kprof::op<layer_norm_fwd>("kprof::layer_norm_fwd"); }
const auto& backward_op() { return kprof::op<layer_norm_backward>("kprof::layer_norm_backward"); }

// The public operator below autograd (and on meta/fake tensors): the forward's output without its statistics.
Tensor layer_norm(const Tensor& x, c10::SymIntArrayRef normalized_shape, const Tensor& weight,
                  const std::optional<Tensor>& bias, double eps) {
  return std::get<0>(fwd_op().call(x, normalized_shape, weight, bias, eps));
}

// Autograd of the public operator: the forward runs below autograd and its statistics stay in the node (one
// differentiable output; the backward recomputes their dependence on x when it must be differentiable itself).
struct LayerNormConsts {
  double eps;
  bool bias;
};

variable_list layer_norm_grads(const Tensor& grad, const std::array<Tensor, 4>& s, const LayerNormConsts& c) {
  auto [dx, dw, db] = backward_op().call(grad, s[0], s[1], s[2], s[3], c.eps, c.bias);
  return {dx, dw, c.bias ? db : Tensor()};
}

Tensor layer_norm_autograd(const Tensor& x, c10::SymIntArrayRef normalized_shape, const Tensor& weight,
                           const std::optional<Tensor>& bias, double eps) {
  auto [y, mean, rstd] = kprof::call_below_autograd(fwd_op(), x, normalized_shape, weight, bias, eps);
  if (!kprof::records(x, weight, bias)) return y;
  return kprof::recorded(std::move(y), "kprof::LayerNormBackward", layer_norm_grads,
                         LayerNormConsts{eps, bias.has_value()}, std::array{x, weight, mean, rstd}, x, weight, bias);
}

// The backward from differentiable ATen ops, statistics recomputed from x, in float32 (float64 for float64 x):
// what runs under create_graph, so a second derivative through the layer is right.
std::tuple<Tensor, Tensor, Tensor> layer_norm_backward_twin(const Tensor& grad, const Tensor& x,
                                                            const Tensor& weight, double eps, bool bias) {
  const c10::SymInt n = weight.sym_numel();
  const Tensor xr = kprof::upcast(x.reshape_symint({-1, n}), x), g = kprof::upcast(grad.reshape_symint({-1, n}), x);
  const Tensor xc = xr - xr.mean(-1, true);
  const Tensor rstd = (xc.square().mean(-1, true) + eps).rsqrt();
  const Tensor xhat = xc * rstd, gw = g * kprof::upcast(weight.reshape_symint({n}), x);
  const Tensor dx = rstd * (gw - gw.mean(-1, true) - xhat * (gw * xhat).mean(-1, true));
  const auto as_param = [&](const Tensor& t) { return t.to(weight.scalar_type()).view_symint(weight.sym_sizes()); };
  return {dx.to(x.scalar_type()).view_symint(x.sym_sizes()), as_param((g * xhat).sum(0)),
          bias ? as_param(g.sum(0)) : at::empty({0}, weight.options())};
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_backward_autograd(const Tensor& grad, const Tensor& x,
                                                                const Tensor& weight, const Tensor& mean,
                                                                const Tensor& rstd, double eps, bool bias) {
  if (kprof::records(grad, x, weight)) return layer_norm_backward_twin(grad, x, weight, eps, bias);
  return kprof::call_below_autograd(backward_op(), grad, x, weight, mean, rstd, eps, bias);
}

void kernels(torch::Library& m) {
  m.impl("layer_norm_fwd", &layer_norm_fwd);
  m.impl("layer_norm_backward", &layer_norm_backward);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kprof, m) {
  const std::vector<at::Tag> tags{at::Tag::pt2_compliant_tag};
  m.def("layer_norm(Tensor x, SymInt[] normalized_shape, Tensor weight, Tensor? bias=None, float eps=1e-05) -> Tensor",
        tags);
  m.def("layer_norm_fwd(Tensor x, SymInt[] normalized_shape, Tensor weight, Tensor? bias, float eps) "
        "-> (Tensor, Tensor, Tensor)",
        tags);
  m.def("layer_norm_backward(Tensor grad, Tensor x, Tensor weight, Tensor mean, Tensor rstd, float eps, bool bias) "
        "-> (Tensor, Tensor, Tensor)",
        tags);
}

KPROF_CPU_AND_CUDA_KERNELS(kernels)

TORCH_LIBRARY_IMPL(kprof, CompositeExplicitAutograd, m) { m.impl("layer_norm", &layer_norm); }

TORCH_LIBRARY_IMPL(kprof, Autograd, m) {
  m.impl("layer_norm", &layer_norm_autograd);
  m.impl("layer_norm_fwd", torch::CppFunction::makeFromBoxedFunction<&kprof::no_autograd_of_its_own>());
  m.impl("layer_norm_backward", &layer_norm_backward_autograd);
}

KPROF_AUTOCAST_LIKE("layer_norm", layer_norm_autograd, "aten::layer_norm", "")

KPROF_PYTHON_MODULE(KPROF_FAST("layer_norm", layer_norm_autograd))
