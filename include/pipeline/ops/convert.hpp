// Conversions between float32 and bfloat16: what moves on the wire when a pipeline transfers
// activations and gradients in bf16 (ExecutorOptions::transfer_dtype).
//
// bfloat16 keeps float32's sign and 8-bit exponent and the top 7 bits of its mantissa. float32 to
// bfloat16 rounds to nearest, ties to even; infinities stay infinite, a NaN stays a (quiet) NaN,
// and a finite value beyond bf16's range rounds to infinity as IEEE rounding does. bfloat16 to
// float32 is exact. bf16 elements are stored as their 16 bits (uint16_t). The CPU loop and the
// CUDA kernel do the same integer arithmetic, so they agree bit for bit.
#pragma once

#include <pipeline/core/tensor.hpp>

#include <bit>
#include <cstdint>

namespace pipeline::ops {

// x (float32 or bfloat16) as a new tensor of `dtype` (float32 or bfloat16) on x's device; x itself
// when it already has that dtype.
Tensor to_dtype(const Tensor& x, DType dtype);
// x converted into y (float32 and bfloat16 the other way round; as many elements, same device).
void to_dtype(const Tensor& x, Tensor& y);

// y (bfloat16) = compute(y32) rounded, y32 a new float32 tensor of y's shape and device: how an op
// writes a bf16 result where it has no kernel that rounds as it stores.
template <typename Compute>
void compute_rounded(Tensor& y, Compute&& compute) {
  Tensor y32 = Tensor::empty(y.shape(), DType::Float32, y.device());
  compute(y32);
  to_dtype(y32, y);
}

// One element, for the CPU loop and for tests.
constexpr std::uint16_t float_to_bf16(float f) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
  return static_cast<std::uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}
constexpr float bf16_to_float(std::uint16_t h) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

}  // namespace pipeline::ops
