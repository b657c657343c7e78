// Per-channel bias of NCHW tensors: the add (elementwise, grid-stride) and the gradient (blocks
// of (channel, chunk of the channel's values); each thread sums a strided share of its chunk in
// double, the block adds the shares in a fixed tree order, and the chunks are added in order).
//
// Both find an element's channel from its flat index, one division per four elements where the
// planes allow four-float accesses (plane % 4 == 0 and aligned pointers: every convolution of the
// zoo's models but the 7x7 planes), one per element otherwise. The first versions divided per
// element in 64 bits, and the gradient ran one block per channel (64 blocks for VGG-16's
// 224x224 layers, under half an H100's SMs).
#include "channel_bias.cuh"
#include "common.cuh"
#include "reduce.cuh"

#include <pipeline/cuda/check.hpp>

namespace pipeline::kernels {

namespace {

constexpr int kChannelBiasThreads = 256;
constexpr int kChannelReduceThreads = 256;

// y[i] = widened(x[i]) + bias[channel of i] (x may be y). `vec`: plane % 4 == 0 and both
// pointers aligned to four elements.
template <typename In>
__global__ void channel_bias_kernel(float* y, const In* x, const float* bias, std::int64_t total,
                                    std::int64_t channels, std::int64_t plane, bool vec) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t tid = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (vec) {
    for (std::int64_t i = tid; i < total / 4; i += stride) {
      const float b = bias[(4 * i / plane) % channels];  // the four share a plane
      const detail::Four<In> in = reinterpret_cast<const detail::Four<In>*>(x)[i];
      detail::Four<float> out;
#pragma unroll
      for (int j = 0; j < 4; ++j) out.v[j] = detail::widened(in.v[j]) + b;
      reinterpret_cast<detail::Four<float>*>(y)[i] = out;
    }
    return;
  }
  for (std::int64_t i = tid; i < total; i += stride)
    y[i] = detail::widened(x[i]) + bias[(i / plane) % channels];
}

template <typename In>
void launch_channel_bias(cudaStream_t stream, float* y, const In* x, const float* bias,
                         std::int64_t n, std::int64_t channels, std::int64_t plane) {
  const std::int64_t total = n * channels * plane;
  if (total <= 0) return;
  const auto four = [](const void* p, std::size_t bytes) {
    return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
  };
  const bool vec = plane % 4 == 0 && four(y, 16) && four(x, 4 * sizeof(In));
  channel_bias_kernel<In>
      <<<detail::grid_for(vec ? total / 4 : total, kChannelBiasThreads), kChannelBiasThreads, 0,
         stream>>>(y, x, bias, total, channels, plane, vec);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

// Block (channel blockIdx.x, chunk blockIdx.y) sums values [chunk · per_chunk, +per_chunk) of
// the channel's n·plane (sample-major): into partials[chunk, channel], or added to out[channel]
// when partials is null. `vec` as channel_bias_kernel's (per_chunk is a multiple of 4).
__global__ __launch_bounds__(kChannelReduceThreads) void channel_bias_grad_kernel(
    const float* dy, std::int64_t n, std::int64_t channels, std::int64_t plane,
    std::int64_t per_chunk, bool vec, float* partials, float* out) {
  __shared__ double scratch[detail::kWarp];
  const std::int64_t c = blockIdx.x;
  const std::int64_t lo = static_cast<std::int64_t>(blockIdx.y) * per_chunk;
  const std::int64_t hi = min(n * plane, lo + per_chunk);
  double part = 0;
  if (vec) {
    for (std::int64_t j = lo + 4 * threadIdx.x; j < hi; j += 4 * blockDim.x) {
      const std::int64_t s = j / plane;
      const float4 v =
          *reinterpret_cast<const float4*>(dy + (s * channels + c) * plane + (j - s * plane));
      part += (static_cast<double>(v.x) + static_cast<double>(v.y)) +
              (static_cast<double>(v.z) + static_cast<double>(v.w));
    }
  } else {
    for (std::int64_t j = lo + threadIdx.x; j < hi; j += blockDim.x) {
      const std::int64_t s = j / plane;
      part += static_cast<double>(dy[(s * channels + c) * plane + (j - s * plane)]);
    }
  }
  const double total = detail::block_sum(part, scratch);
  if (threadIdx.x != 0) return;
  if (partials != nullptr)
    partials[static_cast<std::int64_t>(blockIdx.y) * channels + c] = static_cast<float>(total);
  else
    out[c] += static_cast<float>(total);
}

}  // namespace

void channel_bias_add(cudaStream_t stream, float* y, const float* bias, std::int64_t n,
                      std::int64_t channels, std::int64_t plane) {
  launch_channel_bias<float>(stream, y, y, bias, n, channels, plane);
}

void bf16_to_float_channel_bias(cudaStream_t stream, float* y, const std::uint16_t* y16,
                                const float* bias, std::int64_t n, std::int64_t channels,
                                std::int64_t plane) {
  launch_channel_bias<std::uint16_t>(stream, y, y16, bias, n, channels, plane);
}

void channel_bias_grad(cudaStream_t stream, const float* dy, std::int64_t n, std::int64_t channels,
                       std::int64_t plane, float* dbias, float* workspace) {
  const ChannelSplit split = channel_split(n, channels, plane);
  if (split.chunks == 0) return;
  const bool vec = plane % 4 == 0 && detail::aligned16(dy);
  const bool direct = split.chunks == 1;
  channel_bias_grad_kernel<<<dim3(static_cast<unsigned>(channels),
                                  static_cast<unsigned>(split.chunks)),
                             kChannelReduceThreads, 0, stream>>>(
      dy, n, channels, plane, split.per_chunk, vec, direct ? nullptr : workspace, dbias);
  PIPELINE_CUDA_LAUNCH_CHECK();
  if (!direct) column_partials_finish(stream, workspace, split.chunks, channels, dbias);
}

}  // namespace pipeline::kernels
