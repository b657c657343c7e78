// float32 <-> bfloat16 (and float32 rounded to bf16 precision) in one grid-stride pass, with the
// integer rounding of the CPU op (round to nearest, ties to even; NaNs quieted), so both agree bit
// for bit.
#include "common.cuh"
#include "convert.cuh"

#include <pipeline/cuda/check.hpp>

namespace pipeline::kernels {

static __device__ std::uint16_t to_bf16_bits(float f) {
  const std::uint32_t bits = __float_as_uint(f);
  return (bits & 0x7fffffffu) > 0x7f800000u
             ? static_cast<std::uint16_t>((bits >> 16) | 0x0040u)
             : static_cast<std::uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

static __global__ void float_to_bf16_kernel(std::uint16_t* out, const float* in, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    out[i] = to_bf16_bits(in[i]);
}

static __global__ void round_to_bf16_kernel(float* out, const float* in, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    out[i] = __uint_as_float(static_cast<std::uint32_t>(to_bf16_bits(in[i])) << 16);
}

static __global__ void bf16_to_float_kernel(float* out, const std::uint16_t* in, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    out[i] = __uint_as_float(static_cast<std::uint32_t>(in[i]) << 16);
}

void float_to_bf16(cudaStream_t stream, std::uint16_t* out, const float* in, std::int64_t n) {
  if (n <= 0) return;
  constexpr int kThreads = 256;
  float_to_bf16_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(out, in, n);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

void round_to_bf16(cudaStream_t stream, float* out, const float* in, std::int64_t n) {
  if (n <= 0) return;
  constexpr int kThreads = 256;
  round_to_bf16_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(out, in, n);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

void bf16_to_float(cudaStream_t stream, float* out, const std::uint16_t* in, std::int64_t n) {
  if (n <= 0) return;
  constexpr int kThreads = 256;
  bf16_to_float_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, stream>>>(out, in, n);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

}  // namespace pipeline::kernels
