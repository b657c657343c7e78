// Element-wise tensor arithmetic: acc += x, the residual connections of composite layers. One
// grid-stride pass (read both, write acc), one float addition per element as on the CPU, so the
// results agree bitwise.
#include "common.cuh"
#include "elementwise.cuh"

#include <pipeline/cuda/check.hpp>

namespace pipeline::kernels {

static __global__ void add_in_place_kernel(float* acc, const float* x, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    acc[i] += x[i];
}

void add_in_place(cudaStream_t stream, float* acc, const float* x, std::int64_t n) {
  if (n <= 0) return;
  constexpr int kThreads = 256;
  add_in_place_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(acc, x, n);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

}  // namespace pipeline::kernels
