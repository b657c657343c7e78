// Batch norm over NCHW channels, forward (training and evaluation) and backward.
//
// Training forward and backward take one block per channel: the block reads the channel's
// n·plane values (n runs of `plane` contiguous floats), reduces in double with a fixed thread
// assignment and tree order (deterministic), and then makes its elementwise pass. cuDNN's
// batch norm was not used: its backward has no evaluation mode (constant statistics), and its
// saved statistics and running updates are computed in its own way; custom kernels reproduce
// the CPU op's formulas term for term (src/ops/norm.cpp): the mean as the double sum over the
// count rounded to float, the variance from squares centred on that float mean, rstd =
// 1/sqrt(var + eps) in double, the running estimates with the unbiased variance.
//
// One block per channel leaves a GPU partly idle when there are fewer channels than
// multiprocessors; the reductions would then be split over several blocks per channel with a
// second, ordered pass (as reduce.cuh does for columns). Not done yet: correctness first.
#include "batch_norm.cuh"
#include "common.cuh"

#include <pipeline/cuda/check.hpp>

namespace pipeline::kernels {

namespace {
constexpr int kBatchNormThreads = 512;
constexpr int kElementThreads = 256;

// Offset of the j-th value (j < n·plane) of channel c.
__device__ __forceinline__ std::int64_t at(std::int64_t j, std::int64_t c, std::int64_t channels,
                                           std::int64_t plane) {
  const std::int64_t s = j / plane;
  return (s * channels + c) * plane + (j - s * plane);
}
}  // namespace

static __global__ __launch_bounds__(kBatchNormThreads) void batch_norm_forward_train_kernel(
    const float* x, const float* weight, const float* bias, std::int64_t n, std::int64_t channels,
    std::int64_t plane, float eps, float momentum, float* running_mean, float* running_var,
    float* y, float* mean, float* rstd) {
  __shared__ double scratch[detail::kWarp];
  const std::int64_t c = blockIdx.x, count = n * plane;
  double part = 0;
  for (std::int64_t j = threadIdx.x; j < count; j += blockDim.x)
    part += static_cast<double>(x[at(j, c, channels, plane)]);
  const double m = detail::block_sum(part, scratch) / static_cast<double>(count);
  const float mf = static_cast<float>(m);
  part = 0;
  for (std::int64_t j = threadIdx.x; j < count; j += blockDim.x) {
    const float d = x[at(j, c, channels, plane)] - mf;
    part += static_cast<double>(__fmul_rn(d, d));
  }
  const double ss = detail::block_sum(part, scratch);
  const double var = ss / static_cast<double>(count);
  const float rs = static_cast<float>(1.0 / sqrt(var + static_cast<double>(eps)));
  const float scale = rs * weight[c], shift = bias[c] - mf * scale;
  for (std::int64_t j = threadIdx.x; j < count; j += blockDim.x) {
    const std::int64_t o = at(j, c, channels, plane);
    y[o] = x[o] * scale + shift;
  }
  if (threadIdx.x == 0) {
    mean[c] = mf;
    rstd[c] = rs;
    const double unbiased = ss / static_cast<double>(count - 1);
    running_mean[c] = (1.f - momentum) * running_mean[c] + momentum * mf;
    running_var[c] = (1.f - momentum) * running_var[c] + momentum * static_cast<float>(unbiased);
  }
}

static __global__ void batch_norm_eval_stats_kernel(std::int64_t channels, float eps,
                                                    const float* running_mean,
                                                    const float* running_var, float* mean,
                                                    float* rstd) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  mean[c] = running_mean[c];
  rstd[c] = 1.f / sqrtf(running_var[c] + eps);
}

static __global__ void batch_norm_eval_apply_kernel(const float* x, const float* weight,
                                                    const float* bias, std::int64_t total,
                                                    std::int64_t channels, std::int64_t plane,
                                                    const float* mean, const float* rstd,
                                                    float* y) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += stride) {
    const std::int64_t c = (t / plane) % channels;
    const float scale = rstd[c] * weight[c], shift = bias[c] - mean[c] * scale;
    y[t] = x[t] * scale + shift;
  }
}

