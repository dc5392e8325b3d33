// out = a + b: the seed's add.cu (one thread walking the whole array) rewritten as a vectorized
// grid-stride kernel; float, half and bfloat16, summed in float.
#include "_elementwise.cuh"

namespace {

struct AddOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

}  // namespace

extern "C" cudaError_t kprof_add_forward(int dtype, const void* a, const void* b, void* out, int64_t n,
                                         cudaStream_t stream) {
  using namespace kprof::elementwise;
  return with_dtype(dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    return map(stream, n, AddOp{}, static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b));
  });
}
