// Linear + cross-entropy as torch operators: kprof::linear_cross_entropy (the public one, differentiable),
// kprof::linear_cross_entropy_fwd (the loss and, when asked, the input gradients, computed in the forward) and
// kprof::linear_cross_entropy_backward (the gradients recomputed from the inputs). Both run one loop over chunks of
// tokens: the chunk's logits through ATen's matrix product (cuBLAS on CUDA) in the input dtype, the row kernel
// (linear_cross_entropy.cu; a CPU loop here) that writes each row's loss and, for gradients, overwrites the chunk with
// d loss / d logits, then d hidden and d weight as two more products. The logits of the whole batch, [tokens, vocab],
// never exist: one chunk's (at most kChunkBytes) does. Autograd, autocast (as torch's linear) and the registration as
// in the other layers (_dispatch.h).
#include "_dispatch.h"
#include "_op.h"

#include <ATen/ops/addmm.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros.h>

#include <c10/util/accumulate.h>

#include <array>
#include <cmath>
#include <limits>

#ifdef KPROF_WITH_CUDA
extern "C" {
cudaError_t kprof_lce_rows(int dtype, void* logits, int64_t rows, int64_t vocab, const int64_t* target,
                           int64_t ignore_index, float smoothing, float softcap, const float* grad,
                           int64_t grad_stride, const int64_t* count, float* loss, bool write_grad,
                           cudaStream_t stream);
}
#endif

