// Launchers of the dropout kernels (dropout.cu). CPU reference and contract:
// include/pipeline/ops/dropout.hpp — the mask is 1/(1−p) with probability 1−p and 0 otherwise,
// element i taking the i-th draw of Rng(seed, key), so the GPU and the CPU draw the same mask.
// Pointers are float32 device memory of `n` elements. Asynchronous on `stream`; n == 0 launches
// nothing.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace pipeline::kernels {

// mask[i] = (uniform draw i of the generator seeded with `mixed_seed`) < p ? 0 : keep, where
// mixed_seed = seed ^ Rng::hash(key) and keep = 1/(1 − p) computed by the caller as the CPU op
// does. For 0 < p < 1 (the op handles p = 0 and p = 1 without drawing). n < 2^42.
void dropout_mask(cudaStream_t stream, float* mask, std::int64_t n, float p, float keep,
                  std::uint64_t mixed_seed);

// y = x ⊙ mask (y may be x).
void apply_mask(cudaStream_t stream, const float* x, const float* mask, float* y, std::int64_t n);

}  // namespace pipeline::kernels
