// Launchers of the bias kernels (bias.cu). CPU reference and contract:
// include/pipeline/ops/bias.hpp. Activations are row-major [rows, features] float32 device
// memory, features innermost. Asynchronous on `stream`; an empty matrix launches nothing.
#pragma once

#include "reduce.cuh"

#include <cuda_runtime.h>

#include <cstdint>

namespace pipeline::kernels {

// y[r, f] += bias[f].
void add_bias(cudaStream_t stream, float* y, const float* bias, std::int64_t rows,
              std::int64_t features);

// float32 elements of device workspace bias_grad() needs for this shape (may be 0).
inline std::int64_t bias_grad_workspace_floats(std::int64_t rows, std::int64_t features) {
  return column_split(rows, features).workspace_floats(features);
}

// dbias[f] += Σ_r dy[r, f], deterministic (reduce.cuh). `workspace` holds
// bias_grad_workspace_floats(rows, features) floats (null when that is 0).
void bias_grad(cudaStream_t stream, const float* dy, std::int64_t rows, std::int64_t features,
               float* dbias, float* workspace);

}  // namespace pipeline::kernels
