// Direct convolution for shallow windows (C·KH·KW <= 32): see conv_direct.cuh for why.
//
// Forward: one thread per output pixel (n, oh, ow). It loads the window's taps once into
// registers (zero outside the padded input) and makes all M outputs from them, the weights in
// shared memory (every thread of a warp reads the same weight: a broadcast). Consecutive threads
// take consecutive pixels, so loads and stores are coalesced along a row.
//
// Weight gradient: dw[m, tap] = Σ_{n, pixel} dy[n, m, pixel] · x[n, tap at pixel]. A block per
// (output channel, slice of the pixels) keeps one accumulator per tap in each thread, reduces
// them over the block in a fixed order and writes its partial sums; a second kernel adds the
// slices in order. The slice count depends only on the shape, so the bits are the same on every
// run.
#include "common.cuh"
#include "conv_direct.cuh"

#include <pipeline/cuda/check.hpp>

namespace pipeline::kernels {

namespace {

constexpr int kForwardThreads = 128;
constexpr int kFilterThreads = 256;
constexpr int kMaxSlices = 64;
constexpr std::int64_t kPixelsPerThread = 16;  // before another slice is worth its partial sums

int slices_for(const DirectConv& p) {
  const std::int64_t pixels = static_cast<std::int64_t>(p.n) * p.oh * p.ow;
  const std::int64_t per_slice = kFilterThreads * kPixelsPerThread;
  return static_cast<int>(
      std::clamp<std::int64_t>((pixels + per_slice - 1) / per_slice, 1, kMaxSlices));
}

// The offset of tap t in the input relative to the window's corner: channel, row, column.
struct Taps {
  int c[kDirectConvMaxDepth], kh[kDirectConvMaxDepth], kw[kDirectConvMaxDepth];
};

Taps taps_of(const DirectConv& p) {
  Taps t{};
  int i = 0;
  for (int c = 0; c < p.c; ++c)
    for (int kh = 0; kh < p.kh; ++kh)
      for (int kw = 0; kw < p.kw; ++kw, ++i) {
        t.c[i] = c;
        t.kh[i] = kh;
        t.kw[i] = kw;
      }
  return t;
}

// x at tap t of the window whose corner is (ih0, iw0) in sample n; 0 in the padding.
__device__ __forceinline__ float tap(const DirectConv& p, const Taps& t, const float* x, int n,
                                     int i, int ih0, int iw0) {
  const int ih = ih0 + t.kh[i], iw = iw0 + t.kw[i];
  if (ih < 0 || ih >= p.h || iw < 0 || iw >= p.w) return 0.f;
  return x[((static_cast<std::int64_t>(n) * p.c + t.c[i]) * p.h + ih) * p.w + iw];
}

}  // namespace

static __global__ __launch_bounds__(kForwardThreads) void direct_conv_forward_kernel(
    DirectConv p, Taps t, const float* x, const float* weight, float* y) {
  __shared__ float ws[kDirectConvMaxOutputs * kDirectConvMaxDepth];
  const int depth = p.c * p.kh * p.kw;
  for (int i = threadIdx.x; i < p.m * depth; i += blockDim.x) ws[i] = weight[i];
  __syncthreads();
  const std::int64_t plane = static_cast<std::int64_t>(p.oh) * p.ow;
  const std::int64_t pixels = plane * p.n;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t q = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       q < pixels; q += stride) {
    const int n = static_cast<int>(q / plane);
    const std::int64_t pix = q - n * plane;
    const int oh = static_cast<int>(pix / p.ow), ow = static_cast<int>(pix - oh * p.ow);
    const int ih0 = oh * p.sh - p.ph, iw0 = ow * p.sw - p.pw;
    float v[kDirectConvMaxDepth];
#pragma unroll
    for (int i = 0; i < kDirectConvMaxDepth; ++i)
      v[i] = i < depth ? tap(p, t, x, n, i, ih0, iw0) : 0.f;
    float* out = y + static_cast<std::int64_t>(n) * p.m * plane + pix;
    for (int m = 0; m < p.m; ++m) {
      const float* wm = ws + m * depth;
      float acc = 0.f;
#pragma unroll
      for (int i = 0; i < kDirectConvMaxDepth; ++i)
        if (i < depth) acc = fmaf(v[i], wm[i], acc);
      out[static_cast<std::int64_t>(m) * plane] = acc;
    }
  }
}

