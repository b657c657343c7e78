// Layer norm forward and backward over the last dimension of a [rows, features] matrix.
//
// Rows of up to 1024 features (a multiple of 4, 16-byte aligned) take one warp each, with the
// weight and bias gradients fused into the input gradient's pass (see the warp kernels below).
// Otherwise forward and the input gradient take one block per row. Rows of up to 8 values per
// thread (features <= 8192) stay in registers, so x (and dy) are read once and y (dx) written once;
// longer rows re-read global memory for each pass. The forward computes the mean and then the
// centred sum of squares, two passes as the CPU op does (one-pass E[x²] − E[x]² loses the
// variance when |mean| >> std), and every expression is written as the CPU's, term for term
// (src/ops/norm.cpp): the forward's sums divided by the float feature count, rstd =
// 1 / sqrt(var + eps) (IEEE division and square root, not rsqrtf), the backward's means as sums
// times 1/f; only the summation order differs.
//
// The weight and bias gradients are column sums over the rows (Σ_r dy ⊙ x̂ and Σ_r dy): a block
// of 32 columns × 8 row lanes sums a chunk of rows, reading mean and rstd once per row, and the
// chunks are added in order by the deterministic finish of reduce.cu.
#include "common.cuh"
#include "layer_norm.cuh"

#include <pipeline/cuda/check.hpp>

#include <cstdint>
#include <initializer_list>
#include <type_traits>

namespace pipeline::kernels {

namespace {
constexpr int kItems = 8;          // values a thread keeps in registers on the cached path
constexpr int kMaxThreads = 1024;  // threads of a row block

// About 4 values per thread, a whole number of warps, at most kMaxThreads.
int row_threads(std::int64_t features) {
  const std::int64_t t = (features / 4 + detail::kWarp - 1) / detail::kWarp * detail::kWarp;
  return static_cast<int>(std::clamp<std::int64_t>(t, detail::kWarp, kMaxThreads));
}
}  // namespace

// Items > 0: thread holds columns threadIdx.x + k·blockDim.x, k < Items (needs
// features <= Items·blockDim.x). Items == 0: any width, global memory re-read per pass.
// Out: float, or std::uint16_t for y in bf16 (rounded as it is stored).
template <int Items, typename Out>
static __global__ __launch_bounds__(kMaxThreads) void layer_norm_forward_kernel(
    const float* x, const float* weight, const float* bias, std::int64_t rows, int features,
    float eps, Out* y, float* mean, float* rstd) {
  __shared__ float scratch[detail::kWarp];
  const int tid = threadIdx.x, threads = blockDim.x;
  const float fn = static_cast<float>(features);
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * features;
    Out* yr = y + r * features;
    float part = 0.f, m, var;
    if constexpr (Items > 0) {
      float v[Items];
#pragma unroll
      for (int k = 0; k < Items; ++k) {
        const int c = tid + k * threads;
        v[k] = c < features ? xr[c] : 0.f;
        part += v[k];
      }
      m = detail::block_sum(part, scratch) / fn;
      part = 0.f;
#pragma unroll
      for (int k = 0; k < Items; ++k) {
        const int c = tid + k * threads;
        if (c < features) {
          const float d = v[k] - m;
          part += d * d;
        }
      }
      var = detail::block_sum(part, scratch) / fn;
      const float rs = 1.f / sqrtf(var + eps);
#pragma unroll
      for (int k = 0; k < Items; ++k) {
        const int c = tid + k * threads;
        if (c < features) detail::store_as(yr + c, (v[k] - m) * rs * weight[c] + bias[c]);
      }
      if (tid == 0) {
        mean[r] = m;
        rstd[r] = rs;
      }
    } else {
      for (int c = tid; c < features; c += threads) part += xr[c];
      m = detail::block_sum(part, scratch) / fn;
      part = 0.f;
      for (int c = tid; c < features; c += threads) {
        const float d = xr[c] - m;
        part += d * d;
      }
      var = detail::block_sum(part, scratch) / fn;
      const float rs = 1.f / sqrtf(var + eps);
      for (int c = tid; c < features; c += threads)
        detail::store_as(yr + c, (xr[c] - m) * rs * weight[c] + bias[c]);
      if (tid == 0) {
        mean[r] = m;
        rstd[r] = rs;
      }
    }
  }
}

