// Launchers of the embedding kernels (embedding.cu). CPU reference and contract:
// include/pipeline/ops/embedding.hpp. ids are int32 device memory, already checked to lie in
// [0, vocab) (find_out_of_range_sync, check_range.cuh); tables and activations are row-major
// float32 device memory with `dim` columns. Asynchronous on `stream`; n == 0 launches nothing.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace pipeline::kernels {

// out[i, :] = table[ids[i], :] for i < n (a zero row for an id outside [0, vocab)).
void embedding_forward(cudaStream_t stream, const std::int32_t* ids, std::int64_t n,
                       const float* table, std::int64_t dim, std::int64_t vocab, float* out);

// Bytes of device workspace embedding_backward() needs for n ids of a vocabulary of `vocab`.
std::size_t embedding_backward_workspace_bytes(std::int64_t n, std::int64_t vocab);

// dtable[ids[i], :] += dout[i, :], repeated ids adding up in increasing i: bit for bit the CPU
// op's sums, with no atomics (ids are sorted stably with their positions, and each run of equal
// ids is summed in order); ids outside [0, vocab) add nothing. `workspace` holds
// embedding_backward_workspace_bytes(n, vocab) bytes. n < 2^31, dim <= 65535 · 128 (the op checks
// both).
void embedding_backward(cudaStream_t stream, const std::int32_t* ids, std::int64_t n,
                        const float* dout, std::int64_t dim, std::int64_t vocab, float* dtable,
                        void* workspace);

}  // namespace pipeline::kernels
