// float32 <-> bfloat16 (and float32 rounded to bf16 precision) in one grid-stride pass, with the
// integer rounding of the CPU op (round to nearest, ties to even; NaNs quieted), so both agree bit
// for bit.
#include "common.cuh"
#include "convert.cuh"

#include <pipeline/cuda/check.hpp>

#include <cstdint>

namespace pipeline::kernels {

namespace {

// The three conversions, one element each.
struct ToBf16 {
  using In = float;
  using Out = std::uint16_t;
  static __device__ Out one(float f) { return detail::to_bf16_bits(f); }
};
struct RoundToBf16 {
  using In = float;
  using Out = float;
  static __device__ Out one(float f) { return detail::widened(detail::to_bf16_bits(f)); }
};
struct ToFloat {
  using In = std::uint16_t;
  using Out = float;
  static __device__ Out one(std::uint16_t b) { return detail::widened(b); }
};

template <typename T>
bool four_aligned(const T* p) {
  return reinterpret_cast<std::uintptr_t>(p) % sizeof(detail::Four<T>) == 0;
}

// A memory-bound pass: with `vec` (both pointers four-element aligned) the first n / 4 · 4
// elements move four at a time, a quarter of the instructions and accesses per byte.
template <typename Op>
__global__ void convert_kernel(typename Op::Out* out, const typename Op::In* in, std::int64_t n,
                               bool vec) {
  using In = typename Op::In;
  using Out = typename Op::Out;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t tid = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t n4 = vec ? n / 4 : 0;
  for (std::int64_t i = tid; i < n4; i += stride) {
    const detail::Four<In> x = reinterpret_cast<const detail::Four<In>*>(in)[i];
    detail::Four<Out> y;
#pragma unroll
    for (int j = 0; j < 4; ++j) y.v[j] = Op::one(x.v[j]);
    reinterpret_cast<detail::Four<Out>*>(out)[i] = y;
  }
  for (std::int64_t i = n4 * 4 + tid; i < n; i += stride) out[i] = Op::one(in[i]);
}

template <typename Op>
void convert(cudaStream_t stream, typename Op::Out* out, const typename Op::In* in,
             std::int64_t n) {
  if (n <= 0) return;
  constexpr int kThreads = 256;
  const bool vec = four_aligned(in) && four_aligned(out);
  convert_kernel<Op>
      <<<detail::grid_for(vec ? (n + 3) / 4 : n, kThreads), kThreads, 0, stream>>>(out, in, n, vec);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

}  // namespace

void float_to_bf16(cudaStream_t stream, std::uint16_t* out, const float* in, std::int64_t n) {
  convert<ToBf16>(stream, out, in, n);
}

void round_to_bf16(cudaStream_t stream, float* out, const float* in, std::int64_t n) {
  convert<RoundToBf16>(stream, out, in, n);
}

void bf16_to_float(cudaStream_t stream, float* out, const std::uint16_t* in, std::int64_t n) {
  convert<ToFloat>(stream, out, in, n);
}

}  // namespace pipeline::kernels