template <int Items>
static __global__ __launch_bounds__(kMaxThreads) void layer_norm_backward_dx_kernel(
    const float* x, const float* weight, const float* mean, const float* rstd, const float* dy,
    std::int64_t rows, int features, float* dx) {
  __shared__ float scratch[detail::kWarp];
  const int tid = threadIdx.x, threads = blockDim.x;
  const float inv_f = 1.f / static_cast<float>(features);
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * features;
    const float* gr = dy + r * features;
    float* dr = dx + r * features;
    const float m = mean[r], rs = rstd[r];
    float g_part = 0.f, gx_part = 0.f;
    if constexpr (Items > 0) {
      float xhat[Items], gw[Items];
#pragma unroll
      for (int k = 0; k < Items; ++k) {
        const int c = tid + k * threads;
        xhat[k] = c < features ? (xr[c] - m) * rs : 0.f;
        gw[k] = c < features ? gr[c] * weight[c] : 0.f;
        g_part += gw[k];
        gx_part += gw[k] * xhat[k];
      }
      const float g_mean = detail::block_sum(g_part, scratch) * inv_f;
      const float gx_mean = detail::block_sum(gx_part, scratch) * inv_f;
#pragma unroll
      for (int k = 0; k < Items; ++k) {
        const int c = tid + k * threads;
        if (c < features) dr[c] = rs * (gw[k] - g_mean - xhat[k] * gx_mean);
      }
    } else {
      for (int c = tid; c < features; c += threads) {
        const float xh = (xr[c] - m) * rs, g = gr[c] * weight[c];
        g_part += g;
        gx_part += g * xh;
      }
      const float g_mean = detail::block_sum(g_part, scratch) * inv_f;
      const float gx_mean = detail::block_sum(gx_part, scratch) * inv_f;
      for (int c = tid; c < features; c += threads) {
        const float xh = (xr[c] - m) * rs, g = gr[c] * weight[c];
        dr[c] = rs * (g - g_mean - xh * gx_mean);
      }
    }
  }
}

// Column sums over rows [blockIdx.y · rows_per_chunk, +rows_per_chunk) for the 32 columns of
// blockIdx.x: Σ dy ⊙ (x − mean) · rstd and Σ dy. With partials set they go to
// partials_w / partials_b [chunk, c]; otherwise they are added to dweight / dbias (each
// skipped when null).
static __global__ void layer_norm_param_grad_kernel(const float* x, const float* mean,
                                                    const float* rstd, const float* dy,
                                                    std::int64_t rows, std::int64_t cols,
                                                    std::int64_t rows_per_chunk, float* partials_w,
                                                    float* partials_b, float* dweight,
                                                    float* dbias) {
  __shared__ float lanes_w[kColumnBlockLanes][kColumnBlockColumns + 1];
  __shared__ float lanes_b[kColumnBlockLanes][kColumnBlockColumns + 1];
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * kColumnBlockColumns + threadIdx.x;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * rows_per_chunk;
  const std::int64_t r1 = min(rows, r0 + rows_per_chunk);
  float acc_w = 0.f, acc_b = 0.f;
  if (c < cols) {
    for (std::int64_t r = r0 + threadIdx.y; r < r1; r += kColumnBlockLanes) {
      const float g = dy[r * cols + c];
      acc_w += g * (x[r * cols + c] - mean[r]) * rstd[r];
      acc_b += g;
    }
  }
  lanes_w[threadIdx.y][threadIdx.x] = acc_w;
  lanes_b[threadIdx.y][threadIdx.x] = acc_b;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float sw = lanes_w[0][threadIdx.x], sb = lanes_b[0][threadIdx.x];
#pragma unroll
    for (int k = 1; k < kColumnBlockLanes; ++k) {
      sw += lanes_w[k][threadIdx.x];
      sb += lanes_b[k][threadIdx.x];
    }
    const std::int64_t at = static_cast<std::int64_t>(blockIdx.y) * cols + c;
    if (partials_w) {
      partials_w[at] = sw;
      partials_b[at] = sb;
    } else {
      if (dweight) dweight[c] += sw;
      if (dbias) dbias[c] += sb;
    }
  }
}

