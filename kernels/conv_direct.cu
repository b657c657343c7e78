// Direct convolution for shallow windows: see conv_direct.cuh for why.
//
// Forward: one thread per output pixel (n, oh, ow). It loads the window's taps once into
// registers (zero outside the input) and makes all M outputs from them, the weights in shared
// memory, four in one load (every thread of a warp reads the same ones: a broadcast). Consecutive
// threads take consecutive pixels, so loads and stores are coalesced along a row.
//
// Weight gradient: dw[m, tap] = Σ_{n, pixel} dy[n, m, pixel] · x[n, tap at pixel], a long sum
// into few results. The pixels go in units of whole output rows of one sample: a block stages a
// unit's input window in shared memory once, and each of its warps sums one output channel over
// the unit, a lane per pixel and a register per tap, every input value read from the window.
// (A first form, a block per output channel reading each tap from global memory, read the input
// 32-64 times over; it lost to cuDNN under bf16 and at batch 1024 and was reverted.) A block
// keeps its sums over the units it takes, then adds each tap's sum over a warp's lanes by one
// butterfly and writes the results as its partial sums; a second kernel adds the blocks'
// partials in block order. Units, blocks and both orders depend on the shape alone, so the bits
// are the same on every run.
#include "common.cuh"
#include "conv_direct.cuh"

#include <pipeline/cuda/check.hpp>

#include <algorithm>

namespace pipeline::kernels {

namespace {

constexpr int kForwardThreads = 128;
constexpr int kFilterWarps = 8;  // output channels a block
constexpr int kFilterThreads = kFilterWarps * detail::kWarp;
// Most blocks along the pixels (each writes M · depth partial sums, which the finish adds).
constexpr int kFilterBlocks = 256;
constexpr int kWindowFloats = 8192;  // a unit's input window in shared memory: 32 KiB

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

// How the weight gradient splits the pixels: units of `rows` output rows of one sample (the last
// of a sample may have fewer), each with its input window [c][window_rows][window_cols] staged
// in shared memory; `blocks` blocks along the pixels, block b taking units b, b + blocks, ...
struct FilterUnits {
  int rows = 1, groups = 1;  // output rows a unit, units a sample
  int window_rows = 1, window_cols = 1;
  std::int64_t units = 0;
  int blocks = 1;
};

int window_cols(const DirectConv& p) {
  return (p.ow - 1) * p.sw + p.kw;
}

std::int64_t window_floats(const DirectConv& p, int rows) {
  return static_cast<std::int64_t>(p.c) * ((rows - 1) * p.sh + p.kh) * window_cols(p);
}

FilterUnits filter_units(const DirectConv& p) {
  FilterUnits u;
  u.window_cols = window_cols(p);
  // As many rows as the window holds, but fewer where a small batch would leave blocks idle.
  int fit = 1;
  while (fit < p.oh && window_floats(p, fit + 1) <= kWindowFloats) ++fit;
  const int wanted_groups = std::max(1, (kFilterBlocks + p.n - 1) / std::max(p.n, 1));
  u.rows = std::max(1, std::min(fit, (p.oh + wanted_groups - 1) / wanted_groups));
  u.groups = (p.oh + u.rows - 1) / u.rows;
  u.window_rows = (u.rows - 1) * p.sh + p.kh;
  u.units = static_cast<std::int64_t>(p.n) * u.groups;
  u.blocks = static_cast<int>(std::clamp<std::int64_t>(u.units, 1, kFilterBlocks));
  return u;
}

}  // namespace

static __global__ __launch_bounds__(kForwardThreads) void direct_conv_forward_kernel(
    DirectConv p, Taps t, const float* x, const float* weight, float* y) {
  // Each output's weights on a row of kDirectConvMaxDepth floats, zero past the window's depth,
  // so that they are read four at a time (a warp reads the same four: one broadcast).
  __shared__ float4 ws4[kDirectConvMaxOutputs * kDirectConvMaxDepth / 4];
  float* ws = reinterpret_cast<float*>(ws4);
  const int depth = p.c * p.kh * p.kw, quads = (depth + 3) / 4;
  for (int i = threadIdx.x; i < p.m * kDirectConvMaxDepth; i += blockDim.x) {
    const int m = i / kDirectConvMaxDepth, k = i % kDirectConvMaxDepth;
    ws[i] = k < depth ? weight[m * depth + k] : 0.f;
  }
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
      const float4* wm = ws4 + m * (kDirectConvMaxDepth / 4);
      float acc = 0.f;
#pragma unroll
      for (int j = 0; j < kDirectConvMaxDepth / 4; ++j) {
        if (j >= quads) break;
        const float4 w4 = wm[j];
        acc = fmaf(v[4 * j], w4.x, acc);
        acc = fmaf(v[4 * j + 1], w4.y, acc);
        acc = fmaf(v[4 * j + 2], w4.z, acc);
        acc = fmaf(v[4 * j + 3], w4.w, acc);
      }
      out[static_cast<std::int64_t>(m) * plane] = acc;
    }
  }
}

