// LayerNorm over rows, forward and backward, for float, half and bfloat16 inputs (float accumulation;
// weight and bias in the input's type or float). One row group (a warp or more) per row, the row held in
// registers, so x is read once per pass. The backward is persistent: each block sums its rows' weight and
// bias gradients in shared memory, writes one partial row per gradient, and a column sum finishes.
#include "_reduce.cuh"

namespace kprof {
namespace {

template <typename T, typename W, int VEC>
__global__ void __launch_bounds__(kMaxRowThreads)
    layernorm_fwd_kernel(const T* __restrict__ x, const W* __restrict__ w, const W* __restrict__ b,
                         T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
                         int64_t rows, int n, float eps) {
  constexpr int ITEMS = kMaxPerThread / VEC;
  __shared__ float smem[kGroupSumFloats];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool live = row < rows;
  const int npacks = n / VEC;

  float v[ITEMS][VEC];
  load_row<T, ITEMS, VEC>(x + row * n, npacks, live, v);
  const float mean = row_total(v, npacks, smem, [](float a) { return a; }) / n;
  const float var = row_total(v, npacks, smem, [mean](float a) { return (a - mean) * (a - mean); }) / n;
  const float rstd = rsqrtf(var + eps);
  if (!live) return;  // after the last barrier

  if (threadIdx.x == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
  T* yr = y + row * n;
  for_each_pack<ITEMS>(npacks, [&](int i, int p) {
    float wv[VEC], bv[VEC] = {}, out[VEC];
    load_vec<W, VEC>(w + p * VEC, wv);
    if (b != nullptr) load_vec<W, VEC>(b + p * VEC, bv);
#pragma unroll
    for (int j = 0; j < VEC; ++j) out[j] = (v[i][j] - mean) * rstd * wv[j] + bv[j];
    store_vec<T, VEC>(yr + p * VEC, out);
  });
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with xhat = (x - mean) * rstd and g = w * dy;
// dw = sum over rows of dy * xhat, db = sum of dy (db_part is null when there is no bias).
template <typename T, typename W, int VEC>
__global__ void __launch_bounds__(kBwdBlockThreads, VEC == 1 ? 1 : 2)
    layernorm_bwd_kernel(const T* __restrict__ dy, const T* __restrict__ x, const W* __restrict__ w,
                         const float* __restrict__ mean, const float* __restrict__ rstd, T* __restrict__ dx,
                         float* __restrict__ dw_part, float* __restrict__ db_part, int64_t rows, int n) {
  constexpr int ITEMS = kMaxPerThread / VEC;
  __shared__ float smem[kGroupSumFloats];
  extern __shared__ float acc[];  // [dw, db][row group][n] (see store_block_partials)
  const int npacks = n / VEC;
  const bool bias = db_part != nullptr;
  zero_block(acc, (bias ? 2 : 1) * blockDim.y * n);
  float* acc_w = acc + threadIdx.y * n;
  float* acc_b = acc + (blockDim.y + threadIdx.y) * n;

  // The trip count is the same for every thread of the block, so group_sum's barriers line up.
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.y; first < rows;
       first += static_cast<int64_t>(gridDim.x) * blockDim.y) {
    const int64_t row = first + threadIdx.y;
    const bool live = row < rows;
    const float mu = live ? mean[row] : 0.f, rs = live ? rstd[row] : 0.f;
    float xh[ITEMS][VEC], g[ITEMS][VEC];
    load_row<T, ITEMS, VEC>(x + row * n, npacks, live, xh);
    load_row<T, ITEMS, VEC>(dy + row * n, npacks, live, g);
    float s[2] = {0.f, 0.f};
    for_each_pack<ITEMS>(npacks, [&](int i, int p) {
      float wv[VEC], aw[VEC], ab[VEC] = {};
      load_vec<W, VEC>(w + p * VEC, wv);
      load_vec<float, VEC>(acc_w + p * VEC, aw);
      if (bias) load_vec<float, VEC>(acc_b + p * VEC, ab);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        xh[i][j] = (xh[i][j] - mu) * rs;
        aw[j] += g[i][j] * xh[i][j];
        ab[j] += g[i][j];
        g[i][j] *= wv[j];
        s[0] += g[i][j] * xh[i][j];
        s[1] += g[i][j];
      }
      store_vec<float, VEC>(acc_w + p * VEC, aw);
      if (bias) store_vec<float, VEC>(acc_b + p * VEC, ab);
    });
    group_sum(s, smem);
    if (!live) continue;
    const float c1 = s[0] / n, c2 = s[1] / n;
    T* dxr = dx + row * n;
    for_each_pack<ITEMS>(npacks, [&](int i, int p) {
      float out[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) out[j] = rs * (g[i][j] - c2 - xh[i][j] * c1);
      store_vec<T, VEC>(dxr + p * VEC, out);
    });
  }
  store_block_partials(acc, n, dw_part, db_part);
}

}  // namespace
}  // namespace kprof

