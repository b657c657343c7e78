// Second pass of the deterministic column reductions (reduce.cuh): adds the per-chunk column sums
// of the first pass into the output in an order fixed by (chunks, cols) alone, so the result does
// not depend on scheduling. A block takes 32 columns; its 8 row lanes each sum every 8th chunk
// (four independent sums, so four loads are in flight per thread: a fused layer norm backward
// leaves 1536 chunks), and lane 0 adds the 8 lane sums in order. Reads chunks × cols floats
// once, coalesced across the 32 columns of a warp.
#include "common.cuh"
#include "reduce.cuh"

#include <pipeline/cuda/check.hpp>

namespace pipeline::kernels {

namespace {
constexpr int kColumns = 32;  // threadIdx.x
constexpr int kLanes = 8;     // threadIdx.y
}  // namespace

static __global__ void column_partials_finish_kernel(const float* partials, std::int64_t chunks,
                                                     std::int64_t cols, float* out) {
  __shared__ float lanes[kLanes][kColumns + 1];
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * kColumns + threadIdx.x;
  float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
  if (c < cols) {
    std::int64_t k = threadIdx.y;
    for (; k + 3 * kLanes < chunks; k += 4 * kLanes) {
      a0 += partials[k * cols + c];
      a1 += partials[(k + kLanes) * cols + c];
      a2 += partials[(k + 2 * kLanes) * cols + c];
      a3 += partials[(k + 3 * kLanes) * cols + c];
    }
    for (; k < chunks; k += kLanes) a0 += partials[k * cols + c];
  }
  lanes[threadIdx.y][threadIdx.x] = (a0 + a1) + (a2 + a3);
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float s = lanes[0][threadIdx.x];
#pragma unroll
    for (int y = 1; y < kLanes; ++y) s += lanes[y][threadIdx.x];
    out[c] += s;
  }
}

void column_partials_finish(cudaStream_t stream, const float* partials, std::int64_t chunks,
                            std::int64_t cols, float* out) {
  if (chunks <= 0 || cols <= 0) return;
  const auto blocks = static_cast<unsigned>((cols + kColumns - 1) / kColumns);
  column_partials_finish_kernel<<<blocks, dim3(kColumns, kLanes), 0, stream>>>(partials, chunks,
                                                                               cols, out);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

}  // namespace pipeline::kernels
