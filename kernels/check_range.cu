// Finds the first element of an int32 array outside [lo, hi) (labels of softmax cross-entropy,
// ids of an embedding). One block of 1024 threads strides over the array and reduces the
// smallest bad position with a block minimum, so the answer is the first bad element (as the
// CPU ops report it), not whichever thread got there first. Index arrays are small next to the
// activations they select (one per row), so a single block is enough and needs no second pass.
#include "check_range.cuh"
#include "common.cuh"

#include <pipeline/cuda/check.hpp>

#include <cstdint>
#include <limits>

namespace pipeline::kernels {

namespace {
constexpr int kCheckRangeThreads = 1024;
}

static __global__ __launch_bounds__(kCheckRangeThreads) void find_out_of_range_kernel(
    const std::int32_t* v, std::int64_t n, bool vec4, std::int32_t lo, std::int32_t hi,
    RangeViolation* out) {
  __shared__ long long scratch[detail::kWarp];
  constexpr long long kNone = std::numeric_limits<long long>::max();
  long long first = kNone;
  const auto bad = [&](std::int32_t x) { return x < lo || x >= hi; };
  // Each thread's positions increase, so its first bad one is its smallest. Eight loads (of four
  // values each where v is 16-byte aligned) are issued before any is tested: one block walks the
  // whole vector, so the time is load latency, not bandwidth, and 65536 labels take two rounds.
  constexpr int kUnroll = 8;
  const long long step = static_cast<long long>(blockDim.x);
  const long long n4 = vec4 ? n / 4 : 0;
  const auto* v4 = reinterpret_cast<const int4*>(v);
  for (long long base = threadIdx.x; base < n4 && first == kNone; base += kUnroll * step) {
    int4 x[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k)
      x[k] = base + k * step < n4 ? v4[base + k * step] : make_int4(lo, lo, lo, lo);
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const long long p = 4 * (base + k * step);
      if (first != kNone) break;
      if (bad(x[k].x))
        first = p;
      else if (bad(x[k].y))
        first = p + 1;
      else if (bad(x[k].z))
        first = p + 2;
      else if (bad(x[k].w))
        first = p + 3;
    }
  }
  // The rest (all of it when v is not aligned): positions past every vector one.
  for (long long base = 4 * n4 + threadIdx.x; base < n && first == kNone; base += kUnroll * step) {
    std::int32_t x[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) x[k] = base + k * step < n ? v[base + k * step] : lo;
#pragma unroll
    for (int k = 0; k < kUnroll; ++k)
      if (first == kNone && base + k * step < n && bad(x[k])) first = base + k * step;
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
  const bool vec4 = detail::aligned16(v);
  find_out_of_range_kernel<<<1, kCheckRangeThreads, 0, stream>>>(v, n < 0 ? 0 : n, vec4, lo, hi,
                                                                 out);
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
