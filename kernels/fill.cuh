// Filling device memory with a float32 value (Tensor::fill on a CUDA tensor). Zeroing uses
// cudaMemsetAsync instead, which any dtype can take.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace pipeline::kernels {

// dst[i] = value for i < count, queued on `stream`.
void fill_f32(cudaStream_t stream, float* dst, float value, std::size_t count);

}  // namespace pipeline::kernels
