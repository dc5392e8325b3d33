// RMSNorm over the last dimension (torch.nn.RMSNorm: y = x * rsqrt(mean(x^2) + eps) * w), forward and
// backward, for float, half and bfloat16 inputs (float accumulation; weight in the input's type or
// float). Same layout as layernorm.cu: one row group per row, the row in registers, and a persistent
// backward that sums the weight gradient per block in shared memory, finished by a column sum.
#include "_reduce.cuh"

namespace kprof {
namespace {

template <typename T, typename W, int VEC>
__global__ void __launch_bounds__(kMaxRowThreads)
    rmsnorm_fwd_kernel(const T* __restrict__ x, const W* __restrict__ w, T* __restrict__ y,
                       float* __restrict__ rstd_out, int64_t rows, int n, float eps) {
  constexpr int ITEMS = kMaxPerThread / VEC;
  __shared__ float smem[kGroupSumFloats];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool live = row < rows;
  const int npacks = n / VEC;

  float v[ITEMS][VEC];
  load_row<T, ITEMS, VEC>(x + row * n, npacks, live, v);
  const float rstd = rsqrtf(row_total(v, npacks, smem, [](float a) { return a * a; }) / n + eps);
  if (!live) return;  // after the last barrier

  if (threadIdx.x == 0) rstd_out[row] = rstd;
  T* yr = y + row * n;
  for_each_pack<ITEMS>(npacks, [&](int i, int p) {
    float wv[VEC], out[VEC];
    load_vec<W, VEC>(w + p * VEC, wv);
#pragma unroll
    for (int j = 0; j < VEC; ++j) out[j] = v[i][j] * rstd * wv[j];
    store_vec<T, VEC>(yr + p * VEC, out);
  });
}

// dx = rstd * g - x * rstd^3 * mean(g * x) with g = w * dy; dw = sum over rows of dy * x * rstd.
template <typename T, typename W, int VEC>
__global__ void __launch_bounds__(kBwdBlockThreads, VEC == 1 ? 1 : 2)
    rmsnorm_bwd_kernel(const T* __restrict__ dy, const T* __restrict__ x, const W* __restrict__ w,
                       const float* __restrict__ rstd, T* __restrict__ dx, float* __restrict__ dw_part, int64_t rows,
                       int n) {
  constexpr int ITEMS = kMaxPerThread / VEC;
  __shared__ float smem[kGroupSumFloats];
  extern __shared__ float acc[];  // [row group][n] (see store_block_partials)
  const int npacks = n / VEC;
  zero_block(acc, blockDim.y * n);
  float* acc_w = acc + threadIdx.y * n;

  // The trip count is the same for every thread of the block, so group_sum's barriers line up.
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.y; first < rows;
       first += static_cast<int64_t>(gridDim.x) * blockDim.y) {
    const int64_t row = first + threadIdx.y;
    const bool live = row < rows;
    const float rs = live ? rstd[row] : 0.f;
    float xv[ITEMS][VEC], g[ITEMS][VEC];
    load_row<T, ITEMS, VEC>(x + row * n, npacks, live, xv);
    load_row<T, ITEMS, VEC>(dy + row * n, npacks, live, g);
    float s[1] = {0.f};
    for_each_pack<ITEMS>(npacks, [&](int i, int p) {
      float wv[VEC], aw[VEC];
      load_vec<W, VEC>(w + p * VEC, wv);
      load_vec<float, VEC>(acc_w + p * VEC, aw);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        aw[j] += g[i][j] * xv[i][j] * rs;
        g[i][j] *= wv[j];
        s[0] += g[i][j] * xv[i][j];
      }
      store_vec<float, VEC>(acc_w + p * VEC, aw);
    });
    group_sum(s, smem);
    if (!live) continue;
    const float c = rs * rs * rs * s[0] / n;
    T* dxr = dx + row * n;
    for_each_pack<ITEMS>(npacks, [&](int i, int p) {
      float out[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) out[j] = rs * g[i][j] - xv[i][j] * c;
      store_vec<T, VEC>(dxr + p * VEC, out);
    });
  }
  store_block_partials(acc, n, dw_part, nullptr);
}

}  // namespace
}  // namespace kprof

extern "C" {

// y, rstd <- RMSNorm of the rows of x ([rows, n], contiguous).
cudaError_t kprof_rmsnorm_fwd_cuda(const void* x, const void* w, void* y, float* rstd, int64_t rows, int n, float eps,
                                   int x_dtype, int w_dtype, cudaStream_t stream) {
  using namespace kprof;
  if (rows == 0) return cudaSuccess;
  const bool aligned = aligned16(x) && aligned16(w) && aligned16(y);
  return with_row_types(x_dtype, w_dtype, n, aligned, kFwdBlockThreads, [&](auto xt, auto wt, auto vec,
                                                                              const RowShape& s) {
    using T = typename decltype(xt)::type;
    using W = typename decltype(wt)::type;
    const auto blocks = static_cast<unsigned>((rows + s.rows - 1) / s.rows);
    rmsnorm_fwd_kernel<T, W, decltype(vec)::value><<<blocks, dim3(s.threads, s.rows), 0, stream>>>(
        static_cast<const T*>(x), static_cast<const W*>(w), static_cast<T*>(y), rstd, rows, n, eps);
    return cudaGetLastError();
  });
}

// dx, dw from dy and the forward's x, rstd; rows > 0. With workspace == null it only sets
// *workspace_floats (see backward_with_partials).
cudaError_t kprof_rmsnorm_bwd_cuda(const void* dy, const void* x, const void* w, const float* rstd, void* dx, void* dw,
                                   float* workspace, int64_t* workspace_floats, int64_t rows, int n, int x_dtype,
                                   int w_dtype, cudaStream_t stream) {
  using namespace kprof;
  const bool aligned = aligned16(dy) && aligned16(x) && aligned16(w) && aligned16(dx);
  return with_row_types(x_dtype, w_dtype, n, aligned, kBwdBlockThreads, [&](auto xt, auto wt, auto vec,
                                                                              const RowShape& s) {
    using T = typename decltype(xt)::type;
    using W = typename decltype(wt)::type;
    const auto kernel = rmsnorm_bwd_kernel<T, W, decltype(vec)::value>;
    auto launch = [&](int blocks, int smem, float* dw_part, float*) {
      kernel<<<blocks, dim3(s.threads, s.rows), smem, stream>>>(static_cast<const T*>(dy), static_cast<const T*>(x),
                                                              static_cast<const W*>(w), rstd, static_cast<T*>(dx),
                                                              dw_part, rows, n);
    };
    return backward_with_partials(kernel, launch, s, rows, n, static_cast<W*>(dw), static_cast<W*>(nullptr),
                                  workspace, workspace_floats, stream);
  });
}

}  // extern "C"
