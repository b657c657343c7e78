// Launchers of the layer norm kernels (layer_norm.cu). CPU reference and contract:
// include/pipeline/ops/norm.hpp — normalisation over the last dimension, biased variance,
// rstd = 1/√(var + eps), as PyTorch's nn.LayerNorm.
//
// x, y, dy and dx are row-major [rows, features] float32 device memory; weight, bias, dweight and
// dbias hold `features` floats, mean and rstd `rows`. features must lie in [1, 2^31) (the op
// checks it). Asynchronous on `stream`; rows == 0 launches nothing.
#pragma once

#include "reduce.cuh"

#include <cuda_runtime.h>

#include <cstdint>

namespace pipeline::kernels {

// y = (x − mean) · rstd · weight + bias per row; writes mean and rstd for the backward.
void layer_norm_forward(cudaStream_t stream, const float* x, const float* weight, const float* bias,
                        std::int64_t rows, std::int64_t features, float eps, float* y, float* mean,
                        float* rstd);

// The same with y in bf16, rounded as it is stored (the bits of float_to_bf16 of the float32 y).
void layer_norm_forward_bf16(cudaStream_t stream, const float* x, const float* weight,
                             const float* bias, std::int64_t rows, std::int64_t features, float eps,
                             std::uint16_t* y, float* mean, float* rstd);

// float32 elements of device workspace layer_norm_backward() needs (may be 0).
std::int64_t layer_norm_backward_workspace_floats(std::int64_t rows, std::int64_t features);

// dx = rstd · (g − mean(g) − x̂ · mean(g ⊙ x̂)) with g = dy ⊙ weight (overwritten);
// dweight += Σ_r dy ⊙ x̂ and dbias += Σ_r dy (deterministic, reduce.cuh). Each output may be
// null (not computed). `workspace` holds layer_norm_backward_workspace_floats(rows, features).
void layer_norm_backward(cudaStream_t stream, const float* x, const float* weight,
                         const float* mean, const float* rstd, const float* dy, std::int64_t rows,
                         std::int64_t features, float* dx, float* dweight, float* dbias,
                         float* workspace);

}  // namespace pipeline::kernels
