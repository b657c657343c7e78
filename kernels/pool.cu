// Max, average and global average pooling over NCHW planes, forward and backward.
//
// Forwards take one thread per output and walk its window clipped to the image, in the CPU's
// order (row by row), so maxima, their indices and window sums are the CPU's exactly. Backwards
// gather instead of scattering: one thread per input element visits the outputs whose windows
// cover it, in increasing output order, and adds their contributions into a register. That is
// the order in which the CPU's scatter loop reaches each element, so no atomics are needed, the
// result does not depend on timing, and (for the max pool) it equals the CPU's bit for bit even
// where windows overlap. The input rows covered by output row o are [o·s − p, o·s − p + k); so
// input row i is covered by the output rows o with ceil((i + p − k + 1) / s) <= o <= (i + p) / s.
#include "common.cuh"
#include "pool.cuh"

#include <pipeline/cuda/check.hpp>

#include <cmath>

namespace pipeline::kernels {

namespace {
constexpr int kPoolThreads = 256;
constexpr int kWarpsPerBlock = kPoolThreads / detail::kWarp;

// First and last output (row or column) whose window covers input position i; last < first when
// none does.
__device__ __forceinline__ void covering(std::int64_t i, std::int64_t kernel, std::int64_t stride,
                                         std::int64_t pad, std::int64_t outputs,
                                         std::int64_t& first, std::int64_t& last) {
  const std::int64_t num = i + pad - kernel + 1;
  first = num <= 0 ? 0 : (num + stride - 1) / stride;
  last = min(outputs - 1, (i + pad) / stride);
}
// Output t's plane and its window clipped to the image: rows [r_lo, r_hi), columns [c_lo, c_hi).
struct ClippedWindow {
  std::int64_t plane, r_lo, r_hi, c_lo, c_hi;
};

__device__ __forceinline__ ClippedWindow window_of(const PoolShape& s, std::int64_t t) {
  const std::int64_t out_plane = s.out_h * s.out_w;
  const std::int64_t p = t / out_plane, r = t - p * out_plane;
  const std::int64_t o = r / s.out_w, q = r - o * s.out_w;
  const std::int64_t h0 = o * s.stride_h - s.pad_h, w0 = q * s.stride_w - s.pad_w;
  return {p, max(h0, std::int64_t{0}), min(h0 + s.kernel_h, s.h), max(w0, std::int64_t{0}),
          min(w0 + s.kernel_w, s.w)};
}
}  // namespace

static __global__ void max_pool2d_forward_kernel(PoolShape s, const float* x, float* y,
                                                 std::int32_t* indices) {
  const std::int64_t out_plane = s.out_h * s.out_w, total = s.planes * out_plane;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += stride) {
    const auto [p, r_lo, r_hi, c_lo, c_hi] = window_of(s, t);
    const float* in = x + p * s.h * s.w;
    std::int64_t best_at = r_lo * s.w + c_lo;
    float best = -INFINITY;
    for (std::int64_t i = r_lo; i < r_hi; ++i)
      for (std::int64_t j = c_lo; j < c_hi; ++j) {
        const float v = in[i * s.w + j];
        if (v > best || isnan(v)) {
          best = v;
          best_at = i * s.w + j;
        }
      }
    y[t] = best;
    indices[t] = static_cast<std::int32_t>(best_at);
  }
}

static __global__ void max_pool2d_backward_kernel(PoolShape s, const float* dy,
                                                  const std::int32_t* indices, float* dx) {
  const std::int64_t in_plane = s.h * s.w, out_plane = s.out_h * s.out_w;
  const std::int64_t total = s.planes * in_plane;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += stride) {
    const std::int64_t p = t / in_plane, at = t - p * in_plane;
    const std::int64_t ih = at / s.w, iw = at - ih * s.w;
    std::int64_t o_lo, o_hi, q_lo, q_hi;
    covering(ih, s.kernel_h, s.stride_h, s.pad_h, s.out_h, o_lo, o_hi);
    covering(iw, s.kernel_w, s.stride_w, s.pad_w, s.out_w, q_lo, q_hi);
    const float* d = dy + p * out_plane;
    const std::int32_t* idx = indices + p * out_plane;
    float acc = 0.f;
    for (std::int64_t o = o_lo; o <= o_hi; ++o)
      for (std::int64_t q = q_lo; q <= q_hi; ++q) {
        const std::int64_t k = o * s.out_w + q;
        if (idx[k] == at) acc += d[k];
      }
    dx[t] = acc;
  }
}

