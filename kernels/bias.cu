// Bias add and bias gradient for row-major [rows, features] activations.
//
// add_bias is one pass over y (read, add bias[i % features], write), the CPU's
// `Y.rowwise() += bias` with the same single rounding per element, so the two agree bitwise.
// bias_grad is a column sum over the rows: a first pass where each block of 32 columns × 8 row
// lanes sums one chunk of rows (coalesced 128-byte row segments per warp), then, when there is
// more than one chunk, the deterministic chunk-ordered finish of reduce.cu. Summation order
// differs from Eigen's colwise().sum(), so the test allows float rounding (~1e-4 relative).
#include "bias.cuh"
#include "common.cuh"

#include <pipeline/cuda/check.hpp>

#include <limits>

namespace pipeline::kernels {

namespace {
constexpr int kColumns = 32;  // threadIdx.x: columns of a column-sum block
constexpr int kLanes = 8;     // threadIdx.y: row lanes of a column-sum block
}  // namespace

// Index is 32-bit when n fits: the per-element modulo is the costliest instruction here.
template <typename Index>
static __global__ void add_bias_kernel(float* y, const float* bias, Index n, Index features) {
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] += bias[i % features];
}

// Column sums of rows [blockIdx.y · rows_per_chunk, +rows_per_chunk) for the 32 columns of
// blockIdx.x: into partials[blockIdx.y, c] when partials is set, else added to out[c].
static __global__ void bias_grad_partial_kernel(const float* dy, std::int64_t rows,
                                                std::int64_t cols, std::int64_t rows_per_chunk,
                                                float* partials, float* out) {
  __shared__ float lanes[kLanes][kColumns + 1];
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * kColumns + threadIdx.x;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * rows_per_chunk;
  const std::int64_t r1 = min(rows, r0 + rows_per_chunk);
  // Four independent sums keep four loads in flight per thread (one sum waits on each load).
  float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
  if (c < cols) {
    std::int64_t r = r0 + threadIdx.y;
    for (; r + 3 * kLanes < r1; r += 4 * kLanes) {
      a0 += dy[r * cols + c];
      a1 += dy[(r + kLanes) * cols + c];
      a2 += dy[(r + 2 * kLanes) * cols + c];
      a3 += dy[(r + 3 * kLanes) * cols + c];
    }
    for (; r < r1; r += kLanes) a0 += dy[r * cols + c];
  }
  lanes[threadIdx.y][threadIdx.x] = (a0 + a1) + (a2 + a3);
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float s = lanes[0][threadIdx.x];
#pragma unroll
    for (int k = 1; k < kLanes; ++k) s += lanes[k][threadIdx.x];
    if (partials)
      partials[static_cast<std::int64_t>(blockIdx.y) * cols + c] = s;
    else
      out[c] += s;
  }
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
  const ColumnSplit split = column_split(rows, features);
  if (split.chunks == 0) return;
  const dim3 grid(static_cast<unsigned>((features + kColumns - 1) / kColumns),
                  static_cast<unsigned>(split.chunks));
  const dim3 block(kColumns, kLanes);
  float* partials = split.chunks > 1 ? workspace : nullptr;
  bias_grad_partial_kernel<<<grid, block, 0, stream>>>(dy, rows, features, split.rows_per_chunk,
                                                       partials, dbias);
  PIPELINE_CUDA_LAUNCH_CHECK();
  if (partials) column_partials_finish(stream, partials, split.chunks, features, dbias);
}

}  // namespace pipeline::kernels