// Rows of up to 1024 features, a multiple of 4, 16-byte aligned (a transformer's widths): one warp
// per row, float4 loads and stores, V float4 per lane in registers, warp-shuffle reductions only.
// The backward also sums the weight and bias gradients: each warp accumulates its rows' dy ⊙ x̂
// and dy per column in registers and writes them as one partial row, which
// column_partials_finish adds in warp order; x and dy are read once for all three gradients.
namespace {

constexpr int kWarpRowsThreads = 256;
// The backward holds 4 float4 arrays per lane (up to 164 registers at 1024 features): blocks of
// 4 warps, so that three fit an SM and all kBackwardWarps run at once on an H100.
constexpr int kBackwardThreads = 128;
constexpr std::int64_t kMaxWarpFeatures = 1024;
// Warps of the fused backward (its partial rows): fixed by rows alone, so the sums are the same
// bits on every GPU; enough to fill one.
constexpr std::int64_t kBackwardWarps = 1536;

bool warp_rows(std::int64_t features, std::initializer_list<const void*> pointers) {
  if (features % 4 != 0 || features > kMaxWarpFeatures) return false;
  for (const void* p : pointers)
    if (p != nullptr && !detail::aligned16(p)) return false;
  return true;
}

std::int64_t backward_warps(std::int64_t rows) {
  return std::min(rows, kBackwardWarps);
}

__device__ __forceinline__ float4 load4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ void store4(float* p, float4 v) {
  *reinterpret_cast<float4*>(p) = v;
}

template <int V, typename Out>
static __global__ __launch_bounds__(kWarpRowsThreads) void layer_norm_forward_warp_kernel(
    const float* x, const float* weight, const float* bias, std::int64_t rows, int features,
    float eps, Out* y, float* mean, float* rstd) {
  const int lane = threadIdx.x % detail::kWarp;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (blockDim.x / detail::kWarp);
  const float fn = static_cast<float>(features);
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / detail::kWarp) +
                        threadIdx.x / detail::kWarp;
       r < rows; r += warps) {
    const float* xr = x + r * features;
    float4 v[V];
    float part = 0.f;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int c = 4 * (lane + k * detail::kWarp);
      v[k] = c < features ? load4(xr + c) : make_float4(0.f, 0.f, 0.f, 0.f);
      part += (v[k].x + v[k].y) + (v[k].z + v[k].w);
    }
    const float m = detail::warp_sum(part) / fn;
    part = 0.f;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int c = 4 * (lane + k * detail::kWarp);
      if (c < features) {
        const float a = v[k].x - m, b = v[k].y - m, cc = v[k].z - m, d = v[k].w - m;
        part += (a * a + b * b) + (cc * cc + d * d);
      }
    }
    const float var = detail::warp_sum(part) / fn;
    const float rs = 1.f / sqrtf(var + eps);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int c = 4 * (lane + k * detail::kWarp);
      if (c < features) {
        const float4 w = load4(weight + c), b = load4(bias + c);
        detail::store4_as(
            y + r * features + c,
            make_float4((v[k].x - m) * rs * w.x + b.x, (v[k].y - m) * rs * w.y + b.y,
                        (v[k].z - m) * rs * w.z + b.z, (v[k].w - m) * rs * w.w + b.w));
      }
    }
    if (lane == 0) {
      mean[r] = m;
      rstd[r] = rs;
    }
  }
}