static __global__ __launch_bounds__(kFilterThreads) void direct_conv_filter_partial_kernel(
    DirectConv p, Taps t, const float* x, const float* dy, float* partials) {
  __shared__ float warp_sums[kFilterThreads / detail::kWarp][kDirectConvMaxDepth];
  const int m = blockIdx.x, slice = blockIdx.y, slices = gridDim.y;
  const int depth = p.c * p.kh * p.kw;
  const std::int64_t plane = static_cast<std::int64_t>(p.oh) * p.ow;
  const std::int64_t pixels = plane * p.n;
  float acc[kDirectConvMaxDepth];
#pragma unroll
  for (int i = 0; i < kDirectConvMaxDepth; ++i) acc[i] = 0.f;
  for (std::int64_t q = static_cast<std::int64_t>(slice) * blockDim.x + threadIdx.x; q < pixels;
       q += static_cast<std::int64_t>(slices) * blockDim.x) {
    const int n = static_cast<int>(q / plane);
    const std::int64_t pix = q - n * plane;
    const int oh = static_cast<int>(pix / p.ow), ow = static_cast<int>(pix - oh * p.ow);
    const float d = dy[(static_cast<std::int64_t>(n) * p.m + m) * plane + pix];
    const int ih0 = oh * p.sh - p.ph, iw0 = ow * p.sw - p.pw;
#pragma unroll
    for (int i = 0; i < kDirectConvMaxDepth; ++i)
      if (i < depth) acc[i] = fmaf(d, tap(p, t, x, n, i, ih0, iw0), acc[i]);
  }
  const int lane = threadIdx.x % detail::kWarp, warp = threadIdx.x / detail::kWarp;
#pragma unroll
  for (int i = 0; i < kDirectConvMaxDepth; ++i) {
    const float s = detail::warp_sum(acc[i]);
    if (lane == 0 && i < depth) warp_sums[warp][i] = s;
  }
  __syncthreads();
  if (threadIdx.x < depth) {
    float s = 0.f;
    for (int w = 0; w < kFilterThreads / detail::kWarp; ++w) s += warp_sums[w][threadIdx.x];
    partials[(static_cast<std::int64_t>(m) * slices + slice) * depth + threadIdx.x] = s;
  }
}

static __global__ void direct_conv_filter_finish_kernel(int outputs, int depth, int slices,
                                                        const float* partials, float beta,
                                                        float* dweight) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;  // (m, tap)
  if (k >= outputs * depth) return;
  const int m = k / depth, i = k - m * depth;
  float s = 0.f;
  for (int j = 0; j < slices; ++j)
    s += partials[(static_cast<std::int64_t>(m) * slices + j) * depth + i];
  dweight[k] = beta == 0.f ? s : beta * dweight[k] + s;
}

bool direct_conv_applies(const DirectConv& p) {
  return p.c * p.kh * p.kw <= kDirectConvMaxDepth && p.m <= kDirectConvMaxOutputs && p.m > 0;
}

void direct_conv_forward(cudaStream_t stream, const DirectConv& p, const float* x,
                         const float* weight, float* y) {
  const std::int64_t pixels = static_cast<std::int64_t>(p.n) * p.oh * p.ow;
  if (pixels == 0) return;
  direct_conv_forward_kernel<<<detail::grid_for(pixels, kForwardThreads), kForwardThreads, 0,
                               stream>>>(p, taps_of(p), x, weight, y);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

std::size_t direct_conv_backward_filter_workspace(const DirectConv& p) {
  return static_cast<std::size_t>(p.m) * slices_for(p) * (p.c * p.kh * p.kw) * sizeof(float);
}

void direct_conv_backward_filter(cudaStream_t stream, const DirectConv& p, const float* x,
                                 const float* dy, float beta, float* dweight, void* workspace) {
  const int depth = p.c * p.kh * p.kw, slices = slices_for(p);
  auto* partials = static_cast<float*>(workspace);
  if (static_cast<std::int64_t>(p.n) * p.oh * p.ow == 0) return;  // the op returns before
  direct_conv_filter_partial_kernel<<<
      dim3(static_cast<unsigned>(p.m), static_cast<unsigned>(slices)), kFilterThreads, 0, stream>>>(
      p, taps_of(p), x, dy, partials);
  PIPELINE_CUDA_LAUNCH_CHECK();
  const int outputs = p.m * depth;
  direct_conv_filter_finish_kernel<<<(outputs + 127) / 128, 128, 0, stream>>>(
      p.m, depth, slices, partials, beta, dweight);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

}  // namespace pipeline::kernels
