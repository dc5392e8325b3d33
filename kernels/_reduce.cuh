// Device helpers shared by the row-wise norm kernels (layernorm.cu, rmsnorm.cu): loads/stores of packs
// converted to float, row-group sums, the launch shape of a row, the backward's shared-memory column sums
// and the column sum that finishes the weight/bias gradients. Plain CUDA, no torch headers, so each .cu
// compiles with `nvcc -c`.
#pragma once

#include "_elementwise.cuh"

namespace kprof {

using elementwise::aligned16;
using elementwise::kBFloat16;
using elementwise::kFloat;
using elementwise::kHalf;
using elementwise::load_pack;
using elementwise::store_pack;
using elementwise::Type;

// One thread keeps at most kMaxPerThread elements of a row in registers and a row group has at most
// kMaxRowThreads threads (the backward keeps two such arrays live and runs two 512-thread blocks per
// multiprocessor, which caps registers at 64), so a row has at most kMaxCols elements; the binding
// rejects longer rows before launching.
constexpr int kMaxPerThread = 16;
constexpr int kMaxRowThreads = 512;
constexpr int kMaxCols = kMaxRowThreads * kMaxPerThread;
// Threads per block: short rows (one warp or more each) share a block up to these counts.
constexpr int kFwdBlockThreads = 256;
constexpr int kBwdBlockThreads = 512;
// Shared floats for group_sum<2> with up to 16 row groups in a block.
constexpr int kGroupSumFloats = 16 * 32 * 2;

// VEC values of type T moved as floats in 16-byte pieces, so 16-byte alignment suffices even where VEC
// elements of T span more (float parameters next to 8-wide half/bfloat16 packs).
template <typename T, int VEC>
constexpr int kPiece = VEC * sizeof(T) > 16 ? 16 / sizeof(T) : VEC;

template <typename T, int VEC>
__device__ __forceinline__ void load_vec(const T* p, float (&out)[VEC]) {
  constexpr int P = kPiece<T, VEC>;
#pragma unroll
  for (int k = 0; k < VEC / P; ++k) {
    float piece[P];
    load_pack<T, P>(p + k * P, piece);
#pragma unroll
    for (int j = 0; j < P; ++j) out[k * P + j] = piece[j];
  }
}

template <typename T, int VEC>
__device__ __forceinline__ void store_vec(T* p, const float (&in)[VEC]) {
  constexpr int P = kPiece<T, VEC>;
#pragma unroll
  for (int k = 0; k < VEC / P; ++k) {
    float piece[P];
#pragma unroll
    for (int j = 0; j < P; ++j) piece[j] = in[k * P + j];
    store_pack<T, P>(p + k * P, piece);
  }
}

template <int N>
__device__ __forceinline__ void warp_sum(float (&v)[N]) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] += __shfl_xor_sync(0xffffffffu, v[i], offset);
  }
}

// Sums N values over each row group (the blockDim.x threads sharing one threadIdx.y; blockDim.x is a
// multiple of 32) and leaves the totals in every thread of the group. Every thread of the block must
// call it: groups wider than a warp go through `smem` (blockDim.y * 32 * N floats) and barriers.
template <int N>
__device__ __forceinline__ void group_sum(float (&v)[N], float* smem) {
  warp_sum(v);
  if (blockDim.x == 32) return;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  float* s = smem + threadIdx.y * 32 * N;
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < N; ++i) s[warp * N + i] = v[i];
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = lane < warps ? s[lane * N + i] : 0.f;
  warp_sum(v);  // each warp reduces the group's partials itself, so no broadcast step is needed
  __syncthreads();  // smem is free for the next call
}

// Loads this thread's packs of a row (pack p = threadIdx.x + i * blockDim.x) as floats; packs past the
// row's end, or of a row past the last (live == false), read as zeros.
template <typename T, int ITEMS, int VEC>
__device__ __forceinline__ void load_row(const T* row, int npacks, bool live, float (&v)[ITEMS][VEC]) {
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int p = threadIdx.x + i * blockDim.x;
    if (live && p < npacks) {
      load_vec<T, VEC>(row + p * VEC, v[i]);
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[i][j] = 0.f;
    }
  }
}

