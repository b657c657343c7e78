// Finds the first element of an int32 array outside [lo, hi) (labels of softmax cross-entropy,
// ids of an embedding). One block of 1024 threads strides over the array and reduces the
// smallest bad position with a block minimum, so the answer is the first bad element (as the
// CPU ops report it), not whichever thread got there first. Index arrays are small next to the
// activations they select (one per row), so a single block is enough and needs no second pass.
#include "check_range.cuh"
#include "common.cuh"

#include <pipeline/cuda/check.hpp>

#include <limits>

namespace pipeline::kernels {

namespace {
constexpr int kThreads = 1024;
}

static __global__ __launch_bounds__(kThreads) void find_out_of_range_kernel(
    const std::int32_t* v, std::int64_t n, std::int32_t lo, std::int32_t hi, RangeViolation* out) {
  __shared__ long long scratch[detail::kWarp];
  constexpr long long kNone = std::numeric_limits<long long>::max();
  long long first = kNone;
  // Each thread's positions increase, so its first bad one is its smallest. Eight loads are
  // issued before any is tested (one block walks the whole vector: latency, not bandwidth).
  constexpr int kUnroll = 8;
  const long long step = static_cast<long long>(blockDim.x);
  for (long long base = threadIdx.x; base < n && first == kNone; base += kUnroll * step) {
    std::int32_t x[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) x[k] = base + k * step < n ? v[base + k * step] : lo;
#pragma unroll
    for (int k = 0; k < kUnroll; ++k)
      if (first == kNone && base + k * step < n && (x[k] < lo || x[k] >= hi))
        first = base + k * step;
  }
  first = detail::block_min(first, scratch, kNone);
  if (threadIdx.x == 0) {
    out->index = first == kNone ? -1 : first;
    out->value = first == kNone ? 0 : v[first];
  }
}

void find_out_of_range(cudaStream_t stream, const std::int32_t* v, std::int64_t n, std::int32_t lo,
                       std::int32_t hi, RangeViolation* out) {
  // Launched even for n == 0, so that *out always says "none" afterwards.
  find_out_of_range_kernel<<<1, kThreads, 0, stream>>>(v, n < 0 ? 0 : n, lo, hi, out);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

RangeViolation find_out_of_range_sync(cudaStream_t stream, const std::int32_t* v, std::int64_t n,
                                      std::int32_t lo, std::int32_t hi, RangeViolation* scratch) {
  RangeViolation result;
  if (n <= 0) return result;
  find_out_of_range(stream, v, n, lo, hi, scratch);
  PIPELINE_CUDA_CHECK(
      cudaMemcpyAsync(&result, scratch, sizeof(result), cudaMemcpyDeviceToHost, stream));
  PIPELINE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return result;
}

}  // namespace pipeline::kernels