extern "C" {

// y, mean, rstd <- LayerNorm of the rows of x ([rows, n], contiguous); b may be null (no bias).
cudaError_t kprof_layernorm_fwd_cuda(const void* x, const void* w, const void* b, void* y, float* mean, float* rstd,
                                     int64_t rows, int n, float eps, int x_dtype, int w_dtype, cudaStream_t stream) {
  using namespace kprof;
  if (rows == 0) return cudaSuccess;
  const bool aligned = aligned16(x) && aligned16(w) && aligned16(b) && aligned16(y);
  return with_row_types(x_dtype, w_dtype, n, aligned, kFwdBlockThreads, [&](auto xt, auto wt, auto vec,
                                                                              const RowShape& s) {
    using T = typename decltype(xt)::type;
    using W = typename decltype(wt)::type;
    const auto blocks = static_cast<unsigned>((rows + s.rows - 1) / s.rows);
    layernorm_fwd_kernel<T, W, decltype(vec)::value><<<blocks, dim3(s.threads, s.rows), 0, stream>>>(
        static_cast<const T*>(x), static_cast<const W*>(w), static_cast<const W*>(b), static_cast<T*>(y), mean,
        rstd, rows, n, eps);
    return cudaGetLastError();
  });
}

// dx, dw, db (db null when there is no bias) from dy and the forward's x, mean, rstd; rows > 0. With
// workspace == null it only sets *workspace_floats (see backward_with_partials).
cudaError_t kprof_layernorm_bwd_cuda(const void* dy, const void* x, const void* w, const float* mean,
                                     const float* rstd, void* dx, void* dw, void* db, float* workspace,
                                     int64_t* workspace_floats, int64_t rows, int n, int x_dtype, int w_dtype,
                                     cudaStream_t stream) {
  using namespace kprof;
  const bool aligned = aligned16(dy) && aligned16(x) && aligned16(w) && aligned16(dx);
  return with_row_types(x_dtype, w_dtype, n, aligned, kBwdBlockThreads, [&](auto xt, auto wt, auto vec,
                                                                              const RowShape& s) {
    using T = typename decltype(xt)::type;
    using W = typename decltype(wt)::type;
    const auto kernel = layernorm_bwd_kernel<T, W, decltype(vec)::value>;
    auto launch = [&](int blocks, int smem, float* dw_part, float* db_part) {
      kernel<<<blocks, dim3(s.threads, s.rows), smem, stream>>>(static_cast<const T*>(dy), static_cast<const T*>(x),
                                                              static_cast<const W*>(w), mean, rstd,
                                                              static_cast<T*>(dx), dw_part, db_part, rows, n);
    };
    return backward_with_partials(kernel, launch, s, rows, n, static_cast<W*>(dw), static_cast<W*>(db), workspace,
                                  workspace_floats, stream);
  });
}

}  // extern "C"