// Calls f(i, p) for each pack p = threadIdx.x + i * blockDim.x (i < ITEMS) that lies inside the row.
template <int ITEMS, typename F>
__device__ __forceinline__ void for_each_pack(int npacks, F&& f) {
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int p = threadIdx.x + i * blockDim.x;
    if (p < npacks) f(i, p);
  }
}

// The row group's total of f(value) over the row's elements, held in v as load_row left them.
template <int ITEMS, int VEC, typename F>
__device__ __forceinline__ float row_total(const float (&v)[ITEMS][VEC], int npacks, float* smem, F&& f) {
  float s[1] = {0.f};
  for_each_pack<ITEMS>(npacks, [&](int i, int) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) s[0] += f(v[i][j]);
  });
  group_sum(s, smem);
  return s[0];
}

// Zeroes `count` floats of shared memory with the whole block, then synchronizes.
__device__ __forceinline__ void zero_block(float* p, int count) {
  for (int i = threadIdx.y * blockDim.x + threadIdx.x; i < count; i += blockDim.x * blockDim.y) p[i] = 0.f;
  __syncthreads();
}

// A backward block's column sums live in shared memory as acc[k][r][n] (gradient k, row group r): each
// thread adds into its own columns of its group's slice, so no two threads touch one float. At the end
// the slices are added and written as row blockIdx.x of part_k ([gridDim.x, n]); part1 may be null.
// Every thread of the block must call it.
__device__ __forceinline__ void store_block_partials(const float* acc, int n, float* part0, float* part1) {
  __syncthreads();
  const int threads = blockDim.x * blockDim.y;
  for (int k = 0; k < (part1 != nullptr ? 2 : 1); ++k) {
    float* out = (k == 0 ? part0 : part1) + static_cast<int64_t>(blockIdx.x) * n;
    const float* slices = acc + k * blockDim.y * n;
    for (int c = threadIdx.y * blockDim.x + threadIdx.x; c < n; c += threads) {
      float total = 0.f;
      for (int r = 0; r < blockDim.y; ++r) total += slices[r * n + c];
      out[c] = total;
    }
  }
}

// How a row of n elements maps onto threads: packs of `vec` elements, at most kMaxPerThread elements
// per thread, `threads` (a power of two, 32..kMaxRowThreads) per row and `rows` rows per block.
struct RowShape {
  int vec, threads, rows;
};

// vec_max: elements of the input type in 16 bytes. Packs are used only when every row starts 16-byte
// aligned, i.e. n % vec_max == 0 and every pointer is 16-byte aligned (the caller passes that test).
// Short rows share a block of block_threads threads.
inline RowShape row_shape(int n, int vec_max, bool aligned, int block_threads) {
  const int vec = aligned && n % vec_max == 0 ? vec_max : 1;
  const int per_thread_packs = kMaxPerThread / vec;
  int threads = 32;
  while (threads * per_thread_packs < n / vec) threads *= 2;
  const int rows = threads < block_threads ? block_threads / threads : 1;
  return {vec, threads, rows};
}

// Finishes a two-stage gradient reduction: out_k[c] = sum over p of part[(k * parts + p) * n + c], k =
// blockIdx.y.
template <typename W>
__global__ void column_sum_kernel(const float* __restrict__ part, int parts, int n, W* __restrict__ out0,
                                  W* __restrict__ out1) {
  __shared__ float s[32][33];
  const int col = blockIdx.x * 32 + threadIdx.x;
  const float* rows = part + static_cast<int64_t>(blockIdx.y) * parts * n;
  float acc = 0.f;
  if (col < n) {
    for (int p = threadIdx.y; p < parts; p += blockDim.y) acc += rows[static_cast<int64_t>(p) * n + col];
  }
  s[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < n) {
    float total = 0.f;
    for (int r = 0; r < blockDim.y; ++r) total += s[r][threadIdx.x];
    (blockIdx.y == 0 ? out0 : out1)[col] = elementwise::from_float<W>(total);
  }
}

