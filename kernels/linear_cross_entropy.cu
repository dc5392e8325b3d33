// The row kernel of the fused linear + cross-entropy: for a chunk of logits [rows, vocab] (written by cuBLAS), each
// block takes one row, finds its max and log-sum-exp online in float, and writes the row's loss; in its gradient mode
// it then overwrites the row in place with d loss / d logits times the row's scale, so the chunk becomes the left
// operand of the two gradient products. One kernel, two modes (loss only, or loss and gradient). Plain CUDA.
#include "_elementwise.cuh"

#include <cmath>

namespace {

using namespace kprof::elementwise;

// 256 threads a row: a 50304-wide bf16 row is 25 packs of 16 bytes a thread, and eight blocks fit a multiprocessor.
constexpr int kRowThreads = 256;

struct RowArgs {
  int64_t vocab;
  const int64_t* target;
  int64_t ignore_index;
  float smoothing;   // label smoothing epsilon in [0, 1]
  float cap;         // softcap (0: none): z = cap * tanh(x / cap)
  const float* grad; // per-row scales (grad_stride 1) or one (0); nullptr: 1
  int64_t grad_stride;
  const int64_t* count;  // the non-ignored rows of the whole batch (reduction "mean"); nullptr: no division
  float* loss;           // [rows]: each row's loss, 0 for an ignored row
};

template <bool kFast>
__device__ __forceinline__ float exp_of(float x) {
  if constexpr (kFast) return __expf(x);
  return expf(x);
}

template <bool kCap>
__device__ __forceinline__ float capped(float x, float cap) {
  if constexpr (kCap) return cap * tanhf(x / cap);
  return x;
}

// (max, sum of exp(z - max)) pairs merged; a side that saw nothing (max -inf) adds nothing.
template <bool kFast>
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  const float mm = fmaxf(m, m2);
  if (mm == -INFINITY) return;
  s = (m == -INFINITY ? 0.f : s * exp_of<kFast>(m - mm)) + (m2 == -INFINITY ? 0.f : s2 * exp_of<kFast>(m2 - mm));
  m = mm;
}

// The block's (max, sum, sum of z) left in every thread.
template <bool kFast>
__device__ __forceinline__ void block_merge(float& m, float& s, float& sz) {
  __shared__ float sm[kRowThreads / 32][3];
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    merge<kFast>(m, s, __shfl_xor_sync(0xffffffffu, m, offset), __shfl_xor_sync(0xffffffffu, s, offset));
    sz += __shfl_xor_sync(0xffffffffu, sz, offset);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    sm[warp][0] = m;
    sm[warp][1] = s;
    sm[warp][2] = sz;
  }
  __syncthreads();
  m = -INFINITY, s = 0.f, sz = 0.f;
#pragma unroll
  for (int w = 0; w < kRowThreads / 32; ++w) {
    merge<kFast>(m, s, sm[w][0], sm[w][1]);
    sz += sm[w][2];
  }
}

