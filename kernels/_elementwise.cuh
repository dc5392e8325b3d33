// Device helpers shared by the elementwise kernels (square, add, gelu): dtype codes, float conversions,
// 16-byte packs, a vectorized grid-stride map, and cached launch facts (occupancy, shared-memory caps). Plain
// CUDA, no torch headers, so each .cu compiles with `nvcc -c`.
#pragma once

#include <cuda/std/utility>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <unordered_map>

namespace kprof::elementwise {

// Element types, numbered as c10::ScalarType so the torch binding can pass `scalar_type()` through.
enum Dtype : int { kHalf = 5, kFloat = 6, kBFloat16 = 15 };

// A map block: 128 threads, each loading kUnroll packs of every input before it computes (four independent 16-byte
// loads per input in flight), over a grid as large as the work (one pass; see grid_blocks). On the H100 this shape
// reaches the device-to-device copy's bandwidth on every map; 256 threads x 2 packs over a grid of resident blocks
// stayed at 93-95% of it (87% for bf16 GELU, whose erf needs the extra loads in flight): CHANGELOG.md, 0.1.0.
constexpr int kThreads = 128;
constexpr int kUnroll = 4;

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// VEC consecutive elements moved with one access (16 bytes when VEC == 16 / sizeof(T)).
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T v[VEC];
};

// A pack of VEC elements at `p`, kept in its storage type until used (half the registers of floats for 2-byte types,
// so more threads stay resident).
template <typename T, int VEC>
__device__ __forceinline__ Pack<T, VEC> load_raw(const T* p) {
  return *reinterpret_cast<const Pack<T, VEC>*>(p);
}

template <typename T, int VEC>
__device__ __forceinline__ void load_pack(const T* p, float (&out)[VEC]) {
  const Pack<T, VEC> pk = load_raw<T, VEC>(p);
#pragma unroll
  for (int j = 0; j < VEC; ++j) out[j] = to_float(pk.v[j]);
}

template <typename T, int VEC>
__device__ __forceinline__ void store_pack(T* p, const float (&in)[VEC]) {
  Pack<T, VEC> pk;
#pragma unroll
  for (int j = 0; j < VEC; ++j) pk.v[j] = from_float<T>(in[j]);
  *reinterpret_cast<Pack<T, VEC>*>(p) = pk;
}

// The N input arrays of a map, all of the output's element type.
template <typename T, int N>
struct Inputs {
  const T* p[N];
};

template <typename Op, typename T, int N, int VEC, size_t... K>
__device__ __forceinline__ float apply(const Op& op, const Pack<T, VEC> (&v)[N], int j,
                                       cuda::std::index_sequence<K...>) {
  return op(to_float(v[K].v[j])...);
}