namespace {

using at::Tensor;
using torch::autograd::variable_list;
using Mask = std::array<bool, 3>;  // gradients wanted: hidden, weight, bias

constexpr const char* kOp = "kprof linear_cross_entropy";
// The logits of one chunk stay under this many bytes (256 MiB: 2560 rows of a 50304-word bf16 vocabulary, 1024 of
// Llama 3's 128256), in whole multiples of 128 rows and at least 128, so cuBLAS keeps large, efficient products.
constexpr int64_t kChunkBytes = int64_t{256} << 20;

enum class Reduction { kNone, kMean, kSum };

Reduction reduction_of(c10::string_view r) {
  if (r == "none") return Reduction::kNone;
  if (r == "mean") return Reduction::kMean;
  TORCH_CHECK_VALUE(r == "sum", kprof::msg(kOp, ": reduction must be 'none', 'mean' or 'sum', got '", r, "'"));
  return Reduction::kSum;
}

// The inputs as the loop reads them: hidden [rows, H], weight [vocab, H], target [rows] (int64), bias [vocab].
struct Args {
  Tensor hidden, weight, target;
  std::optional<Tensor> bias;
  int64_t rows, vocab;
  int64_t ignore_index = -100;
  Reduction reduction = Reduction::kMean;
  double smoothing = 0.0;
  double cap = 0.0;  // 0: no softcap
};

void check_targets_cpu(const Args& a) {
  const Tensor bad = (a.target.lt(0) | a.target.ge(a.vocab)) & a.target.ne(a.ignore_index);
  if (!bad.any().item<bool>()) return;
  const int64_t first = a.target.masked_select(bad)[0].item<int64_t>();
  TORCH_CHECK_INDEX(false, kprof::msg(kOp, ": target ", first, " is out of range for ", a.vocab, " classes"));
}

Args args_of(const Tensor& hidden_in, const Tensor& weight_in, const Tensor& target_in,
             const std::optional<Tensor>& bias_in, int64_t ignore_index, c10::string_view reduction,
             double smoothing, std::optional<double> softcap) {
  const Tensor hidden = kprof::checked(hidden_in, kOp, "hidden");
  TORCH_CHECK_VALUE(hidden.dim() >= 1 && weight_in.dim() == 2,
                    kprof::msg(kOp, ": hidden must be [..., H] and weight [vocab, H], got ", hidden.sizes(), " and ",
                               weight_in.sizes()));
  const int64_t width = hidden.size(-1), vocab = weight_in.size(0);
  TORCH_CHECK_VALUE(vocab >= 1, kprof::msg(kOp, ": weight has no rows (an empty vocabulary)"));
  const Tensor weight = kprof::checked_like(hidden, weight_in, kOp, "weight", at::IntArrayRef{vocab, width});
  TORCH_CHECK_TYPE(target_in.scalar_type() == at::kLong && target_in.device() == hidden.device(),
                   kprof::msg(kOp, ": target is ", target_in.scalar_type(), " on ", target_in.device(),
                              ", expected int64 class indices on ", hidden.device()));
  const auto batch = hidden.sizes().slice(0, hidden.dim() - 1);
  TORCH_CHECK_VALUE(target_in.sizes() == batch, kprof::msg(kOp, ": target has shape ", target_in.sizes(),
                                                           ", expected hidden's leading dims ", batch));
  std::optional<Tensor> bias;
  if (bias_in) bias = kprof::checked_like(hidden, *bias_in, kOp, "bias", at::IntArrayRef{vocab});
  TORCH_CHECK_VALUE(smoothing >= 0.0 && smoothing <= 1.0,
                    kprof::msg(kOp, ": label_smoothing must be in [0, 1], got ", smoothing));
  TORCH_CHECK_VALUE(!softcap || *softcap > 0.0, kprof::msg(kOp, ": softcap must be > 0 or None, got ", *softcap));
  const int64_t rows = c10::multiply_integers(batch);
  Args a{hidden.reshape({rows, width}), weight, target_in.reshape({rows}).contiguous(), bias, rows, vocab};
  a.ignore_index = ignore_index;
  a.reduction = reduction_of(reduction);
  a.smoothing = smoothing;
  a.cap = softcap.value_or(0.0);
  if (!hidden.is_cuda()) check_targets_cpu(a);
  return a;
}

at::ScalarType acc_dtype(const Tensor& t) { return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

// Rows per chunk: `asked` if positive, else as few chunks as kChunkBytes allows, of equal size (rounded up to 128
// rows), so the last chunk's products are not a sliver that leaves most of the GPU idle.
int64_t chunk_rows(const Args& a, int64_t asked) {
  if (asked > 0) return asked;
  const int64_t cap = std::max<int64_t>(
      kChunkBytes / (a.vocab * static_cast<int64_t>(a.hidden.element_size())) / 128 * 128, 128);
  const int64_t chunks = std::max<int64_t>((a.rows + cap - 1) / cap, 1);
  const int64_t even = ((a.rows + chunks - 1) / chunks + 127) / 128 * 128;
  return std::min(even, cap);
}

// One row on the CPU: the row's loss and, when `scale` is finite, its gradient written over it (as the CUDA kernel).
template <typename T, typename A>
A cpu_row(T* x, int64_t vocab, int64_t t, const Args& a, A scale, bool write_grad) {
  const A cap = static_cast<A>(a.cap), eps = static_cast<A>(a.smoothing);
  const auto z_of = [&](T v) { return cap > 0 ? cap * std::tanh(static_cast<A>(v) / cap) : static_cast<A>(v); };
  A m = -std::numeric_limits<A>::infinity(), s = 0, sz = 0;
  for (int64_t j = 0; j < vocab; ++j) m = std::max(m, z_of(x[j]));
  for (int64_t j = 0; j < vocab; ++j) {
    const A z = z_of(x[j]);
    s += std::exp(z - m);
    sz += z;
  }
  const A lse = m + std::log(s);
  const A loss = lse - (1 - eps) * z_of(x[t]) - eps * sz / static_cast<A>(vocab);
  if (write_grad) {
    for (int64_t j = 0; j < vocab; ++j) {
      const A z = z_of(x[j]);
      A d = std::exp(z - lse) - eps / static_cast<A>(vocab) - (j == t ? 1 - eps : A(0));
      if (cap > 0) d *= 1 - (z / cap) * (z / cap);
      x[j] = static_cast<T>(d * scale);
    }
  }
  return loss;
}

// The row kernel over one chunk of logits [c, vocab], in place; loss [c] in the accumulation dtype. `grad`: the
// chunk's per-row scales or one scalar (undefined: 1), divided by `count` (the batch's non-ignored rows) if defined.
void rows_step(const Args& a, Tensor& logits, const Tensor& target, Tensor& loss, const Tensor& grad,
               const Tensor& count, bool write_grad) {
  const int64_t c = logits.size(0);
  if (logits.is_cuda()) {
    KPROF_CUDA_CALL(logits, kOp,
                    kprof_lce_rows(kprof::dtype_code(logits), logits.mutable_data_ptr(), c, a.vocab,
                                   target.const_data_ptr<int64_t>(), a.ignore_index, static_cast<float>(a.smoothing),
                                   static_cast<float>(a.cap), grad.defined() ? grad.const_data_ptr<float>() : nullptr,
                                   grad.defined() && grad.numel() > 1 ? 1 : 0,
                                   count.defined() ? count.const_data_ptr<int64_t>() : nullptr,
                                   loss.mutable_data_ptr<float>(), write_grad, kprof::current_stream()));
    return;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, logits.scalar_type(), kOp, [&] {
    using acc_t = at::opmath_type<scalar_t>;
    scalar_t* x = logits.mutable_data_ptr<scalar_t>();
    const int64_t* t = target.const_data_ptr<int64_t>();
    acc_t* out = loss.mutable_data_ptr<acc_t>();
    const acc_t* g = grad.defined() ? grad.const_data_ptr<acc_t>() : nullptr;
    const int64_t stride = grad.defined() && grad.numel() > 1 ? 1 : 0;
    const acc_t denominator = count.defined() ? static_cast<acc_t>(count.item<int64_t>()) : acc_t(1);
    at::parallel_for(0, c, 1, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        scalar_t* row = x + r * a.vocab;
        if (t[r] == a.ignore_index) {
          if (write_grad) std::fill(row, row + a.vocab, scalar_t(0));
          out[r] = 0;
          continue;
        }
        const acc_t scale = (g != nullptr ? g[r * stride] : acc_t(1)) / denominator;
        out[r] = cpu_row<scalar_t, acc_t>(row, a.vocab, t[r], a, scale, write_grad);
      }
    });
  });
}

