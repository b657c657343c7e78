// Launchers of the per-channel bias kernels of NCHW tensors (channel_bias.cu): the bias of a
// convolution. CPU reference: ops::conv2d_forward's bias and ops::conv2d_backward_bias
// (src/ops/conv.cpp).
//
// y and dy are float32 device memory [n, channels, plane] (plane = H·W), bias and dbias hold
// `channels` floats. Asynchronous on `stream`; an empty tensor launches nothing.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace pipeline::kernels {

// y[n, c, p] += bias[c] (one float addition per element, as the CPU).
void channel_bias_add(cudaStream_t stream, float* y, const float* bias, std::int64_t n,
                      std::int64_t channels, std::int64_t plane);

// y[n, c, p] = float(y16[n, c, p]) + bias[c]: a bf16 convolution's result widened and its bias
// added in one pass (the same bits as bf16_to_float, then channel_bias_add).
void bf16_to_float_channel_bias(cudaStream_t stream, float* y, const std::uint16_t* y16,
                                const float* bias, std::int64_t n, std::int64_t channels,
                                std::int64_t plane);

// How channel_bias_grad splits each channel's n·plane values: `chunks` consecutive runs of
// `per_chunk` (a multiple of 4, so that four-float loads never straddle two chunks), about 1024
// blocks over all channels, at least 4096 values a chunk. It depends only on the shape, never on
// the device, so the sums are the same bits on every run and every GPU.
struct ChannelSplit {
  std::int64_t chunks = 0, per_chunk = 0;
  // float32 elements of workspace channel_bias_grad needs (0: one chunk, no workspace).
  std::int64_t workspace_floats(std::int64_t channels) const {
    return chunks > 1 ? chunks * channels : 0;
  }
};

inline ChannelSplit channel_split(std::int64_t n, std::int64_t channels, std::int64_t plane) {
  const std::int64_t count = n * plane;
  if (count <= 0 || channels <= 0) return {};
  constexpr std::int64_t kTargetBlocks = 1024, kMinPerChunk = 4096, kMaxChunks = 65535;
  const std::int64_t wanted = std::max<std::int64_t>(1, kTargetBlocks / channels);
  const std::int64_t by_size = (count + kMinPerChunk - 1) / kMinPerChunk;
  const std::int64_t chunks = std::min({wanted, by_size, kMaxChunks});
  const std::int64_t per_chunk = ((count + chunks - 1) / chunks + 3) / 4 * 4;
  return {(count + per_chunk - 1) / per_chunk, per_chunk};
}

// dbias[c] += Σ_{n, p} dy[n, c, p]: each chunk (channel_split) of a channel summed by one block in
// double in a fixed order into `workspace` (channel_split(...).workspace_floats(channels) floats;
// null when that is 0), then the chunks added in an order fixed by the shape alone (reduce.cuh's
// column sums): the same bits on every run, and at least as accurate as the CPU's float sums.
void channel_bias_grad(cudaStream_t stream, const float* dy, std::int64_t n, std::int64_t channels,
                       std::int64_t plane, float* dbias, float* workspace);

}  // namespace pipeline::kernels
