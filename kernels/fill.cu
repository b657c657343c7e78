// fill_f32: every element of a float32 buffer set to one value. A grid-stride loop over the
// elements, so one launch of a bounded grid covers any count (64-bit indices: buffers may exceed
// 2^31 elements).
#include "fill.cuh"

#include <pipeline/cuda/check.hpp>

#include <algorithm>
#include <cstdint>

namespace pipeline::kernels {

static __global__ void fill_f32_kernel(float* dst, float value, std::uint64_t count) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < count; i += stride)
    dst[i] = value;
}

void fill_f32(cudaStream_t stream, float* dst, float value, std::size_t count) {
  if (count == 0) return;
  constexpr int kThreads = 256;
  const std::uint64_t blocks =
      std::min<std::uint64_t>((count + kThreads - 1) / kThreads, std::uint64_t{1} << 16);
  fill_f32_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(dst, value, count);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

}  // namespace pipeline::kernels