// The gradients being built: d hidden [rows, H], d weight [vocab, H] (input dtypes), d bias [vocab] accumulated in
// the accumulation dtype.
struct Grads {
  Tensor dh, dw, db;
};

// The chunk loop: each row's loss into `loss` [rows]; with a mask, the gradients of `mask`'s inputs too, each row's
// d logits scaled by `grad` (see rows_step).
Grads run_chunks(const Args& a, Tensor& loss, const Tensor& grad, const Tensor& count, const Mask& mask,
                 int64_t chunk) {
  const bool write_grad = mask[0] || mask[1] || mask[2];
  const auto opts = a.hidden.options();
  Grads g{at::empty(mask[0] ? a.hidden.sizes() : at::IntArrayRef{0}, opts),
          mask[1] ? (a.rows == 0 ? at::zeros(a.weight.sizes(), opts) : at::empty(a.weight.sizes(), opts))
                  : at::empty({0}, opts),
          mask[2] && a.bias ? at::zeros({a.vocab}, opts.dtype(acc_dtype(a.hidden))) : at::empty({0}, opts)};
  const Tensor weight_t = a.weight.t();
  const int64_t step = chunk_rows(a, chunk);
  for (int64_t start = 0; start < a.rows; start += step) {
    const int64_t c = std::min(step, a.rows - start);
    const Tensor h = a.hidden.narrow(0, start, c);
    Tensor logits = a.bias ? at::addmm(*a.bias, h, weight_t) : at::mm(h, weight_t);
    Tensor loss_c = loss.narrow(0, start, c);
    const Tensor grad_c = grad.defined() && grad.numel() > 1 ? grad.narrow(0, start, c) : grad;
    rows_step(a, logits, a.target.narrow(0, start, c), loss_c, grad_c, count, write_grad);
    if (mask[0]) {
      Tensor dh = g.dh.narrow(0, start, c);
      at::mm_out(dh, logits, a.weight);
    }
    if (mask[1]) {
      if (start == 0) {
        at::mm_out(g.dw, logits.t(), h);
      } else {
        g.dw.addmm_(logits.t(), h);
      }
    }
    if (mask[2] && a.bias) g.db.add_(logits.sum(0, false, acc_dtype(a.hidden)));
  }
  if (mask[2] && a.bias) g.db = g.db.to(a.hidden.scalar_type());
  return g;
}

// The non-ignored rows, for reduction "mean" (a device tensor: no host synchronization); else undefined.
Tensor count_of(const Args& a) {
  return a.reduction == Reduction::kMean ? a.target.ne(a.ignore_index).sum() : Tensor();
}

