// Torch binding and CPU kernel of kprof add (out = a + b, same shapes and dtypes; no broadcasting).
#include "_binding.h"

#ifdef KPROF_WITH_CUDA
extern "C" cudaError_t kprof_add_forward(int dtype, const void* a, const void* b, void* out, int64_t n,
                                         cudaStream_t stream);
#endif

// Writes a + b into out (all three of one shape, dtype and device, contiguous).
void add_forward(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  kprof::check_input(a, "kprof add", "a");
  kprof::check_same(a, b, "kprof add", "b");
  kprof::check_same(a, out, "kprof add", "out");
  if (a.is_cuda()) {
    KPROF_CUDA_CALL(a, "kprof add",
                    kprof_add_forward(kprof::dtype_code(a), a.const_data_ptr(), b.const_data_ptr(),
                                      out.mutable_data_ptr(), a.numel(), kprof::current_stream()));
    return;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "kprof add", [&] {
    kprof::cpu_map(a.numel(), [](auto x, auto y) { return x + y; }, out.mutable_data_ptr<scalar_t>(),
                   a.const_data_ptr<scalar_t>(), b.const_data_ptr<scalar_t>());
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &add_forward, "out = a + b (CPU or CUDA)", pybind11::arg("a"), pybind11::arg("b"),
        pybind11::arg("out"));
}
