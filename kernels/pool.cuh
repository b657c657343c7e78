// Launchers of the pooling kernels (pool.cu). CPU reference and contract:
// include/pipeline/ops/pool.hpp (src/ops/pool.cpp) — floor-mode windows, padding that never wins
// a max and counts as zeros in an average whose divisor is always kh·kw; the max pool's int32
// index of each maximum is its position ih·W + iw in its plane, the first one in window order
// (row by row) on ties, NaN propagating.
//
// Tensors are float32 device memory of `planes` = N·C planes: inputs [planes, h, w], outputs
// [planes, out_h, out_w]. Asynchronous on `stream`; no planes launches nothing. Every backward
// overwrites dx.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace pipeline::kernels {

// The geometry of one pooling call (the op derives it from Window2d and checks it).
struct PoolShape {
  std::int64_t planes = 0, h = 0, w = 0, out_h = 0, out_w = 0;
  std::int64_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
};

// y = the window maxima, indices = their plane positions (one thread per output).
void max_pool2d_forward(cudaStream_t stream, const PoolShape& s, const float* x, float* y,
                        std::int32_t* indices);

// dx[i] = Σ dy[k] over the outputs k whose window covers i and whose index is i, added in
// increasing k: the CPU's order, so the result is the CPU's bit for bit. One thread per input
// element gathers from the windows covering it (no atomics); where windows do not overlap
// (stride >= kernel) one thread per output writes its window instead. An index that is no
// position of its window contributes nothing.
void max_pool2d_backward(cudaStream_t stream, const PoolShape& s, const float* dy,
                         const std::int32_t* indices, float* dx);

// The same without the window: one thread per plane walks its outputs in order, adding dy[k] at
// indices[k] (exact, but serial per plane: the slow path for callers that do not know the
// window). Indices outside [0, in_plane) are skipped; the op checks them first.
void max_pool2d_backward_scatter(cudaStream_t stream, std::int64_t planes, std::int64_t in_plane,
                                 std::int64_t out_plane, const float* dy,
                                 const std::int32_t* indices, float* dx);

// y = Σ window / (kh·kw), summed in window order as the CPU does.
void avg_pool2d_forward(cudaStream_t stream, const PoolShape& s, const float* x, float* y);

// dx[i] = Σ dy[k] · 1/(kh·kw) over the windows k covering i, in increasing k (gather).
void avg_pool2d_backward(cudaStream_t stream, const PoolShape& s, const float* dy, float* dx);

// y[p] = mean of plane p (summed in double, one warp per plane); dx = dy[p] / plane everywhere
// in plane p.
void global_avg_pool_forward(cudaStream_t stream, std::int64_t planes, std::int64_t plane,
                             const float* x, float* y);
void global_avg_pool_backward(cudaStream_t stream, std::int64_t planes, std::int64_t plane,
                              const float* dy, float* dx);

}  // namespace pipeline::kernels
