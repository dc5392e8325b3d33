// How every kprof library registers its torch.ops.kprof operators (torchvision's pattern for roi_align): schemas
// with TORCH_LIBRARY_FRAGMENT (each library adds its own to the one namespace), one kernel function per operator
// for both the CPU and the CUDA key (it picks the device itself), autograd at the Autograd key (a backward node of
// its own, `recorded` below), and autocast that mirrors torch's own policy for the op a layer replaces. The dispatcher then
// does per call what Python code did before: no Python frame between the call and the kernel, and the profiler
// records `kprof::<op>` by itself. Fake (shape-only) kernels for torch.compile are registered from Python.
#pragma once

#include "_fastcall.h"
#include "_op.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include <Python.h>

#include <array>
#include <string>
#include <functional>
#include <type_traits>
#include <initializer_list>
#include <optional>

namespace kprof {

// The dispatcher handle of the operator `name` whose kernels have the signature of `kernel`, looked up once per
// process: op<gelu_forward>("kprof::gelu").call(x, "tanh") dispatches kprof::gelu.
template <auto& kernel>
const auto& op(const char* name) {
  using Sig = std::remove_reference_t<decltype(kernel)>;
  static const auto handle = c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
  return handle;
}

// Calls `op` below the autograd keys: what an Autograd kernel does for the computation it records itself.
template <typename Sig, typename... Args>
auto call_below_autograd(const c10::TypedOperatorHandle<Sig>& op, Args&&... args) {
  at::AutoDispatchBelowADInplaceOrView guard;
  return op.call(std::forward<Args>(args)...);
}

inline bool requires_grad(const at::Tensor& t) { return t.defined() && t.requires_grad(); }
inline bool requires_grad(const std::optional<at::Tensor>& t) { return t.has_value() && requires_grad(*t); }
template <typename T>
bool requires_grad(const T&) {
  return false;
}

// True when autograd records this call: grad mode is on and a tensor argument requires grad. Otherwise an Autograd
// kernel calls the computation below autograd at once, skipping the graph node (and its cost), as torch's own
// generated autograd kernels do. In a backward operator's Autograd kernel it means create_graph=True (the engine
// turns grad mode on only then): the backward then computes with differentiable ATen ops (its "twin") instead of
// the fast kernel, so a second derivative (a gradient penalty) is right, never silently wrong.
template <typename... Args>
bool records(const Args&... args) {
  return at::GradMode::is_enabled() && (requires_grad(args) || ...);
}

// -- backward nodes ----------------------------------------------------------------------------------------------
// A layer's node in the autograd graph, written as torch's generated ones are (GeluBackward0 and the like): the saved
// tensors as SavedVariables, the constants as a member, apply() calling the backward operator. A
// torch::autograd::Function does the same through an AutogradContext made on every call (a string-keyed map of
// IValues, vectors of saved variables and of per-input flags), host time paid on every layer of a host-bound model.
// `Backward(grad, saved, consts)` returns one gradient per recorded input, in their order (undefined: none).
template <size_t kSaved, typename Consts>
using Backward = torch::autograd::variable_list (*)(const at::Tensor& grad, const std::array<at::Tensor, kSaved>& saved,
                                                    const Consts& consts);

struct NoConsts {};

template <size_t kSaved, typename Consts>
struct GradNode final : torch::autograd::Node {
  GradNode(const char* name, Backward<kSaved, Consts> backward, Consts consts)
      : name_(name), backward_(backward), consts_(std::move(consts)) {}

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    if (!grads[0].defined()) return torch::autograd::variable_list(num_outputs());  // no gradient reached the output
    std::array<at::Tensor, kSaved> saved;
    for (size_t i = 0; i < kSaved; ++i) saved[i] = saved_[i].unpack();  // raises if one was modified in place
    return backward_(grads[0], saved, consts_);
  }

  void release_variables() override {
    for (auto& s : saved_) s.reset_data();
  }

  std::string name() const override { return name_; }

  std::array<torch::autograd::SavedVariable, kSaved> saved_;

 private:
  const char* name_;
  Backward<kSaved, Consts> backward_;
  Consts consts_;
};

// torch's pointer to a node: std::shared_ptr<Node>, deleted by torch's deleteNode (which frees long chains without
// recursing), before torch moved nodes to c10::intrusive_ptr.
using NodeRef = decltype(torch::autograd::Edge::function);