// Warp w takes rows w, w + warps, ...; its column sums go to partial row w (when partials_w is
// set). dx may be null.
template <int V>
static __global__ __launch_bounds__(kBackwardThreads) void layer_norm_backward_warp_kernel(
    const float* x, const float* weight, const float* mean, const float* rstd, const float* dy,
    std::int64_t rows, int features, std::int64_t warps, float* dx, float* partials_w,
    float* partials_b) {
  const int lane = threadIdx.x % detail::kWarp;
  const std::int64_t w = static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / detail::kWarp) +
                         threadIdx.x / detail::kWarp;
  if (w >= warps) return;
  const float inv_f = 1.f / static_cast<float>(features);
  float4 acc_w[V], acc_b[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    acc_w[k] = make_float4(0.f, 0.f, 0.f, 0.f);
    acc_b[k] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  for (std::int64_t r = w; r < rows; r += warps) {
    const float m = mean[r], rs = rstd[r];
    float4 xh[V], gw[V];
    float g_part = 0.f, gx_part = 0.f;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int c = 4 * (lane + k * detail::kWarp);
      if (c < features) {
        const float4 xv = load4(x + r * features + c), g = load4(dy + r * features + c);
        const float4 wt = load4(weight + c);
        xh[k] = make_float4((xv.x - m) * rs, (xv.y - m) * rs, (xv.z - m) * rs, (xv.w - m) * rs);
        gw[k] = make_float4(g.x * wt.x, g.y * wt.y, g.z * wt.z, g.w * wt.w);
        g_part += (gw[k].x + gw[k].y) + (gw[k].z + gw[k].w);
        gx_part +=
            (gw[k].x * xh[k].x + gw[k].y * xh[k].y) + (gw[k].z * xh[k].z + gw[k].w * xh[k].w);
        acc_w[k].x += g.x * xh[k].x;
        acc_w[k].y += g.y * xh[k].y;
        acc_w[k].z += g.z * xh[k].z;
        acc_w[k].w += g.w * xh[k].w;
        acc_b[k].x += g.x;
        acc_b[k].y += g.y;
        acc_b[k].z += g.z;
        acc_b[k].w += g.w;
      } else {
        xh[k] = gw[k] = make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
    if (dx == nullptr) continue;
    const float g_mean = detail::warp_sum(g_part) * inv_f;
    const float gx_mean = detail::warp_sum(gx_part) * inv_f;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int c = 4 * (lane + k * detail::kWarp);
      if (c < features)
        store4(dx + r * features + c, make_float4(rs * (gw[k].x - g_mean - xh[k].x * gx_mean),
                                                  rs * (gw[k].y - g_mean - xh[k].y * gx_mean),
                                                  rs * (gw[k].z - g_mean - xh[k].z * gx_mean),
                                                  rs * (gw[k].w - g_mean - xh[k].w * gx_mean)));
    }
  }
  if (partials_w == nullptr) return;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int c = 4 * (lane + k * detail::kWarp);
    if (c < features) {
      store4(partials_w + w * features + c, acc_w[k]);
      store4(partials_b + w * features + c, acc_b[k]);
    }
  }
}

// f(std::integral_constant<int, V>) for the float4s per lane that `features` needs (1, 2, 4, 8).
template <typename F>
void with_float4s_per_lane(std::int64_t features, F&& f) {
  if (features <= 4 * detail::kWarp)
    f(std::integral_constant<int, 1>{});
  else if (features <= 8 * detail::kWarp)
    f(std::integral_constant<int, 2>{});
  else if (features <= 16 * detail::kWarp)
    f(std::integral_constant<int, 4>{});
  else
    f(std::integral_constant<int, 8>{});
}

}  // namespace

std::int64_t layer_norm_backward_workspace_floats(std::int64_t rows, std::int64_t features) {
  std::int64_t floats = 2 * column_split(rows, features).workspace_floats(features);
  if (features % 4 == 0 && features <= kMaxWarpFeatures)
    floats = std::max(floats, 2 * backward_warps(rows) * features);
  return floats;
}