// Runs a persistent backward row kernel, then the column sums that finish its parameter gradients
// (grad1 may be null). `launch(blocks, smem_bytes, part0, part1)` starts the kernel with that much dynamic
// shared memory (its acc[k][r][n] column sums) so that it writes gradient k's per-block partials
// ([blocks, n] floats) to part_k. With workspace == null it only sets *workspace_floats, the scratch it
// needs (the CUB convention).
template <typename W, typename Kernel, typename Launch>
inline cudaError_t backward_with_partials(Kernel kernel, Launch launch, const RowShape& s, int64_t rows, int n,
                                          W* grad0, W* grad1, float* workspace, int64_t* workspace_floats,
                                          cudaStream_t stream) {
  const int grads = grad1 != nullptr ? 2 : 1;
  const int smem = static_cast<int>(sizeof(float)) * grads * s.rows * n;
  int64_t full = 0;  // blocks the device runs at once
  cudaError_t err = elementwise::allow_dynamic_smem(kernel, smem);
  if (err == cudaSuccess) err = elementwise::resident_blocks(kernel, s.threads * s.rows, &full, smem);
  if (err != cudaSuccess) return err;
  // Persistent: enough blocks to fill every multiprocessor, no more than the rows need.
  const int64_t needed = (rows + s.rows - 1) / s.rows;
  const int blocks = static_cast<int>(needed < full ? needed : full);
  const int64_t part = static_cast<int64_t>(blocks) * n;
  if (workspace == nullptr) {
    *workspace_floats = grads * part;
    return cudaSuccess;
  }
  launch(blocks, smem, workspace, grad1 != nullptr ? workspace + part : nullptr);
  column_sum_kernel<W><<<dim3((n + 31) / 32, grads), dim3(32, 32), 0, stream>>>(workspace, blocks, n, grad0, grad1);
  return cudaGetLastError();
}

// Tag carrying a pack width through a generic lambda (Type carries a type).
template <int V>
struct Vec {
  static constexpr int value = V;
};

// Runs f(Type<T>{}, Type<W>{}, Vec<VEC>{}, shape) -> cudaError_t for input type T, parameter type W (T or
// float) and the row shape of n in blocks of up to block_threads; cudaErrorInvalidValue for a row length or
// dtype pair it has no kernel for.
template <typename F>
inline cudaError_t with_row_types(int x_dtype, int w_dtype, int n, bool aligned, int block_threads, F&& f) {
  if (n < 1 || n > kMaxCols) return cudaErrorInvalidValue;
  cudaError_t err = cudaSuccess;
  auto run = [&](auto xt, auto wt) {
    using T = typename decltype(xt)::type;
    constexpr int kVec = 16 / sizeof(T);
    const RowShape s = row_shape(n, kVec, aligned, block_threads);
    err = s.vec == 1 ? f(xt, wt, Vec<1>{}, s) : f(xt, wt, Vec<kVec>{}, s);
  };
  const bool w_float = w_dtype == kFloat;
  if (x_dtype == kFloat && w_float) {
    run(Type<float>{}, Type<float>{});
  } else if (x_dtype == kHalf && (w_float || w_dtype == kHalf)) {
    w_float ? run(Type<__half>{}, Type<float>{}) : run(Type<__half>{}, Type<__half>{});
  } else if (x_dtype == kBFloat16 && (w_float || w_dtype == kBFloat16)) {
    w_float ? run(Type<__nv_bfloat16>{}, Type<float>{}) : run(Type<__nv_bfloat16>{}, Type<__nv_bfloat16>{});
  } else {
    return cudaErrorInvalidValue;
  }
  return err;
}

}  // namespace kprof
