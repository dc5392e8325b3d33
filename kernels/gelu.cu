// GELU (erf or tanh form) forward and backward, and the fused bias + GELU epilogue with a fused backward
// (input gradient and per-block bias-gradient partials in one pass over the data). float, half and
// bfloat16 storage, float math.
#include "_elementwise.cuh"
#include "_gelu_math.h"

namespace {

using namespace kprof::elementwise;
namespace gelu = kprof::gelu;

struct GeluForward {
  bool tanh_approx;
  __device__ float operator()(float x) const { return gelu::forward(x, tanh_approx); }
};

struct GeluBackward {
  bool tanh_approx;
  __device__ float operator()(float dy, float x) const { return dy * gelu::derivative(x, tanh_approx); }
};

// The bias kernels walk a [rows, cols] matrix with 32 x kRows blocks: threadIdx.x takes a pack of columns
// (a warp reads 32 consecutive packs of a row), threadIdx.y and the grid's y stride over rows. Each thread keeps
// its bias pack in registers for all its rows. The forward loads kUnroll rows (the map's) before computing.
constexpr int kRows = 8;

// Rows a backward thread loads before computing: two for 4-element packs; one for 8-element (2-byte) packs, whose
// float math already holds enough registers to limit how many threads stay resident.
template <int VEC>
constexpr int kRowUnroll = VEC >= 8 ? 1 : 2;

template <typename T, int VEC>
__global__ void __launch_bounds__(32 * kRows)
    bias_gelu_fwd_kernel(const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ y, int64_t rows,
                         int64_t cols, bool tanh_approx) {
  const int64_t col = (static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x) * VEC;
  if (col >= cols) return;  // no barriers below
  float b[VEC];
  load_pack<T, VEC>(bias + col, b);
  const int64_t stride = static_cast<int64_t>(gridDim.y) * kRows;
  for (int64_t r0 = static_cast<int64_t>(blockIdx.y) * kRows + threadIdx.y; r0 < rows; r0 += stride * kUnroll) {
    Pack<T, VEC> v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (r0 + u * stride < rows) v[u] = load_raw<T, VEC>(x + (r0 + u * stride) * cols + col);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (r0 + u * stride >= rows) continue;
      float out[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) out[j] = gelu::forward(to_float(v[u].v[j]) + b[j], tanh_approx);
      store_pack<T, VEC>(y + (r0 + u * stride) * cols + col, out);
    }
  }
}

// dx = dy * gelu'(x + bias); partial[blockIdx.y, c] = sum of dx[r, c] over the block's rows.
template <typename T, int VEC>
__global__ void __launch_bounds__(32 * kRows)
    bias_gelu_bwd_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ bias,
                         T* __restrict__ dx, float* __restrict__ partial, int64_t rows, int64_t cols,
                         bool tanh_approx) {
  __shared__ float smem[kRows][VEC][32];
  const int64_t col = (static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x) * VEC;
  const bool live = col < cols;
  float acc[VEC] = {};
  if (live) {
    float b[VEC];
    load_pack<T, VEC>(bias + col, b);
    constexpr int kUnroll = kRowUnroll<VEC>;
    const int64_t stride = static_cast<int64_t>(gridDim.y) * kRows;
    for (int64_t r0 = static_cast<int64_t>(blockIdx.y) * kRows + threadIdx.y; r0 < rows;
         r0 += stride * kUnroll) {
      Pack<T, VEC> g[kUnroll], v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t at = (r0 + u * stride) * cols + col;
        if (r0 + u * stride < rows) {
          g[u] = load_raw<T, VEC>(dy + at);
          v[u] = load_raw<T, VEC>(x + at);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (r0 + u * stride >= rows) continue;
        float out[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          out[j] = to_float(g[u].v[j]) * gelu::derivative(to_float(v[u].v[j]) + b[j], tanh_approx);
          acc[j] += out[j];
        }
        store_pack<T, VEC>(dx + (r0 + u * stride) * cols + col, out);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < VEC; ++j) smem[threadIdx.y][j][threadIdx.x] = acc[j];
  __syncthreads();
  if (threadIdx.y != 0 || !live) return;
#pragma unroll
  for (int r = 1; r < kRows; ++r) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc[j] += smem[r][j][threadIdx.x];
  }
  store_pack<float, VEC>(partial + static_cast<int64_t>(blockIdx.y) * cols + col, acc);
}

// The grid of a bias kernel: 32 column packs per block in x. In y, the forward makes one pass, like the map (a row
// block for each kRows x kUnroll rows); the backward, which writes a row of bias-gradient partials per row block,
// takes only as many row blocks as fill the device, each thread striding over at least two rows.
template <int VEC, typename Kernel>
cudaError_t bias_grid(Kernel kernel, int64_t rows, int64_t cols, bool one_pass, dim3* grid) {
  const int64_t col_blocks = (cols / VEC + 31) / 32;
  int64_t row_blocks = 0;
  if (one_pass) {
    row_blocks = grid_blocks(kRows * kUnroll, rows);
  } else {
    int64_t resident = 0;
    const cudaError_t err = resident_blocks(kernel, 32 * kRows, &resident);
    if (err != cudaSuccess) return err;
    const int64_t wanted = resident / col_blocks > 0 ? resident / col_blocks : 1;
    const int64_t needed = (rows + 2 * kRows - 1) / (2 * kRows);
    row_blocks = needed < wanted ? needed : wanted;
  }
  row_blocks = row_blocks < 65535 ? (row_blocks > 0 ? row_blocks : 1) : 65535;
  *grid = dim3(static_cast<unsigned>(col_blocks), static_cast<unsigned>(row_blocks));
  return cudaSuccess;
}

// Runs f(Type<T>{}, vec_tag) with 16-byte packs when cols and every pointer allow them, else single elements.
template <typename F>
cudaError_t with_bias_layout(int dtype, int64_t cols, bool aligned, F&& f) {
  return with_dtype(dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    constexpr int kVec = 16 / sizeof(T);
    return aligned && cols % kVec == 0 ? f(t, cuda::std::integral_constant<int, kVec>{})
                                       : f(t, cuda::std::integral_constant<int, 1>{});
  });
}

}  // namespace