// Windows that do not overlap (stride >= kernel in both directions): each input element has at
// most one window, so one thread per output writes its whole window, 0 + dy at the index (the
// CPU's zero plus its one contribution, -0 and NaN alike) and 0 elsewhere. Against the gather:
// a quarter of the threads under 2x2 windows and no search for the covering outputs.
static __global__ void max_pool2d_backward_windows_kernel(PoolShape s, const float* dy,
                                                          const std::int32_t* indices, float* dx) {
  const std::int64_t out_plane = s.out_h * s.out_w, total = s.planes * out_plane;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += stride) {
    const auto [p, r_lo, r_hi, c_lo, c_hi] = window_of(s, t);
    const std::int64_t at = indices[t];
    const float g = 0.f + dy[t];
    float* out = dx + p * s.h * s.w;
    for (std::int64_t i = r_lo; i < r_hi; ++i)
      for (std::int64_t j = c_lo; j < c_hi; ++j) out[i * s.w + j] = i * s.w + j == at ? g : 0.f;
  }
}

// Whether every input row (column) lies in a window: no gaps between windows (stride == kernel)
// and the last window reaching the end.
static bool windows_cover(std::int64_t size, std::int64_t outputs, std::int64_t kernel,
                          std::int64_t stride, std::int64_t pad) {
  return stride == kernel && (outputs - 1) * stride - pad + kernel >= size;
}

static __global__ void max_pool2d_backward_scatter_kernel(std::int64_t planes,
                                                          std::int64_t in_plane,
                                                          std::int64_t out_plane, const float* dy,
                                                          const std::int32_t* indices, float* dx) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t p = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       p < planes; p += stride) {
    float* g = dx + p * in_plane;
    for (std::int64_t j = 0; j < in_plane; ++j) g[j] = 0.f;
    const float* d = dy + p * out_plane;
    const std::int32_t* idx = indices + p * out_plane;
    for (std::int64_t k = 0; k < out_plane; ++k) {
      const std::int32_t j = idx[k];
      if (j >= 0 && j < in_plane) g[j] += d[k];
    }
  }
}

static __global__ void avg_pool2d_forward_kernel(PoolShape s, float scale, const float* x,
                                                 float* y) {
  const std::int64_t out_plane = s.out_h * s.out_w, total = s.planes * out_plane;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += stride) {
    const auto [p, r_lo, r_hi, c_lo, c_hi] = window_of(s, t);
    const float* in = x + p * s.h * s.w;
    float sum = 0.f;
    for (std::int64_t i = r_lo; i < r_hi; ++i)
      for (std::int64_t j = c_lo; j < c_hi; ++j) sum += in[i * s.w + j];
    y[t] = sum * scale;
  }
}

static __global__ void avg_pool2d_backward_kernel(PoolShape s, float scale, const float* dy,
                                                  float* dx) {
  const std::int64_t in_plane = s.h * s.w, out_plane = s.out_h * s.out_w;
  const std::int64_t total = s.planes * in_plane;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += stride) {
    const std::int64_t p = t / in_plane, at = t - p * in_plane;
    const std::int64_t ih = at / s.w, iw = at - ih * s.w;
    std::int64_t o_lo, o_hi, q_lo, q_hi;
    covering(ih, s.kernel_h, s.stride_h, s.pad_h, s.out_h, o_lo, o_hi);
    covering(iw, s.kernel_w, s.stride_w, s.pad_w, s.out_w, q_lo, q_hi);
    const float* d = dy + p * out_plane;
    float acc = 0.f;
    // The CPU rounds dy · scale before adding it: no fused multiply-add here.
    for (std::int64_t o = o_lo; o <= o_hi; ++o)
      for (std::int64_t q = q_lo; q <= q_hi; ++q) acc += __fmul_rn(d[o * s.out_w + q], scale);
    dx[t] = acc;
  }
}

static __global__ void global_avg_pool_forward_kernel(std::int64_t planes, std::int64_t plane,
                                                      const float* x, float* y) {
  const int lane = threadIdx.x % detail::kWarp, warp = threadIdx.x / detail::kWarp;
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * kWarpsPerBlock;
  for (std::int64_t p = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + warp; p < planes;
       p += step) {
    const float* in = x + p * plane;
    double sum = 0;
    for (std::int64_t k = lane; k < plane; k += detail::kWarp) sum += static_cast<double>(in[k]);
    sum = detail::warp_sum(sum);
    if (lane == 0) y[p] = static_cast<float>(sum / static_cast<double>(plane));
  }
}

