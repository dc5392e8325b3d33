// kprof::add(a, b) = a + b (one shape, dtype and device; no broadcasting): the CPU kernel here, the CUDA launcher in
// add.cu, autograd (the gradient passes through to both inputs) and the registration (see _dispatch.h).
#include "_dispatch.h"
#include "_op.h"

#ifdef KPROF_WITH_CUDA
extern "C" cudaError_t kprof_add_forward(int dtype, const void* a, const void* b, void* out, int64_t n,
                                         cudaStream_t stream);
#endif

namespace {

constexpr const char* kOp = "kprof add";

at::Tensor add(const at::Tensor& a_in, const at::Tensor& b_in) {
  const at::Tensor a = kprof::checked(a_in, kOp, "a");
  const at::Tensor b = kprof::checked_like(a, b_in, kOp, "b");
  at::Tensor out = kprof::empty_like(a);
  if (a.is_cuda()) {
    KPROF_CUDA_CALL(a, kOp, kprof_add_forward(kprof::dtype_code(a), a.const_data_ptr(), b.const_data_ptr(),
                                              out.mutable_data_ptr(), a.numel(), kprof::current_stream()));
    return out;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), kOp, [&] {
    kprof::cpu_map(a.numel(), [](auto x, auto y) { return x + y; }, out.mutable_data_ptr<scalar_t>(),
                   a.const_data_ptr<scalar_t>(), b.const_data_ptr<scalar_t>());
  });
  return out;
}

const auto& add_op() { return kprof::op<add>("kprof::add"); }

torch::autograd::variable_list add_grads(const at::Tensor& grad, const std::array<at::Tensor, 0>&,
                                         const kprof::NoConsts&) {
  return {grad, grad};  // differentiable as it is: double backward needs nothing more
}

at::Tensor add_autograd(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor out = kprof::call_below_autograd(add_op(), a, b);
  if (!kprof::records(a, b)) return out;
  return kprof::recorded(std::move(out), "kprof::AddBackward", add_grads, kprof::NoConsts{},
                         std::array<at::Tensor, 0>{}, a, b);
}

void kernels(torch::Library& m) { m.impl("add", &add); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(kprof, m) {
  m.def("add(Tensor a, Tensor b) -> Tensor", {at::Tag::pt2_compliant_tag});
}

KPROF_CPU_AND_CUDA_KERNELS(kernels)

TORCH_LIBRARY_IMPL(kprof, Autograd, m) { m.impl("add", &add_autograd); }

KPROF_AUTOCAST_LIKE("add", add_autograd, "aten::add", "Tensor")

KPROF_PYTHON_MODULE(KPROF_FAST("add", add_autograd))
