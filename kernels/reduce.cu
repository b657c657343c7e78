// The deterministic column reductions (reduce.cuh). One kernel does both passes: a block takes 32
// columns of one chunk of rows; its 8 row lanes each sum every 8th row of the chunk (four
// independent sums, so four loads are in flight per thread: a fused layer norm backward leaves
// 1536 chunks to finish), and lane 0 adds the 8 lane sums in order, so the result depends only
// on (rows, cols, split), never on scheduling. Reads the matrix once, coalesced across the 32
// columns of a warp. column_sums runs it over the rows in chunks, then over the [chunks, cols]
// partials as one chunk, adding into the output.
#include "common.cuh"
#include "reduce.cuh"

#include <pipeline/cuda/check.hpp>

namespace pipeline::kernels {

// Column sums of rows [blockIdx.y · rows_per_chunk, +rows_per_chunk) for the 32 columns of
// blockIdx.x: into partials[blockIdx.y, c] when partials is set, else added to out[c].
static __global__ void column_sums_kernel(const float* x, std::int64_t rows, std::int64_t cols,
                                          std::int64_t rows_per_chunk, float* partials,
                                          float* out) {
  constexpr int kLanes = kColumnBlockLanes;
  __shared__ float lanes[kLanes][kColumnBlockColumns + 1];
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * kColumnBlockColumns + threadIdx.x;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * rows_per_chunk;
  const std::int64_t r1 = min(rows, r0 + rows_per_chunk);
  float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
  if (c < cols) {
    std::int64_t r = r0 + threadIdx.y;
    for (; r + 3 * kLanes < r1; r += 4 * kLanes) {
      a0 += x[r * cols + c];
      a1 += x[(r + kLanes) * cols + c];
      a2 += x[(r + 2 * kLanes) * cols + c];
      a3 += x[(r + 3 * kLanes) * cols + c];
    }
    for (; r < r1; r += kLanes) a0 += x[r * cols + c];
  }
  lanes[threadIdx.y][threadIdx.x] = (a0 + a1) + (a2 + a3);
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float s = lanes[0][threadIdx.x];
#pragma unroll
    for (int k = 1; k < kLanes; ++k) s += lanes[k][threadIdx.x];
    if (partials)
      partials[static_cast<std::int64_t>(blockIdx.y) * cols + c] = s;
    else
      out[c] += s;
  }
}

namespace {
void launch_column_sums(cudaStream_t stream, const float* x, std::int64_t rows, std::int64_t cols,
                        std::int64_t rows_per_chunk, std::int64_t chunks, float* partials,
                        float* out) {
  const dim3 grid(static_cast<unsigned>((cols + kColumnBlockColumns - 1) / kColumnBlockColumns),
                  static_cast<unsigned>(chunks));
  column_sums_kernel<<<grid, dim3(kColumnBlockColumns, kColumnBlockLanes), 0, stream>>>(
      x, rows, cols, rows_per_chunk, partials, out);
  PIPELINE_CUDA_LAUNCH_CHECK();
}
}  // namespace

void column_sums(cudaStream_t stream, const float* x, std::int64_t rows, std::int64_t cols,
                 float* workspace, float* out) {
  const ColumnSplit split = column_split(rows, cols);
  if (split.chunks == 0) return;
  if (split.chunks == 1) {
    launch_column_sums(stream, x, rows, cols, rows, 1, nullptr, out);
    return;
  }
  launch_column_sums(stream, x, rows, cols, split.rows_per_chunk, split.chunks, workspace, nullptr);
  column_partials_finish(stream, workspace, split.chunks, cols, out);
}

void column_partials_finish(cudaStream_t stream, const float* partials, std::int64_t chunks,
                            std::int64_t cols, float* out) {
  if (chunks <= 0 || cols <= 0) return;
  // The partials as one chunk of `chunks` rows.
  launch_column_sums(stream, partials, chunks, cols, chunks, 1, nullptr, out);
}

}  // namespace pipeline::kernels
