// Deterministic column reductions of row-major [rows, cols] matrices: Σ over rows, per column.
//
// Bias gradients, layer norm's weight/bias gradients and the positional table's gradient all sum
// a tall matrix over its rows. The kernels that do it split the rows into `chunks` consecutive
// blocks of `rows_per_chunk`; each chunk's column sums go to a [chunks, cols] float workspace,
// and column_partials_finish() adds the chunks up (as any column sum: interleaved over 8 lanes of
// four accumulators, reduce.cu). The split and the order depend only on (rows, cols), never on the
// device or on scheduling, so a result is the same bits on every run and every GPU.
// With one chunk no workspace is needed and the first pass adds into the output directly.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace pipeline::kernels {

// A column-sum block: 32 columns (threadIdx.x: a warp reads a coalesced 128-byte row segment) by
// 8 row lanes (threadIdx.y).
constexpr int kColumnBlockColumns = 32;
constexpr int kColumnBlockLanes = 8;

struct ColumnSplit {
  std::int64_t chunks = 0;          // row blocks (gridDim.y of the first pass; <= 65535)
  std::int64_t rows_per_chunk = 0;  // rows of every chunk but the last
  // float32 elements of workspace the two passes need (0: one chunk, no workspace).
  std::int64_t workspace_floats(std::int64_t cols) const { return chunks > 1 ? chunks * cols : 0; }
};

// The split for a [rows, cols] reduction: about 1024 blocks of 32 columns in all, at least 64
// rows per chunk. rows == 0 or cols == 0 gives no chunks (nothing to do).
inline ColumnSplit column_split(std::int64_t rows, std::int64_t cols) {
  if (rows <= 0 || cols <= 0) return {};
  constexpr std::int64_t kTargetBlocks = 1024, kMinRowsPerChunk = 64, kMaxChunks = 65535;
  const std::int64_t column_blocks = (cols + kColumnBlockColumns - 1) / kColumnBlockColumns;
  const std::int64_t wanted = std::max<std::int64_t>(1, kTargetBlocks / column_blocks);
  const std::int64_t by_rows = (rows + kMinRowsPerChunk - 1) / kMinRowsPerChunk;
  std::int64_t chunks = std::min({wanted, by_rows, kMaxChunks});
  const std::int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
  chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
  return {chunks, rows_per_chunk};
}

// out[c] += Σ_r x[r, c], deterministic: the rows split by column_split(rows, cols), each chunk's
// column sums into `workspace` (column_split(rows, cols).workspace_floats(cols) floats; null when
// that is 0), then column_partials_finish(). Asynchronous on `stream`.
void column_sums(cudaStream_t stream, const float* x, std::int64_t rows, std::int64_t cols,
                 float* workspace, float* out);

// out[c] += Σ_{k < chunks} partials[k * cols + c], in an order fixed by (chunks, cols).
// Asynchronous on `stream`.
void column_partials_finish(cudaStream_t stream, const float* partials, std::int64_t chunks,
                            std::int64_t cols, float* out);

}  // namespace pipeline::kernels