// One block per row. Pass 1 reads the row in packs of VEC (each pack's max first, so a pack costs VEC + 1 exps);
// pass 2 (kGrad) reads it again, from L2 (the row was read just before), and writes the gradient over it:
// (softmax - (1 - eps) onehot - eps / vocab) * scale, times 1 - tanh^2 under a softcap. An ignored row's gradient is 0;
// a target outside [0, vocab) gives the row a NaN loss and gradient (no device assert: the loss shows it).
template <typename T, int VEC, bool kGrad, bool kCap>
__global__ void __launch_bounds__(kRowThreads) rows_kernel(T* __restrict__ logits, RowArgs a) {
  constexpr bool kFast = sizeof(T) == 2;
  const int64_t r = blockIdx.x;
  T* row = logits + r * a.vocab;
  const int64_t t = a.target[r];
  const int64_t packs = a.vocab / VEC;
  if (t == a.ignore_index) {
    if constexpr (kGrad) {
      float zero[VEC] = {};
      for (int64_t p = threadIdx.x; p < packs; p += kRowThreads) store_pack<T, VEC>(row + p * VEC, zero);
    }
    if (threadIdx.x == 0) a.loss[r] = 0.f;
    return;
  }
  float m = -INFINITY, s = 0.f, sz = 0.f;
#pragma unroll 4
  for (int64_t p = threadIdx.x; p < packs; p += kRowThreads) {
    float z[VEC];
    load_pack<T, VEC>(row + p * VEC, z);
    float pm = -INFINITY;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      z[j] = capped<kCap>(z[j], a.cap);
      pm = fmaxf(pm, z[j]);
      sz += z[j];
    }
    if (pm == -INFINITY) continue;
    float ps = 0.f;
#pragma unroll
    for (int j = 0; j < VEC; ++j) ps += exp_of<kFast>(z[j] - pm);
    merge<kFast>(m, s, pm, ps);
  }
  block_merge<kFast>(m, s, sz);
  const bool valid = t >= 0 && t < a.vocab;
  const float lse = m + logf(s);
  const float vocab = static_cast<float>(a.vocab);
  if (threadIdx.x == 0) {
    const float zt = valid ? capped<kCap>(to_float(row[t]), a.cap) : NAN;
    a.loss[r] = lse - (1.f - a.smoothing) * zt - a.smoothing * sz / vocab;
  }
  if constexpr (kGrad) {
    __syncthreads();  // thread 0 has read row[t] before any thread overwrites it
    float scale = a.grad == nullptr ? 1.f : a.grad[r * a.grad_stride];
    if (a.count != nullptr) scale /= static_cast<float>(*a.count);
    if (!valid) scale = NAN;
    const float off = a.smoothing / vocab;
    for (int64_t p = threadIdx.x; p < packs; p += kRowThreads) {
      float x[VEC];
      load_pack<T, VEC>(row + p * VEC, x);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float z = capped<kCap>(x[j], a.cap);
        float d = exp_of<kFast>(z - lse) - off - (p * VEC + j == t ? 1.f - a.smoothing : 0.f);
        if constexpr (kCap) d *= 1.f - (z / a.cap) * (z / a.cap);
        x[j] = d * scale;
      }
      store_pack<T, VEC>(row + p * VEC, x);
    }
  }
}

template <typename T, int VEC, bool kGrad>
cudaError_t launch(cudaStream_t stream, T* logits, int64_t rows, const RowArgs& a) {
  if (a.cap > 0.f) {
    rows_kernel<T, VEC, kGrad, true><<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(logits, a);
  } else {
    rows_kernel<T, VEC, kGrad, false><<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(logits, a);
  }
  return cudaGetLastError();
}

}  // namespace

extern "C" {

// The row kernel over `rows` contiguous rows of `vocab` logits; with write_grad the rows become their gradients.
// Rows start 16-byte aligned only when vocab * element size is a multiple of 16: else one element at a time.
cudaError_t kprof_lce_rows(int dtype, void* logits, int64_t rows, int64_t vocab, const int64_t* target,
                           int64_t ignore_index, float smoothing, float softcap, const float* grad,
                           int64_t grad_stride, const int64_t* count, float* loss, bool write_grad,
                           cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (rows > INT32_MAX) return cudaErrorInvalidValue;
  const RowArgs a{vocab, target, ignore_index, smoothing, softcap, grad, grad_stride, count, loss};
  return with_dtype(dtype, [&](auto type) {
    using T = typename decltype(type)::type;
    constexpr int kVec = 16 / sizeof(T);
    T* x = static_cast<T*>(logits);
    const bool packed = aligned16(x) && (vocab * static_cast<int64_t>(sizeof(T))) % 16 == 0;
    if (write_grad) {
      return packed ? launch<T, kVec, true>(stream, x, rows, a) : launch<T, 1, true>(stream, x, rows, a);
    }
    return packed ? launch<T, kVec, false>(stream, x, rows, a) : launch<T, 1, false>(stream, x, rows, a);
  });
}

}  // extern "C"
