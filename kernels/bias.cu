// Bias add and bias gradient for row-major [rows, features] activations.
//
// add_bias is one pass over y (read, add bias[i % features], write), the CPU's
// `Y.rowwise() += bias` with the same single rounding per element, so the two agree bitwise.
// bias_grad is reduce.cu's column sum over the rows: each chunk of rows summed by blocks of 32
// columns × 8 row lanes, then, when there is more than one chunk, the chunk-ordered finish.
// Summation order differs from Eigen's colwise().sum(), so the test allows float rounding (~1e-4
// relative).
#include "bias.cuh"
#include "common.cuh"

#include <pipeline/cuda/check.hpp>

#include <limits>

namespace pipeline::kernels {

// Index is 32-bit when n fits: the per-element modulo is the costliest instruction here.
template <typename Index>
static __global__ void add_bias_kernel(float* y, const float* bias, Index n, Index features) {
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] += bias[i % features];
}

void add_bias(cudaStream_t stream, float* y, const float* bias, std::int64_t rows,
              std::int64_t features) {
  const std::int64_t n = rows * features;
  if (n <= 0) return;
  constexpr int kThreads = 256;
  const unsigned blocks = detail::grid_for(n, kThreads);
  // 32-bit indices when i + stride cannot wrap.
  if (n + static_cast<std::int64_t>(blocks) * kThreads <= std::numeric_limits<std::uint32_t>::max())
    add_bias_kernel<std::uint32_t><<<blocks, kThreads, 0, stream>>>(
        y, bias, static_cast<std::uint32_t>(n), static_cast<std::uint32_t>(features));
  else
    add_bias_kernel<std::int64_t><<<blocks, kThreads, 0, stream>>>(y, bias, n, features);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

void bias_grad(cudaStream_t stream, const float* dy, std::int64_t rows, std::int64_t features,
               float* dbias, float* workspace) {
  column_sums(stream, dy, rows, features, workspace, dbias);
}

}  // namespace pipeline::kernels