namespace {

template <typename Out>
void forward_any(cudaStream_t stream, const float* x, const float* weight, const float* bias,
                 std::int64_t rows, std::int64_t features, float eps, Out* y, float* mean,
                 float* rstd) {
  if (rows <= 0 || features <= 0) return;
  const int f = static_cast<int>(features);
  if (warp_rows(features, {x, weight, bias, y})) {
    constexpr std::int64_t kRowsPerBlock = kWarpRowsThreads / detail::kWarp;
    const auto blocks = static_cast<unsigned>(
        std::min((rows + kRowsPerBlock - 1) / kRowsPerBlock, detail::kMaxGridBlocks));
    with_float4s_per_lane(features, [&](auto v) {
      layer_norm_forward_warp_kernel<decltype(v)::value, Out>
          <<<blocks, kWarpRowsThreads, 0, stream>>>(x, weight, bias, rows, f, eps, y, mean, rstd);
    });
    PIPELINE_CUDA_LAUNCH_CHECK();
    return;
  }
  const int threads = row_threads(features);
  const unsigned blocks =
      static_cast<unsigned>(std::min<std::int64_t>(rows, detail::kMaxGridBlocks));
  if (features <= static_cast<std::int64_t>(threads) * kItems)
    layer_norm_forward_kernel<kItems, Out>
        <<<blocks, threads, 0, stream>>>(x, weight, bias, rows, f, eps, y, mean, rstd);
  else
    layer_norm_forward_kernel<0, Out>
        <<<blocks, threads, 0, stream>>>(x, weight, bias, rows, f, eps, y, mean, rstd);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

}  // namespace

void layer_norm_forward(cudaStream_t stream, const float* x, const float* weight, const float* bias,
                        std::int64_t rows, std::int64_t features, float eps, float* y, float* mean,
                        float* rstd) {
  forward_any(stream, x, weight, bias, rows, features, eps, y, mean, rstd);
}

void layer_norm_forward_bf16(cudaStream_t stream, const float* x, const float* weight,
                             const float* bias, std::int64_t rows, std::int64_t features, float eps,
                             std::uint16_t* y, float* mean, float* rstd) {
  forward_any(stream, x, weight, bias, rows, features, eps, y, mean, rstd);
}

void layer_norm_backward(cudaStream_t stream, const float* x, const float* weight,
                         const float* mean, const float* rstd, const float* dy, std::int64_t rows,
                         std::int64_t features, float* dx, float* dweight, float* dbias,
                         float* workspace) {
  if (rows <= 0 || features <= 0) return;
  if (warp_rows(features, {x, weight, dy, dx, workspace})) {
    const std::int64_t warps = backward_warps(rows);
    constexpr std::int64_t kWarpsPerBlock = kBackwardThreads / detail::kWarp;
    const auto blocks = static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock);
    const bool sums = dweight != nullptr || dbias != nullptr;
    float* partials_w = sums ? workspace : nullptr;
    float* partials_b = sums ? workspace + warps * features : nullptr;
    with_float4s_per_lane(features, [&](auto v) {
      layer_norm_backward_warp_kernel<decltype(v)::value><<<blocks, kBackwardThreads, 0, stream>>>(
          x, weight, mean, rstd, dy, rows, static_cast<int>(features), warps, dx, partials_w,
          partials_b);
    });
    PIPELINE_CUDA_LAUNCH_CHECK();
    if (dweight) column_partials_finish(stream, partials_w, warps, features, dweight);
    if (dbias) column_partials_finish(stream, partials_b, warps, features, dbias);
    return;
  }
  if (dx) {
    const int threads = row_threads(features);
    const unsigned blocks =
        static_cast<unsigned>(std::min<std::int64_t>(rows, detail::kMaxGridBlocks));
    const int f = static_cast<int>(features);
    if (features <= static_cast<std::int64_t>(threads) * kItems)
      layer_norm_backward_dx_kernel<kItems>
          <<<blocks, threads, 0, stream>>>(x, weight, mean, rstd, dy, rows, f, dx);
    else
      layer_norm_backward_dx_kernel<0>
          <<<blocks, threads, 0, stream>>>(x, weight, mean, rstd, dy, rows, f, dx);
    PIPELINE_CUDA_LAUNCH_CHECK();
  }
  if (!dweight && !dbias) return;
  const ColumnSplit split = column_split(rows, features);
  const dim3 grid(static_cast<unsigned>((features + kColumnBlockColumns - 1) / kColumnBlockColumns),
                  static_cast<unsigned>(split.chunks));
  const dim3 block(kColumnBlockColumns, kColumnBlockLanes);
  const bool two_pass = split.chunks > 1;
  float* partials_w = two_pass ? workspace : nullptr;
  float* partials_b = two_pass ? workspace + split.chunks * features : nullptr;
  layer_norm_param_grad_kernel<<<grid, block, 0, stream>>>(x, mean, rstd, dy, rows, features,
                                                           split.rows_per_chunk, partials_w,
                                                           partials_b, dweight, dbias);
  PIPELINE_CUDA_LAUNCH_CHECK();
  if (two_pass) {
    if (dweight) column_partials_finish(stream, partials_w, split.chunks, features, dweight);
    if (dbias) column_partials_finish(stream, partials_b, split.chunks, features, dbias);
  }
}

}  // namespace pipeline::kernels