static __global__ __launch_bounds__(kBatchNormThreads) void batch_norm_backward_kernel(
    const float* x, const float* weight, const float* mean, const float* rstd, const float* dy,
    std::int64_t n, std::int64_t channels, std::int64_t plane, bool training, float* dx,
    float* dweight, float* dbias) {
  __shared__ double scratch[detail::kWarp];
  const std::int64_t c = blockIdx.x, count = n * plane;
  const float m = mean[c], rs = rstd[c];
  double part_g = 0, part_gx = 0;
  for (std::int64_t j = threadIdx.x; j < count; j += blockDim.x) {
    const std::int64_t o = at(j, c, channels, plane);
    const float g = dy[o];
    part_g += static_cast<double>(g);
    part_gx += static_cast<double>(g * (x[o] - m));
  }
  const double sum_g = detail::block_sum(part_g, scratch);
  const double sum_gx = detail::block_sum(part_gx, scratch) * static_cast<double>(rs);
  if (threadIdx.x == 0) {
    if (dbias != nullptr) dbias[c] += static_cast<float>(sum_g);
    if (dweight != nullptr) dweight[c] += static_cast<float>(sum_gx);
  }
  if (dx == nullptr) return;
  const float k = rs * weight[c];
  const float g_mean = training ? static_cast<float>(sum_g / static_cast<double>(count)) : 0.f;
  const float gx_mean = training ? static_cast<float>(sum_gx / static_cast<double>(count)) : 0.f;
  const float r = rs * gx_mean;
  for (std::int64_t j = threadIdx.x; j < count; j += blockDim.x) {
    const std::int64_t o = at(j, c, channels, plane);
    dx[o] = k * (dy[o] - g_mean - (x[o] - m) * r);
  }
}

void batch_norm_forward_train(cudaStream_t stream, const float* x, const float* weight,
                              const float* bias, std::int64_t n, std::int64_t channels,
                              std::int64_t plane, float eps, float momentum, float* running_mean,
                              float* running_var, float* y, float* mean, float* rstd) {
  if (channels <= 0 || n * plane <= 0) return;
  batch_norm_forward_train_kernel<<<static_cast<unsigned>(channels), kBatchNormThreads, 0,
                                    stream>>>(x, weight, bias, n, channels, plane, eps, momentum,
                                              running_mean, running_var, y, mean, rstd);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

void batch_norm_forward_eval(cudaStream_t stream, const float* x, const float* weight,
                             const float* bias, std::int64_t n, std::int64_t channels,
                             std::int64_t plane, float eps, const float* running_mean,
                             const float* running_var, float* y, float* mean, float* rstd) {
  if (channels <= 0) return;
  batch_norm_eval_stats_kernel<<<detail::grid_for(channels, kElementThreads), kElementThreads, 0,
                                 stream>>>(channels, eps, running_mean, running_var, mean, rstd);
  PIPELINE_CUDA_LAUNCH_CHECK();
  const std::int64_t total = n * channels * plane;
  if (total <= 0) return;
  batch_norm_eval_apply_kernel<<<detail::grid_for(total, kElementThreads), kElementThreads, 0,
                                 stream>>>(x, weight, bias, total, channels, plane, mean, rstd, y);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

void batch_norm_backward(cudaStream_t stream, const float* x, const float* weight,
                         const float* mean, const float* rstd, const float* dy, std::int64_t n,
                         std::int64_t channels, std::int64_t plane, bool training, float* dx,
                         float* dweight, float* dbias) {
  if (channels <= 0 || n * plane <= 0) return;
  if (dx == nullptr && dweight == nullptr && dbias == nullptr) return;
  batch_norm_backward_kernel<<<static_cast<unsigned>(channels), kBatchNormThreads, 0, stream>>>(
      x, weight, mean, rstd, dy, n, channels, plane, training, dx, dweight, dbias);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

}  // namespace pipeline::kernels