template <typename N, typename Ref = NodeRef, typename... Args>
Ref make_node(Args&&... args) {
  if constexpr (std::is_same_v<Ref, c10::intrusive_ptr<torch::autograd::Node>>) {
    return c10::make_intrusive<N>(std::forward<Args>(args)...);
  } else {
    N* node = new N(std::forward<Args>(args)...);
    return Ref(node, [](typename Ref::element_type* n) { deleteNode(n); });  // found by ADL: torch::autograd
  }
}

inline const at::Tensor& tensor_of(const at::Tensor& t) { return t; }
inline at::Tensor tensor_of(const std::optional<at::Tensor>& t) { return t.value_or(at::Tensor()); }
inline bool has_tangent(const at::Tensor& t) { return t.defined() && t._fw_grad(/*level=*/0).defined(); }

// `out`, recorded in the autograd graph as computed from `inputs` (Tensors or optional Tensors, in the order
// `backward` returns their gradients), with `saved` kept for the backward. The caller checked `records(inputs...)`.
template <size_t kSaved, typename Consts, typename... Inputs>
at::Tensor recorded(at::Tensor out, const char* name, Backward<kSaved, Consts> backward, Consts consts,
                    std::array<at::Tensor, kSaved> saved, const Inputs&... inputs) {
  TORCH_CHECK_NOT_IMPLEMENTED(!(has_tangent(tensor_of(inputs)) || ...),
                              msg(name, ": forward-mode AD (dual tensors, jvp) is not supported"));
  auto node = make_node<GradNode<kSaved, Consts>>(name, backward, std::move(consts));
  auto* grad_node = static_cast<GradNode<kSaved, Consts>*>(node.get());
  grad_node->set_next_edges(torch::autograd::collect_next_edges(tensor_of(inputs)...));
  for (size_t i = 0; i < kSaved; ++i) grad_node->saved_[i] = torch::autograd::SavedVariable(saved[i], false);
  torch::autograd::set_history(out, node);
  return out;
}

// The Autograd kernel of an operator that runs below another operator's autograd (a norm's forward that also
// returns the statistics its backward reads): it runs the kernel, and differentiating it directly is a clear error,
// not a silently missing gradient. Boxed, so one function serves every schema.
inline void no_autograd_of_its_own(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const auto n = static_cast<std::ptrdiff_t>(op.schema().arguments().size());
  for (auto it = stack->end() - n; it != stack->end(); ++it) {
    if (!(at::GradMode::is_enabled() && it->isTensor() && it->toTensor().requires_grad())) continue;
    const std::string& name = op.schema().name();  // kprof::<layer>_fwd or kprof::<layer>_backward
    TORCH_CHECK(false, kprof::msg(name, " has no autograd of its own: it runs below the autograd of ",
                                  name.substr(0, name.rfind('_')), ", the layer's operator; call that to get "
                                  "gradients"));
  }
  op.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
}

// An autocast policy for an operator of C++ signature R(Args...): every floating tensor argument on the autocast
// device is cast (to float32 for the fp32 policy, torch's for layer_norm, pow, ... on CUDA; with kLowerPrecision to
// the autocast dtype, torch's for linear and matmul), then the operator runs with this autocast key off. Unboxed, as
// torch's own autocast wrappers are (at::autocast::WrapFunction_): the arguments go straight to the typed call, with
// no IValue stack and no list allocation per call (a boxed kernel cost the host about as much as the rest of a
// LayerNorm forward's dispatch). One instance per operator (`kernel` is its autograd kernel); `handle` is set when
// the kernel is registered.
template <c10::DispatchKey Key, c10::DeviceType Device, auto& kernel, bool kLowerPrecision,
          typename Sig = std::remove_reference_t<decltype(kernel)>>
struct AutocastCast;

template <c10::DispatchKey Key, c10::DeviceType Device, auto& kernel, bool kLowerPrecision, typename R,
          typename... Args>
struct AutocastCast<Key, Device, kernel, kLowerPrecision, R(Args...)> {
  static inline std::optional<c10::TypedOperatorHandle<R(Args...)>> handle;

  static R call(Args... args) {
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(Key);
    const at::ScalarType dtype = kLowerPrecision ? at::autocast::get_autocast_dtype(Device) : at::kFloat;
    return handle->call(at::autocast::cached_cast(dtype, args, Device)...);
  }
};