static __global__ void global_avg_pool_backward_kernel(std::int64_t total, std::int64_t plane,
                                                       float scale, const float* dy, float* dx) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += stride)
    dx[t] = dy[t / plane] * scale;
}

void max_pool2d_forward(cudaStream_t stream, const PoolShape& s, const float* x, float* y,
                        std::int32_t* indices) {
  const std::int64_t total = s.planes * s.out_h * s.out_w;
  if (total <= 0) return;
  max_pool2d_forward_kernel<<<detail::grid_for(total, kPoolThreads), kPoolThreads, 0, stream>>>(
      s, x, y, indices);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

void max_pool2d_backward(cudaStream_t stream, const PoolShape& s, const float* dy,
                         const std::int32_t* indices, float* dx) {
  const std::int64_t total = s.planes * s.h * s.w;
  if (total <= 0) return;
  if (s.stride_h >= s.kernel_h && s.stride_w >= s.kernel_w) {
    // Elements no window covers get zero first (odd sizes, strides past the kernel).
    if (!windows_cover(s.h, s.out_h, s.kernel_h, s.stride_h, s.pad_h) ||
        !windows_cover(s.w, s.out_w, s.kernel_w, s.stride_w, s.pad_w))
      PIPELINE_CUDA_CHECK(
          cudaMemsetAsync(dx, 0, static_cast<std::size_t>(total) * sizeof(float), stream));
    const std::int64_t outputs = s.planes * s.out_h * s.out_w;
    if (outputs <= 0) return;
    max_pool2d_backward_windows_kernel<<<detail::grid_for(outputs, kPoolThreads), kPoolThreads, 0,
                                         stream>>>(s, dy, indices, dx);
    PIPELINE_CUDA_LAUNCH_CHECK();
    return;
  }
  max_pool2d_backward_kernel<<<detail::grid_for(total, kPoolThreads), kPoolThreads, 0, stream>>>(
      s, dy, indices, dx);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

void max_pool2d_backward_scatter(cudaStream_t stream, std::int64_t planes, std::int64_t in_plane,
                                 std::int64_t out_plane, const float* dy,
                                 const std::int32_t* indices, float* dx) {
  if (planes <= 0 || in_plane <= 0) return;
  max_pool2d_backward_scatter_kernel<<<detail::grid_for(planes, kPoolThreads), kPoolThreads, 0,
                                       stream>>>(planes, in_plane, out_plane, dy, indices, dx);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

void avg_pool2d_forward(cudaStream_t stream, const PoolShape& s, const float* x, float* y) {
  const std::int64_t total = s.planes * s.out_h * s.out_w;
  if (total <= 0) return;
  const float scale = 1.f / static_cast<float>(s.kernel_h * s.kernel_w);
  avg_pool2d_forward_kernel<<<detail::grid_for(total, kPoolThreads), kPoolThreads, 0, stream>>>(
      s, scale, x, y);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

void avg_pool2d_backward(cudaStream_t stream, const PoolShape& s, const float* dy, float* dx) {
  const std::int64_t total = s.planes * s.h * s.w;
  if (total <= 0) return;
  const float scale = 1.f / static_cast<float>(s.kernel_h * s.kernel_w);
  avg_pool2d_backward_kernel<<<detail::grid_for(total, kPoolThreads), kPoolThreads, 0, stream>>>(
      s, scale, dy, dx);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

void global_avg_pool_forward(cudaStream_t stream, std::int64_t planes, std::int64_t plane,
                             const float* x, float* y) {
  if (planes <= 0 || plane <= 0) return;
  const unsigned blocks = static_cast<unsigned>(std::clamp<std::int64_t>(
      (planes + kWarpsPerBlock - 1) / kWarpsPerBlock, 1, detail::kMaxGridBlocks));
  global_avg_pool_forward_kernel<<<blocks, kPoolThreads, 0, stream>>>(planes, plane, x, y);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

void global_avg_pool_backward(cudaStream_t stream, std::int64_t planes, std::int64_t plane,
                              const float* dy, float* dx) {
  const std::int64_t total = planes * plane;
  if (total <= 0) return;
  const float scale = 1.f / static_cast<float>(plane);
  global_avg_pool_backward_kernel<<<detail::grid_for(total, kPoolThreads), kPoolThreads, 0,
                                    stream>>>(total, plane, scale, dy, dx);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

}  // namespace pipeline::kernels