extern "C" cudaError_t kprof_gelu_forward(int dtype, const void* x, void* y, int64_t n, bool tanh_approx,
                                          cudaStream_t stream) {
  return with_dtype(dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    return map(stream, n, GeluForward{tanh_approx}, static_cast<T*>(y), static_cast<const T*>(x));
  });
}

extern "C" cudaError_t kprof_gelu_backward(int dtype, const void* dy, const void* x, void* dx, int64_t n,
                                           bool tanh_approx, cudaStream_t stream) {
  return with_dtype(dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    return map(stream, n, GeluBackward{tanh_approx}, static_cast<T*>(dx), static_cast<const T*>(dy),
               static_cast<const T*>(x));
  });
}

extern "C" cudaError_t kprof_bias_gelu_forward(int dtype, const void* x, const void* bias, void* y, int64_t rows,
                                               int64_t cols, bool tanh_approx, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  const bool aligned = aligned16(x) && aligned16(bias) && aligned16(y);
  return with_bias_layout(dtype, cols, aligned, [&](auto t, auto vec) {
    using T = typename decltype(t)::type;
    constexpr int kVec = decltype(vec)::value;
    auto kernel = bias_gelu_fwd_kernel<T, kVec>;
    dim3 grid;
    const cudaError_t err = bias_grid<kVec>(kernel, rows, cols, true, &grid);
    if (err != cudaSuccess) return err;
    kernel<<<grid, dim3(32, kRows), 0, stream>>>(static_cast<const T*>(x), static_cast<const T*>(bias),
                                                 static_cast<T*>(y), rows, cols, tanh_approx);
    return cudaGetLastError();
  });
}

// With partial == nullptr, only sets *partial_rows: the caller then allocates partial as
// [*partial_rows, cols] floats and calls again; the bias gradient is partial.sum(0).
extern "C" cudaError_t kprof_bias_gelu_backward(int dtype, const void* dy, const void* x, const void* bias, void* dx,
                                                float* partial, int64_t* partial_rows, int64_t rows, int64_t cols,
                                                bool tanh_approx, cudaStream_t stream) {
  const bool aligned = aligned16(dy) && aligned16(x) && aligned16(bias) && aligned16(dx);
  return with_bias_layout(dtype, cols, aligned, [&](auto t, auto vec) {
    using T = typename decltype(t)::type;
    constexpr int kVec = decltype(vec)::value;
    auto kernel = bias_gelu_bwd_kernel<T, kVec>;
    dim3 grid;
    const cudaError_t err = bias_grid<kVec>(kernel, rows, cols, false, &grid);
    if (err != cudaSuccess) return err;
    if (partial == nullptr) {
      *partial_rows = grid.y;
      return cudaSuccess;
    }
    kernel<<<grid, dim3(32, kRows), 0, stream>>>(static_cast<const T*>(dy), static_cast<const T*>(x),
                                                 static_cast<const T*>(bias), static_cast<T*>(dx), partial, rows,
                                                 cols, tanh_approx);
    return cudaGetLastError();
  });
}