// Under autocast, `op` ("kprof::<name>", whose kernels have the signature of `kernel`) behaves as the torch op it
// replaces (`twin`, e.g. {"aten::layer_norm", ""}) does on this device: torch gives norms and pow the fp32 policy
// where it autocasts them at all (layer_norm on CUDA; rms_norm on CUDA from torch 2.12), linear the lower-precision
// one, and nothing otherwise (gelu, silu, add follow their input). Asking torch's dispatcher which twins it autocasts
// keeps this right across torch versions.
template <c10::DispatchKey Key, c10::DeviceType Device, auto& kernel, bool kLowerPrecision = false>
void autocast_like(torch::Library& m, const char* op, c10::OperatorName twin) {
  using Sig = std::remove_reference_t<decltype(kernel)>;
  using Wrapper = AutocastCast<Key, Device, kernel, kLowerPrecision>;
  const auto handle = c10::Dispatcher::singleton().findOp(twin);
  if (handle && handle->hasKernelForDispatchKey(Key)) {
    const std::string name = std::string("kprof::") + op;
    Wrapper::handle = c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), "").template typed<Sig>();
    m.impl(op, &Wrapper::call);
  }
}

}  // namespace kprof

// Registers `register_fn(torch::Library&)`'s kernels for both devices: each kernel picks CPU or CUDA code itself
// (and raises for CUDA tensors in a build without CUDA code).
#define KPROF_CPU_AND_CUDA_KERNELS(register_fn)            \
  TORCH_LIBRARY_IMPL(kprof, CPU, m) { register_fn(m); } \
  TORCH_LIBRARY_IMPL(kprof, CUDA, m) { register_fn(m); }

// Autocast for kprof operator `op` (whose kernels have the signature of `kernel`) on both devices as torch autocasts
// its twin, e.g. ("layer_norm", layer_norm_autograd, "aten::layer_norm", "") or ("square", square_autograd, "aten::pow",
// "Tensor_Scalar") (torch.square is pow(x, 2)).
#define KPROF_AUTOCAST_LIKE(op, kernel, twin, overload) KPROF_AUTOCAST_POLICY(op, kernel, twin, overload, false)

// The same for an operator that replaces one of torch's lower-precision ops (linear): ("linear_cross_entropy",
// linear_cross_entropy_autograd, "aten::linear", "") runs its matrix products in the autocast dtype, as F.linear would.
#define KPROF_AUTOCAST_LOWER_PRECISION_LIKE(op, kernel, twin, overload) \
  KPROF_AUTOCAST_POLICY(op, kernel, twin, overload, true)

#define KPROF_AUTOCAST_POLICY(op, kernel, twin, overload, lower)                                              \
  TORCH_LIBRARY_IMPL(kprof, AutocastCUDA, m) {                                                               \
    kprof::autocast_like<c10::DispatchKey::AutocastCUDA, c10::DeviceType::CUDA, kernel, lower>(m, op,        \
                                                                                             {twin, overload}); \
  }                                                                                                           \
  TORCH_LIBRARY_IMPL(kprof, AutocastCPU, m) {                                                                \
    kprof::autocast_like<c10::DispatchKey::AutocastCPU, c10::DeviceType::CPU, kernel, lower>(m, op,          \
                                                                                           {twin, overload});   \
  }

#define KPROF_CAT2(a, b) a##b
#define KPROF_CAT(a, b) KPROF_CAT2(a, b)
#define KPROF_STR2(a) #a
#define KPROF_STR(a) KPROF_STR2(a)

// The Python module: importing it runs the static registrations above; its one function, `fast(op, overload)`, makes
// the eager entry of each operator listed (KPROF_FAST(name, autograd_kernel), see _fastcall.h).
#define KPROF_PYTHON_MODULE(...)                                                                              \
  namespace {                                                                                                 \
  const ::kprof::fastcall::Maker kprof_makers_[] = {__VA_ARGS__ __VA_OPT__(, )::kprof::fastcall::Maker{nullptr, \
                                                                                                      nullptr}}; \
  PyMethodDef kprof_methods_[] = {                                                                            \
      {"fast", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&::kprof::fastcall::fast<kprof_makers_>)), \
       METH_FASTCALL, "fast(op, overload): the eager entry of a kprof operator, or None"},                    \
      {nullptr, nullptr, 0, nullptr}};                                                                        \
  }                                                                                                           \
  PyMODINIT_FUNC KPROF_CAT(PyInit_, TORCH_EXTENSION_NAME)(void) {                                             \
    static PyModuleDef module = {PyModuleDef_HEAD_INIT, KPROF_STR(TORCH_EXTENSION_NAME), nullptr, -1,          \
                                 kprof_methods_};                                                             \
    return PyModule_Create(&module);                                                                          \
  }