// (loss, d hidden, d weight, d bias). With an output mask (reduction "mean" or "sum" only) the gradients of the loss
// itself come out of the same pass; unasked ones, and d bias without a bias, are empty ([0]).
std::tuple<Tensor, Tensor, Tensor, Tensor> lce_fwd(const Tensor& hidden, const Tensor& weight, const Tensor& target,
                                                   const std::optional<Tensor>& bias, int64_t ignore_index,
                                                   c10::string_view reduction, double label_smoothing,
                                                   std::optional<double> softcap, Mask mask, int64_t chunk) {
  const Args a = args_of(hidden, weight, target, bias, ignore_index, reduction, label_smoothing, softcap);
  TORCH_CHECK_VALUE(!(mask[0] || mask[1] || mask[2]) || a.reduction != Reduction::kNone,
                    kprof::msg(kOp, ": gradients in the forward need reduction 'mean' or 'sum'"));
  Tensor loss = at::empty({a.rows}, a.hidden.options().dtype(acc_dtype(a.hidden)));
  const Tensor count = count_of(a);
  Grads g = run_chunks(a, loss, Tensor(), count, mask, chunk);
  if (mask[0]) g.dh = g.dh.view(hidden.sizes());
  if (a.reduction == Reduction::kNone) return {loss.view(target.sizes()), g.dh, g.dw, g.db};
  Tensor total = loss.sum();
  if (a.reduction == Reduction::kMean) total = total / count.to(total.scalar_type());
  return {total, g.dh, g.dw, g.db};
}

// (d hidden, d weight, d bias) of the loss for `grad` (a scalar for "mean"/"sum", target's shape for "none"),
// recomputed chunk by chunk; unasked ones are empty ([0]).
std::tuple<Tensor, Tensor, Tensor> lce_backward(const Tensor& grad, const Tensor& hidden, const Tensor& weight,
                                                const Tensor& target, const std::optional<Tensor>& bias,
                                                int64_t ignore_index, c10::string_view reduction,
                                                double label_smoothing, std::optional<double> softcap, Mask mask,
                                                int64_t chunk) {
  const Args a = args_of(hidden, weight, target, bias, ignore_index, reduction, label_smoothing, softcap);
  const bool none = a.reduction == Reduction::kNone;
  TORCH_CHECK_VALUE(grad.numel() == (none ? a.rows : 1) && grad.device() == hidden.device(),
                    kprof::msg(kOp, ": grad has shape ", grad.sizes(), " on ", grad.device(), ", expected ",
                               none ? target.sizes() : at::IntArrayRef{}, " on ", hidden.device()));
  const Tensor g_in = grad.to(acc_dtype(a.hidden)).reshape({-1}).contiguous();
  Tensor loss = at::empty({a.rows}, a.hidden.options().dtype(acc_dtype(a.hidden)));
  Grads g = run_chunks(a, loss, g_in, count_of(a), mask, chunk);
  return {mask[0] ? g.dh.view(hidden.sizes()) : g.dh, g.dw, g.db};
}

const auto& fwd_op() { return kprof::op<lce_fwd>("kprof::linear_cross_entropy_fwd"); }
const auto& backward_op() { return kprof::op<lce_backward>("kprof::linear_cross_entropy_backward"); }

// The public operator below autograd (and on meta/fake tensors): the loss alone.
Tensor lce(const Tensor& hidden, const Tensor& weight, const Tensor& target, const std::optional<Tensor>& bias,
           int64_t ignore_index, c10::string_view reduction, double label_smoothing, std::optional<double> softcap) {
  return std::get<0>(fwd_op().call(hidden, weight, target, bias, ignore_index, reduction, label_smoothing, softcap,
                                   Mask{false, false, false}, 0));
}

void no_double_backward() {
  TORCH_CHECK_NOT_IMPLEMENTED(!at::GradMode::is_enabled(),
                              kprof::msg(kOp, ": a second derivative (backward with create_graph=True) is not "
                                              "supported; compute the loss with torch ops for it"));
}

// Reduction "mean"/"sum": the forward computed the gradients for a loss gradient of 1; the backward scales them.
// `wanted`: the gradients the forward computed (the others are empty).
variable_list scaled_grads(const Tensor& grad, const std::array<Tensor, 3>& s, const Mask& wanted) {
  no_double_backward();
  const auto scaled = [&](size_t i) { return wanted[i] ? s[i] * grad : Tensor(); };
  return {scaled(0), scaled(1), scaled(2)};
}

struct RecomputeConsts {
  int64_t ignore_index;
  std::string reduction;
  double smoothing;
  std::optional<double> softcap;
  Mask mask;
};

