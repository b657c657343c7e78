// Per-channel bias of NCHW tensors: the add (elementwise, grid-stride) and the gradient (one
// block per channel; each thread sums a strided share of the channel's n·plane values in double,
// then the block adds the shares in a fixed tree order, so the sum is reproducible bit for bit
// and at least as accurate as the CPU's float sums).
#include "channel_bias.cuh"
#include "common.cuh"

#include <pipeline/cuda/check.hpp>

namespace pipeline::kernels {

namespace {
constexpr int kChannelBiasThreads = 256;
constexpr int kChannelReduceThreads = 512;
}  // namespace

static __global__ void channel_bias_add_kernel(float* y, const float* bias, std::int64_t total,
                                               std::int64_t channels, std::int64_t plane) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride)
    y[i] += bias[(i / plane) % channels];
}

static __global__ __launch_bounds__(kChannelReduceThreads) void channel_bias_grad_kernel(
    const float* dy, std::int64_t n, std::int64_t channels, std::int64_t plane, float* dbias) {
  __shared__ double scratch[detail::kWarp];
  const std::int64_t c = blockIdx.x;
  const std::int64_t count = n * plane;
  double part = 0;
  for (std::int64_t j = threadIdx.x; j < count; j += blockDim.x) {
    const std::int64_t s = j / plane, p = j - s * plane;
    part += static_cast<double>(dy[(s * channels + c) * plane + p]);
  }
  const double total = detail::block_sum(part, scratch);
  if (threadIdx.x == 0) dbias[c] += static_cast<float>(total);
}

void channel_bias_add(cudaStream_t stream, float* y, const float* bias, std::int64_t n,
                      std::int64_t channels, std::int64_t plane) {
  const std::int64_t total = n * channels * plane;
  if (total <= 0) return;
  channel_bias_add_kernel<<<detail::grid_for(total, kChannelBiasThreads), kChannelBiasThreads, 0,
                            stream>>>(y, bias, total, channels, plane);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

void channel_bias_grad(cudaStream_t stream, const float* dy, std::int64_t n, std::int64_t channels,
                       std::int64_t plane, float* dbias) {
  if (channels <= 0 || n * plane <= 0) return;
  channel_bias_grad_kernel<<<static_cast<unsigned>(channels), kChannelReduceThreads, 0, stream>>>(
      dy, n, channels, plane, dbias);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

}  // namespace pipeline::kernels
