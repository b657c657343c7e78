// Second pass of the deterministic column reductions (reduce.cuh): adds the per-chunk column sums
// of the first pass into the output, one thread per column walking the chunks in order, so the
// result does not depend on scheduling. Reads chunks × cols floats once, coalesced across the
// threads of a warp.
#include "common.cuh"
#include "reduce.cuh"

#include <pipeline/cuda/check.hpp>

namespace pipeline::kernels {

static __global__ void column_partials_finish_kernel(const float* partials, std::int64_t chunks,
                                                     std::int64_t cols, float* out) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < cols;
       c += stride) {
    float s = 0.f;
    for (std::int64_t k = 0; k < chunks; ++k) s += partials[k * cols + c];
    out[c] += s;
  }
}

void column_partials_finish(cudaStream_t stream, const float* partials, std::int64_t chunks,
                            std::int64_t cols, float* out) {
  if (chunks <= 0 || cols <= 0) return;
  constexpr int kThreads = 256;
  column_partials_finish_kernel<<<detail::grid_for(cols, kThreads), kThreads, 0, stream>>>(
      partials, chunks, cols, out);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

}  // namespace pipeline::kernels