// Reduction "none" (a gradient per row): the chunks' logits are recomputed and scaled by it.
variable_list recomputed_grads(const Tensor& grad, const std::array<Tensor, 4>& s, const RecomputeConsts& c) {
  no_double_backward();
  const std::optional<Tensor> bias = s[3].defined() ? std::optional<Tensor>(s[3]) : std::nullopt;
  auto [dh, dw, db] = kprof::call_below_autograd(backward_op(), grad, s[0], s[1], s[2], bias, c.ignore_index,
                                                 c.reduction, c.smoothing, c.softcap, c.mask, int64_t{0});
  const auto used = [](bool wanted, const Tensor& t) { return wanted ? t : Tensor(); };
  return {used(c.mask[0], dh), used(c.mask[1], dw), used(c.mask[2] && bias.has_value(), db)};
}

Tensor lce_autograd(const Tensor& hidden, const Tensor& weight, const Tensor& target,
                    const std::optional<Tensor>& bias, int64_t ignore_index, c10::string_view reduction,
                    double label_smoothing, std::optional<double> softcap) {
  const bool record = kprof::records(hidden, weight, bias);
  const Mask mask{kprof::requires_grad(hidden), kprof::requires_grad(weight), kprof::requires_grad(bias)};
  const bool fused = record && reduction_of(reduction) != Reduction::kNone;
  auto [loss, dh, dw, db] = kprof::call_below_autograd(fwd_op(), hidden, weight, target, bias, ignore_index,
                                                       reduction, label_smoothing, softcap,
                                                       fused ? mask : Mask{false, false, false}, int64_t{0});
  if (!record) return loss;
  constexpr const char* kNode = "kprof::LinearCrossEntropyBackward";
  if (fused) return kprof::recorded(loss, kNode, scaled_grads, Mask{mask[0], mask[1], mask[2] && bias.has_value()},
                                    std::array{dh, dw, db}, hidden, weight, bias);
  return kprof::recorded(loss, kNode, recomputed_grads,
                         RecomputeConsts{ignore_index, std::string(reduction), label_smoothing, softcap, mask},
                         std::array{hidden, weight, target, kprof::tensor_of(bias)}, hidden, weight, bias);
}

void kernels(torch::Library& m) {
  m.impl("linear_cross_entropy_fwd", &lce_fwd);
  m.impl("linear_cross_entropy_backward", &lce_backward);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kprof, m) {
  const std::vector<at::Tag> tags{at::Tag::pt2_compliant_tag};
  m.def("linear_cross_entropy(Tensor hidden, Tensor weight, Tensor target, Tensor? bias=None, int ignore_index=-100, "
        "str reduction=\"mean\", float label_smoothing=0.0, float? softcap=None) -> Tensor",
        tags);
  m.def("linear_cross_entropy_fwd(Tensor hidden, Tensor weight, Tensor target, Tensor? bias, int ignore_index, "
        "str reduction, float label_smoothing, float? softcap, bool[3] output_mask, int chunk) "
        "-> (Tensor, Tensor, Tensor, Tensor)",
        tags);
  m.def("linear_cross_entropy_backward(Tensor grad, Tensor hidden, Tensor weight, Tensor target, Tensor? bias, "
        "int ignore_index, str reduction, float label_smoothing, float? softcap, bool[3] output_mask, int chunk) "
        "-> (Tensor, Tensor, Tensor)",
        tags);
}

KPROF_CPU_AND_CUDA_KERNELS(kernels)

TORCH_LIBRARY_IMPL(kprof, CompositeExplicitAutograd, m) { m.impl("linear_cross_entropy", &lce); }

TORCH_LIBRARY_IMPL(kprof, Autograd, m) {
  m.impl("linear_cross_entropy", &lce_autograd);
  m.impl("linear_cross_entropy_fwd", torch::CppFunction::makeFromBoxedFunction<&kprof::no_autograd_of_its_own>());
  m.impl("linear_cross_entropy_backward",
         torch::CppFunction::makeFromBoxedFunction<&kprof::no_autograd_of_its_own>());
}

KPROF_AUTOCAST_LOWER_PRECISION_LIKE("linear_cross_entropy", lce_autograd, "aten::linear", "")

KPROF_PYTHON_MODULE(KPROF_FAST("linear_cross_entropy", lce_autograd))