// out[i] = op(in.p[0][i], ...) in float for i < n. Each thread loads kUnroll packs of every input
// before computing; the grid-stride loop runs once unless the work outgrows the largest grid. Elements past the last
// whole pack go one per thread.
template <typename T, int VEC, int N, typename Op>
__global__ void __launch_bounds__(kThreads) map_kernel(int64_t n, Op op, T* __restrict__ out, Inputs<T, N> in) {
  const int64_t packs = n / VEC;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads * kUnroll;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kThreads * kUnroll + threadIdx.x; base < packs;
       base += step) {
    Pack<T, VEC> v[kUnroll][N];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t p = base + u * kThreads;
#pragma unroll
      for (int k = 0; k < N; ++k) {
        if (p < packs) v[u][k] = load_raw<T, VEC>(in.p[k] + p * VEC);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t p = base + u * kThreads;
      if (p >= packs) continue;
      float r[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) r[j] = apply(op, v[u], j, cuda::std::make_index_sequence<N>{});
      store_pack<T, VEC>(out + p * VEC, r);
    }
  }
  for (int64_t i = packs * VEC + static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    Pack<T, 1> v[N];
#pragma unroll
    for (int k = 0; k < N; ++k) v[k].v[0] = in.p[k][i];
    out[i] = from_float<T>(apply(op, v, 0, cuda::std::make_index_sequence<N>{}));
  }
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Launch facts of a kernel on a device that never change but cost the host microseconds per runtime call (an
// occupancy query, setting a function attribute): done once per (kernel, device, threads, dynamic shared memory) and
// kept here, so a launch pays a map lookup. The key's `kernel` is the function's address.
struct LaunchKey {
  const void* kernel;
  int device, threads;
  int64_t smem;
  bool operator==(const LaunchKey& o) const {
    return kernel == o.kernel && device == o.device && threads == o.threads && smem == o.smem;
  }
};

struct LaunchKeyHash {
  size_t operator()(const LaunchKey& k) const {
    return std::hash<const void*>()(k.kernel) ^ (static_cast<size_t>(k.device) << 48) ^
           (static_cast<size_t>(k.threads) << 32) ^ static_cast<size_t>(k.smem);
  }
};

inline std::mutex launch_cache_mutex;
inline std::unordered_map<LaunchKey, int64_t, LaunchKeyHash> launch_cache;

// The cached value for key, or compute(&value) (a cudaError_t) once and keep it when it succeeds.
template <typename Compute>
inline cudaError_t cached_launch_fact(const LaunchKey& key, int64_t* value, Compute&& compute) {
  {
    const std::lock_guard<std::mutex> lock(launch_cache_mutex);
    const auto it = launch_cache.find(key);
    if (it != launch_cache.end()) {
      *value = it->second;
      return cudaSuccess;
    }
  }
  const cudaError_t err = compute(value);
  if (err == cudaSuccess) {
    const std::lock_guard<std::mutex> lock(launch_cache_mutex);
    launch_cache[key] = *value;
  }
  return err;
}

// Blocks of `kernel` (with `threads` threads and `smem` bytes of dynamic shared memory each) that the whole current
// device runs at once.
template <typename Kernel>
inline cudaError_t resident_blocks(Kernel kernel, int threads, int64_t* blocks, int smem = 0) {
  int device = 0;
  const cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  return cached_launch_fact({reinterpret_cast<const void*>(kernel), device, threads, smem}, blocks, [&](int64_t* out) {
    int sms = 0, per_sm = 0;
    cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem);
    *out = static_cast<int64_t>(sms) * (per_sm > 0 ? per_sm : 1);
    return e;
  });
}

// Lets `kernel` launch with `smem` bytes of dynamic shared memory on the current device: the runtime's cap is raised
// when a launch needs more than any before (never lowered; the key's threads field is -1: a cap, not an occupancy).
template <typename Kernel>
inline cudaError_t allow_dynamic_smem(Kernel kernel, int smem) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const std::lock_guard<std::mutex> lock(launch_cache_mutex);
  int64_t& cap = launch_cache[{reinterpret_cast<const void*>(kernel), device, -1, 0}];  // 0 the first time
  if (smem <= cap) return cudaSuccess;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err == cudaSuccess) cap = smem;
  return err;
}

// Blocks for a grid-stride map: what the work needs, so each block makes one pass (at most the largest grid).
inline int grid_blocks(int64_t work_per_block, int64_t work) {
  const int64_t needed = (work + work_per_block - 1) / work_per_block;
  return static_cast<int>(needed < 1 ? 1 : (needed < INT32_MAX ? needed : INT32_MAX));
}

template <int VEC, typename T, int N, typename Op>
inline cudaError_t launch_map(cudaStream_t stream, int64_t n, Op op, T* out, Inputs<T, N> in) {
  const int blocks = grid_blocks(static_cast<int64_t>(kThreads) * kUnroll * VEC, n);
  map_kernel<T, VEC, N, Op><<<blocks, kThreads, 0, stream>>>(n, op, out, in);
  return cudaGetLastError();
}

// out[i] = op(in[i]...): 16-byte packs when every pointer allows them, else one element at a time.
template <typename T, typename Op, typename... In>
inline cudaError_t map(cudaStream_t stream, int64_t n, Op op, T* out, const In*... in) {
  if (n == 0) return cudaSuccess;
  const Inputs<T, sizeof...(In)> inputs{{in...}};
  const bool packed = aligned16(out) && (aligned16(in) && ...);
  return packed ? launch_map<16 / sizeof(T)>(stream, n, op, out, inputs) : launch_map<1>(stream, n, op, out, inputs);
}

template <typename T>
struct Type {
  using type = T;
};

// Runs f(Type<T>{}) for the element type named by `dtype`; cudaErrorInvalidValue for any other.
template <typename F>
inline cudaError_t with_dtype(int dtype, F&& f) {
  switch (dtype) {
    case kFloat:
      return f(Type<float>{});
    case kHalf:
      return f(Type<__half>{});
    case kBFloat16:
      return f(Type<__nv_bfloat16>{});
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace kprof::elementwise
