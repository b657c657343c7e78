// Device-side building blocks shared by the kernels in this folder: warp and block reductions,
// grid sizing, alignment. Included only by .cu files (it holds __device__ code); launchers are
// declared in each kernel's own .cuh.
//
// Reductions here are deterministic: the order in which values are combined depends only on the
// block size and the thread that holds each value, never on timing, so the same input on the
// same launch configuration gives the same bits on every run.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace pipeline::kernels::detail {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarp = 32;
// Grid-stride kernels never launch more blocks than this: enough to fill any current GPU many
// times over, and well below every grid limit.
constexpr std::int64_t kMaxGridBlocks = 1 << 16;

// Blocks of `threads` for `work` items, each thread taking at least one, capped at
// kMaxGridBlocks (the kernel then strides).
inline unsigned grid_for(std::int64_t work, int threads) {
  const std::int64_t blocks = (work + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<std::int64_t>(blocks, 1, kMaxGridBlocks));
}

// Whether float4 loads and stores may be used at p.
inline bool aligned16(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

// float32 to bf16 bits: round to nearest, ties to even, NaNs quieted; the CPU's
// ops::float_to_bf16 integer for integer, so both agree bit for bit.
__device__ __forceinline__ std::uint16_t to_bf16_bits(float f) {
  const std::uint32_t bits = __float_as_uint(f);
  return (bits & 0x7fffffffu) > 0x7f800000u
             ? static_cast<std::uint16_t>((bits >> 16) | 0x0040u)
             : static_cast<std::uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// bf16 bits widened to float32 (exact); a float32 value as it is (for kernels templated on both).
__device__ __forceinline__ float widened(std::uint16_t b) {
  return __uint_as_float(static_cast<std::uint32_t>(b) << 16);
}
__device__ __forceinline__ float widened(float x) {
  return x;
}

// A float32 result stored as Out: float32 as it is, bf16 (std::uint16_t) rounded.
__device__ __forceinline__ void store_as(float* p, float v) {
  *p = v;
}
__device__ __forceinline__ void store_as(std::uint16_t* p, float v) {
  *p = to_bf16_bits(v);
}

// Four results as one aligned store (16 bytes of float, 8 of bf16).
__device__ __forceinline__ void store4_as(float* p, float4 v) {
  *reinterpret_cast<float4*>(p) = v;
}
__device__ __forceinline__ void store4_as(std::uint16_t* p, float4 v) {
  uint2 w;
  w.x = static_cast<std::uint32_t>(to_bf16_bits(v.x)) |
        static_cast<std::uint32_t>(to_bf16_bits(v.y)) << 16;
  w.y = static_cast<std::uint32_t>(to_bf16_bits(v.z)) |
        static_cast<std::uint32_t>(to_bf16_bits(v.w)) << 16;
  *reinterpret_cast<uint2*>(p) = w;
}

// Four elements as one aligned access (16 bytes of float, 8 of bf16).
template <typename T>
struct alignas(4 * sizeof(T)) Four {
  T v[4];
};

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

template <typename T>
__device__ __forceinline__ T warp_max(T v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset >>= 1)
    v = max(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

template <typename T>
__device__ __forceinline__ T warp_min(T v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset >>= 1)
    v = min(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// Sum over the block; every thread gets the total. blockDim.x must be a multiple of 32 (every
// launcher here guarantees it) and every thread of the block must call it. `scratch` holds at
// least 32 values; it may be reused by the next call (the leading barrier protects it).
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* scratch) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : T(0);
  return warp_sum(v);
}

template <typename T>
__device__ __forceinline__ T block_max(T v, T* scratch, T lowest) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : lowest;
  return warp_max(v);
}

template <typename T>
__device__ __forceinline__ T block_min(T v, T* scratch, T highest) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  v = warp_min(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : highest;
  return warp_min(v);
}

}  // namespace pipeline::kernels::detail