// Partial sums [blockIdx.x][m][tap] of the units block blockIdx.x takes, for the output channels
// blockIdx.y · kFilterWarps + warp.
static __global__ __launch_bounds__(kFilterThreads) void direct_conv_filter_partial_kernel(
    DirectConv p, Taps taps, FilterUnits u, const float* x, const float* dy, float* partials) {
  __shared__ float window[kWindowFloats];
  const int depth = p.c * p.kh * p.kw;
  const int lane = threadIdx.x % detail::kWarp, warp = threadIdx.x / detail::kWarp;
  const int m = static_cast<int>(blockIdx.y) * kFilterWarps + warp;
  // Each tap's place in the window relative to its pixel's corner.
  int offset[kDirectConvMaxDepth];
#pragma unroll
  for (int t = 0; t < kDirectConvMaxDepth; ++t)
    offset[t] = (taps.c[t] * u.window_rows + taps.kh[t]) * u.window_cols + taps.kw[t];
  float acc[kDirectConvMaxDepth];
#pragma unroll
  for (int t = 0; t < kDirectConvMaxDepth; ++t) acc[t] = 0.f;
  const int floats = p.c * u.window_rows * u.window_cols;
  for (std::int64_t unit = blockIdx.x; unit < u.units; unit += gridDim.x) {
    const int n = static_cast<int>(unit / u.groups);
    const int oh0 = static_cast<int>(unit % u.groups) * u.rows;
    const int rows = min(u.rows, p.oh - oh0);
    const int ih0 = oh0 * p.sh - p.ph, iw0 = -p.pw;
    __syncthreads();  // every warp is done with the last unit's window
    for (int i = threadIdx.x; i < floats; i += blockDim.x) {
      const int col = i % u.window_cols, r = i / u.window_cols % u.window_rows,
                c = i / (u.window_cols * u.window_rows);
      const int ih = ih0 + r, iw = iw0 + col;
      window[i] = ih >= 0 && ih < p.h && iw >= 0 && iw < p.w
                      ? x[((static_cast<std::int64_t>(n) * p.c + c) * p.h + ih) * p.w + iw]
                      : 0.f;
    }
    __syncthreads();
    if (m >= p.m) continue;
    const float* d = dy + ((static_cast<std::int64_t>(n) * p.m + m) * p.oh + oh0) * p.ow;
    const int pixels = rows * p.ow;
    for (int q = lane; q < pixels; q += detail::kWarp) {
      const int r = q / p.ow, col = q - r * p.ow;
      const float g = d[q];
      const float* at = window + r * p.sh * u.window_cols + col * p.sw;
#pragma unroll
      for (int t = 0; t < kDirectConvMaxDepth; ++t)
        if (t < depth) acc[t] = fmaf(g, at[offset[t]], acc[t]);
    }
  }
  if (m >= p.m) return;  // no barrier follows
  // Each tap's sum over the warp's lanes; lane t writes tap t's.
  float mine = 0.f;
#pragma unroll
  for (int t = 0; t < kDirectConvMaxDepth; ++t) {
    if (t < depth) {  // depth is the same on every lane: the whole warp shuffles
      const float s = detail::warp_sum(acc[t]);
      if (lane == t) mine = s;
    }
  }
  if (lane < depth)
    partials[(static_cast<std::int64_t>(blockIdx.x) * p.m + m) * depth + lane] = mine;
}

// dweight[k] = beta · dweight[k] + Σ_b partials[b][k] for the k = (m, tap) of `outputs`.
static __global__ void direct_conv_filter_finish_kernel(int outputs, int blocks,
                                                        const float* partials, float beta,
                                                        float* dweight) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= outputs) return;
  float s = 0.f;
  for (int b = 0; b < blocks; ++b) s += partials[static_cast<std::int64_t>(b) * outputs + k];
  dweight[k] = beta == 0.f ? s : beta * dweight[k] + s;
}

bool direct_conv_applies(const DirectConv& p) {
  return p.c > 0 && p.c * p.kh * p.kw <= kDirectConvMaxDepth && p.m > 0 &&
         p.m <= kDirectConvMaxOutputs && p.oh > 0 && p.ow > 0 &&
         window_floats(p, 1) <= kWindowFloats;
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
  return static_cast<std::size_t>(filter_units(p).blocks) * static_cast<std::size_t>(p.m) *
         static_cast<std::size_t>(p.c * p.kh * p.kw) * sizeof(float);
}

void direct_conv_backward_filter(cudaStream_t stream, const DirectConv& p, const float* x,
                                 const float* dy, float beta, float* dweight, void* workspace) {
  if (static_cast<std::int64_t>(p.n) * p.oh * p.ow == 0) return;  // the op returns before
  const FilterUnits u = filter_units(p);
  auto* partials = static_cast<float*>(workspace);
  const dim3 grid(static_cast<unsigned>(u.blocks),
                  static_cast<unsigned>((p.m + kFilterWarps - 1) / kFilterWarps));
  direct_conv_filter_partial_kernel<<<grid, kFilterThreads, 0, stream>>>(p, taps_of(p), u, x, dy,
                                                                         partials);
  PIPELINE_CUDA_LAUNCH_CHECK();
  const int outputs = p.m * p.c * p.kh * p.kw;
  direct_conv_filter_finish_kernel<<<(outputs + 127) / 128, 128, 0, stream>>>(
      outputs, u.blocks, partials, beta, dweight);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

}  // namespace pipeline::kernels
