// Launchers of the batch norm kernels (batch_norm.cu). CPU reference and contract:
// include/pipeline/ops/norm.hpp (src/ops/norm.cpp) — statistics per channel over N·H·W, the
// biased variance normalises, rstd = 1/√(var + eps), running = (1 − momentum)·running +
// momentum·batch with the unbiased variance for running_var; evaluation normalises with the
// running estimates and writes them (mean, 1/√(running_var + eps)) as mean and rstd.
//
// x, y, dy and dx are float32 device memory [n, channels, plane] (plane = H·W); weight, bias,
// running_mean, running_var, mean, rstd, dweight and dbias hold `channels` floats. Asynchronous
// on `stream`; an empty input launches nothing. The op checks shapes, eps, momentum and
// n·plane > 1 for training.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace pipeline::kernels {

// Batch statistics (two passes: mean, then centred squares, both summed in double), y, and the
// running estimates updated in place.
void batch_norm_forward_train(cudaStream_t stream, const float* x, const float* weight,
                              const float* bias, std::int64_t n, std::int64_t channels,
                              std::int64_t plane, float eps, float momentum, float* running_mean,
                              float* running_var, float* y, float* mean, float* rstd);

// y from the running estimates; mean and rstd derived from them.
void batch_norm_forward_eval(cudaStream_t stream, const float* x, const float* weight,
                             const float* bias, std::int64_t n, std::int64_t channels,
                             std::int64_t plane, float eps, const float* running_mean,
                             const float* running_var, float* y, float* mean, float* rstd);

// dbias += Σ dy, dweight += Σ dy ⊙ x̂ (per channel, in double, fixed order); dx = w·rstd·(dy −
// mean(dy) − x̂·mean(dy ⊙ x̂)) when `training` (batch statistics depend on x), w·rstd·dy
// otherwise (overwritten). Each output may be null (not computed).
void batch_norm_backward(cudaStream_t stream, const float* x, const float* weight,
                         const float* mean, const float* rstd, const float* dy, std::int64_t n,
                         std::int64_t channels, std::int64_t plane, bool training, float* dx,
                         float* dweight, float* dbias);

}  // namespace pipeline::kernels
