// SwiGLU activation, y = silu(gate) * up, and its backward in one pass each (float, half, bfloat16;
// math in float). The forward is the shared vectorized map; the backward reads dy, gate and up once and
// writes both gradients, where eager PyTorch makes three passes.
#include "_elementwise.cuh"

namespace {

using namespace kprof::elementwise;

// sigmoid(g). kFast, for 2-byte storage: the hardware's approximate exp and division, whose few-ulp float error lies
// far below the output's rounding (2^-8 relative for bfloat16, 2^-11 for half); float storage keeps the accurate ones.
template <bool kFast>
__device__ __forceinline__ float sigmoid(float g) {
  if constexpr (kFast) return __fdividef(1.f, 1.f + __expf(-g));  // 0 once exp(-g) overflows, as 1 / inf
  return 1.f / (1.f + expf(-g));
}

template <typename T>
constexpr bool kFastMath = sizeof(T) == 2;

template <bool kFast>
struct SwiGLUOp {
  __device__ float operator()(float g, float u) const { return g * sigmoid<kFast>(g) * u; }
};

// d(silu(g) * u): dg = dy * u * s * (1 + g * (1 - s)) with s = sigmoid(g), du = dy * g * s.
template <bool kFast>
__device__ __forceinline__ void swiglu_grad(float dy, float g, float u, float& dg, float& du) {
  const float s = sigmoid<kFast>(g);
  dg = dy * u * s * (1.f + g * (1.f - s));
  du = dy * g * s;
}

// Same walk as map_kernel: kUnroll packs of each input loaded (kept in their storage type, so 2-byte types hold half
// the registers) before any math, a grid-stride loop over whole packs, then the elements past the last pack one per
// thread.
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads)
    swiglu_bwd_kernel(int64_t n, const T* __restrict__ dy, const T* __restrict__ gate, const T* __restrict__ up,
                      T* __restrict__ dgate, T* __restrict__ dup) {
  const int64_t packs = n / VEC;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads * kUnroll;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kThreads * kUnroll + threadIdx.x; base < packs;
       base += step) {
    Pack<T, VEC> d[kUnroll], g[kUnroll], u[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int64_t p = base + k * kThreads;
      if (p >= packs) continue;
      d[k] = load_raw<T, VEC>(dy + p * VEC);
      g[k] = load_raw<T, VEC>(gate + p * VEC);
      u[k] = load_raw<T, VEC>(up + p * VEC);
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int64_t p = base + k * kThreads;
      if (p >= packs) continue;
      float dg[VEC], du[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        swiglu_grad<kFastMath<T>>(to_float(d[k].v[j]), to_float(g[k].v[j]), to_float(u[k].v[j]), dg[j], du[j]);
      }
      store_pack<T, VEC>(dgate + p * VEC, dg);
      store_pack<T, VEC>(dup + p * VEC, du);
    }
  }
  for (int64_t i = packs * VEC + static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    float dg, du;
    swiglu_grad<kFastMath<T>>(to_float(dy[i]), to_float(gate[i]), to_float(up[i]), dg, du);
    dgate[i] = from_float<T>(dg);
    dup[i] = from_float<T>(du);
  }
}

template <int VEC, typename T>
cudaError_t launch_bwd(cudaStream_t stream, int64_t n, const T* dy, const T* gate, const T* up, T* dgate, T* dup) {
  const int blocks = grid_blocks(static_cast<int64_t>(kThreads) * kUnroll * VEC, n);
  swiglu_bwd_kernel<T, VEC><<<blocks, kThreads, 0, stream>>>(n, dy, gate, up, dgate, dup);
  return cudaGetLastError();
}

}  // namespace

extern "C" {

// y = silu(gate) * up over n contiguous elements.
cudaError_t kprof_swiglu_forward(int dtype, const void* gate, const void* up, void* y, int64_t n,
                                 cudaStream_t stream) {
  return with_dtype(dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    return map(stream, n, SwiGLUOp<kFastMath<T>>{}, static_cast<T*>(y), static_cast<const T*>(gate),
               static_cast<const T*>(up));
  });
}

// dgate, dup from dy, gate, up over n contiguous elements.
cudaError_t kprof_swiglu_backward(int dtype, const void* dy, const void* gate, const void* up, void* dgate,
                                  void* dup, int64_t n, cudaStream_t stream) {
  return with_dtype(dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    if (n == 0) return cudaSuccess;
    const auto d = static_cast<const T*>(dy);
    const auto g = static_cast<const T*>(gate);
    const auto u = static_cast<const T*>(up);
    const auto dg = static_cast<T*>(dgate);
    const auto du = static_cast<T*>(dup);
    const bool packed = aligned16(d) && aligned16(g) && aligned16(u) && aligned16(dg) && aligned16(du);
    return packed ? launch_bwd<16 / sizeof(T)>(stream, n, d, g, u, dg, du) : launch_bwd<1>(stream, n, d, g, u, dg, du);
  });
}

}  // extern "C"
