// Dropout masks drawn on the GPU that are bit-for-bit the CPU's, and their application.
//
// The CPU op draws element i of the mask from the i-th output of one serial xoshiro256** stream
// (Rng(seed, key)), which keeps a mask independent of thread counts and ranks. To reproduce it in
// parallel, thread k generates draws [k · 1024, (k + 1) · 1024): it jumps the seeded state ahead
// by k · 1024 draws with precomputed GF(2) matrices (xoshiro_jump.cuh) and then steps serially,
// writing four mask values at a time. The jump costs a few thousand integer operations per thread,
// about as much as its 1024 draws, and needs no change to the CPU op's results.
//
// The jump tables (256 KiB) are built once per process on the host and copied once per device
// into a __device__ array, under a mutex, before the first mask on that device.
#include "common.cuh"
#include "dropout.cuh"
#include "xoshiro_jump.cuh"

#include <pipeline/cuda/check.hpp>

#include <mutex>
#include <vector>

namespace pipeline::kernels {

namespace {

constexpr int kDropoutThreads = 128;
constexpr std::size_t kTableWords =
    static_cast<std::size_t>(xoshiro::kLevels) * xoshiro::kWordsPerMatrix;

// One copy per device (module globals are per context), filled by ensure_jump_table().
__device__ std::uint64_t g_jump_table[kTableWords];

void ensure_jump_table() {
  static const std::vector<std::uint64_t> host = xoshiro::jump_table();
  static std::mutex mutex;
  static std::vector<bool> ready;
  int device = 0;
  PIPELINE_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  if (static_cast<std::size_t>(device) < ready.size() && ready[static_cast<std::size_t>(device)])
    return;
  PIPELINE_CUDA_CHECK(
      cudaMemcpyToSymbol(g_jump_table, host.data(), kTableWords * sizeof(std::uint64_t)));
  // Complete before any stream of this device (blocking or not) can launch a mask kernel.
  PIPELINE_CUDA_CHECK(cudaDeviceSynchronize());
  if (ready.size() <= static_cast<std::size_t>(device))
    ready.resize(static_cast<std::size_t>(device) + 1);
  ready[static_cast<std::size_t>(device)] = true;
}

}  // namespace

// `vec`: mask is 16-byte aligned, so groups of four (which start at multiples of 4 from the
// start, kJump being a multiple of 4) are stored as float4.
static __global__ __launch_bounds__(kDropoutThreads) void dropout_mask_kernel(
    float* mask, std::int64_t n, float p, float keep, std::uint64_t mixed_seed, bool vec) {
  const std::int64_t starts = (n + xoshiro::kJump - 1) / xoshiro::kJump;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const xoshiro::State seeded = xoshiro::seeded(mixed_seed);
  for (std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       k < starts; k += stride) {
    xoshiro::State st = xoshiro::jump(g_jump_table, seeded, static_cast<std::uint64_t>(k));
    const std::int64_t begin = k * xoshiro::kJump;
    const std::int64_t end = min(n, begin + xoshiro::kJump);
    for (std::int64_t i = begin; i < end; i += 4) {
      float v[4];
#pragma unroll
      for (int t = 0; t < 4; ++t) v[t] = xoshiro::uniform(st) < p ? 0.f : keep;
      if (vec && i + 4 <= end) {
        *reinterpret_cast<float4*>(mask + i) = make_float4(v[0], v[1], v[2], v[3]);
      } else {
        for (int t = 0; t < 4 && i + t < end; ++t) mask[i + t] = v[t];
      }
    }
  }
}

static __global__ void apply_mask_kernel(const float* x, const float* mask, float* y,
                                         std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    y[i] = x[i] * mask[i];
}

void dropout_mask(cudaStream_t stream, float* mask, std::int64_t n, float p, float keep,
                  std::uint64_t mixed_seed) {
  if (n <= 0) return;
  ensure_jump_table();
  const std::int64_t starts = (n + xoshiro::kJump - 1) / xoshiro::kJump;
  const bool vec = detail::aligned16(mask);
  dropout_mask_kernel<<<detail::grid_for(starts, kDropoutThreads), kDropoutThreads, 0, stream>>>(
      mask, n, p, keep, mixed_seed, vec);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

void apply_mask(cudaStream_t stream, const float* x, const float* mask, float* y, std::int64_t n) {
  if (n <= 0) return;
  constexpr int kApplyThreads = 256;
  apply_mask_kernel<<<detail::grid_for(n, kApplyThreads), kApplyThreads, 0, stream>>>(x, mask, y,
                                                                                      n);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

}  // namespace pipeline::kernels
