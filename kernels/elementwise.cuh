// Launchers of the element-wise kernels (elementwise.cu). CPU reference and contract:
// include/pipeline/ops/elementwise.hpp. Pointers are float32 device memory of `n` elements.
// Asynchronous on `stream`; n == 0 launches nothing.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace pipeline::kernels {

// acc[i] += x[i].
void add_in_place(cudaStream_t stream, float* acc, const float* x, std::int64_t n);

}  // namespace pipeline::kernels
