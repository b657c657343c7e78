// Element-wise activations and their gradients: ReLU, GELU (exact, erf-based), tanh, sigmoid.
//
// Each is one memory-bound pass: forward reads x and writes y, backward reads the saved tensor and
// dy and writes dx. The formulas are written term for term as the CPU op's Eigen expressions
// (src/ops/activation.cpp), which is the oracle of tests/gpu/test_activation.cpp; only the erf,
// exp and tanh implementations (CUDA's versus Eigen's, each within a few ulp) and FMA contraction
// differ. When every pointer is 16-byte aligned the body moves float4s (one 128-bit load or
// store per operand per thread), with a scalar tail for the last n % 4 elements; views at an odd
// offset take the scalar loop throughout.
#include "activation.cuh"
#include "common.cuh"

#include <pipeline/cuda/check.hpp>

#include <numbers>

namespace pipeline::kernels {

namespace {

constexpr int kActivationThreads = 256;
constexpr float kInvSqrt2 = static_cast<float>(std::numbers::sqrt2 / 2);
constexpr float kInvSqrt2Pi =
    static_cast<float>(std::numbers::inv_sqrtpi * std::numbers::sqrt2 / 2);

template <ActivationKind K>
__device__ __forceinline__ float forward_one(float x) {
  if constexpr (K == ActivationKind::ReLU) {
    return x > 0.f ? x : 0.f;
  } else if constexpr (K == ActivationKind::GELU) {
    return 0.5f * x * (1.f + erff(x * kInvSqrt2));
  } else if constexpr (K == ActivationKind::Tanh) {
    return tanhf(x);
  } else {
    // 1 / (1 + e^{-x}): e^{-x} overflows to inf for x < -88, which still gives the right 0.
    return 1.f / (1.f + expf(-x));
  }
}

// s is the forward input (ReLU, GELU) or output (tanh, sigmoid), g the output gradient.
template <ActivationKind K>
__device__ __forceinline__ float backward_one(float s, float g) {
  if constexpr (K == ActivationKind::ReLU) {
    return s > 0.f ? g : 0.f;
  } else if constexpr (K == ActivationKind::GELU) {
    // d/dx [x Φ(x)] = Φ(x) + x φ(x)
    return g * (0.5f * (1.f + erff(s * kInvSqrt2)) + s * kInvSqrt2Pi * expf(-0.5f * (s * s)));
  } else if constexpr (K == ActivationKind::Tanh) {
    return g * (1.f - s * s);
  } else {
    return g * s * (1.f - s);
  }
}

}  // namespace

// `vec`: all pointers are 16-byte aligned, so the first n / 4 * 4 elements move as float4. Out:
// float, or std::uint16_t for y in bf16 (rounded as it is stored).
template <ActivationKind K, typename Out>
static __global__ void activation_forward_kernel(const float* x, Out* y, std::int64_t n, bool vec) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t tid = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t n4 = vec ? n / 4 : 0;
  for (std::int64_t i = tid; i < n4; i += stride) {
    const float4 v = reinterpret_cast<const float4*>(x)[i];
    detail::store4_as(y + 4 * i, make_float4(forward_one<K>(v.x), forward_one<K>(v.y),
                                             forward_one<K>(v.z), forward_one<K>(v.w)));
  }
  for (std::int64_t i = n4 * 4 + tid; i < n; i += stride)
    detail::store_as(y + i, forward_one<K>(x[i]));
}

template <ActivationKind K>
static __global__ void activation_backward_kernel(const float* s, const float* g, float* d,
                                                  std::int64_t n, bool vec) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t tid = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t n4 = vec ? n / 4 : 0;
  for (std::int64_t i = tid; i < n4; i += stride) {
    const float4 sv = reinterpret_cast<const float4*>(s)[i];
    const float4 gv = reinterpret_cast<const float4*>(g)[i];
    reinterpret_cast<float4*>(d)[i] =
        make_float4(backward_one<K>(sv.x, gv.x), backward_one<K>(sv.y, gv.y),
                    backward_one<K>(sv.z, gv.z), backward_one<K>(sv.w, gv.w));
  }
  for (std::int64_t i = n4 * 4 + tid; i < n; i += stride) d[i] = backward_one<K>(s[i], g[i]);
}

namespace {

template <ActivationKind K, typename Out>
void launch_forward(cudaStream_t stream, const float* x, Out* y, std::int64_t n) {
  const bool vec =
      detail::aligned16(x) && reinterpret_cast<std::uintptr_t>(y) % (4 * sizeof(Out)) == 0;
  const unsigned blocks = detail::grid_for(vec ? (n + 3) / 4 : n, kActivationThreads);
  activation_forward_kernel<K, Out><<<blocks, kActivationThreads, 0, stream>>>(x, y, n, vec);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

template <typename Out>
void forward_any(cudaStream_t stream, ActivationKind kind, const float* x, Out* y, std::int64_t n) {
  if (n <= 0) return;
  switch (kind) {
    case ActivationKind::ReLU:
      return launch_forward<ActivationKind::ReLU>(stream, x, y, n);
    case ActivationKind::GELU:
      return launch_forward<ActivationKind::GELU>(stream, x, y, n);
    case ActivationKind::Tanh:
      return launch_forward<ActivationKind::Tanh>(stream, x, y, n);
    case ActivationKind::Sigmoid:
      return launch_forward<ActivationKind::Sigmoid>(stream, x, y, n);
  }
}

template <ActivationKind K>
void launch_backward(cudaStream_t stream, const float* s, const float* g, float* d,
                     std::int64_t n) {
  const bool vec = detail::aligned16(s) && detail::aligned16(g) && detail::aligned16(d);
  const unsigned blocks = detail::grid_for(vec ? (n + 3) / 4 : n, kActivationThreads);
  activation_backward_kernel<K><<<blocks, kActivationThreads, 0, stream>>>(s, g, d, n, vec);
  PIPELINE_CUDA_LAUNCH_CHECK();
}

}  // namespace

void activation_forward(cudaStream_t stream, ActivationKind kind, const float* x, float* y,
                        std::int64_t n) {
  forward_any(stream, kind, x, y, n);
}

void activation_forward_bf16(cudaStream_t stream, ActivationKind kind, const float* x,
                             std::uint16_t* y, std::int64_t n) {
  forward_any(stream, kind, x, y, n);
}

void activation_backward(cudaStream_t stream, ActivationKind kind, const float* saved,
                         const float* dy, float* dx, std::int64_t n) {
  if (n <= 0) return;
  switch (kind) {
    case ActivationKind::ReLU:
      return launch_backward<ActivationKind::ReLU>(stream, saved, dy, dx, n);
    case ActivationKind::GELU:
      return launch_backward<ActivationKind::GELU>(stream, saved, dy, dx, n);
    case ActivationKind::Tanh:
      return launch_backward<ActivationKind::Tanh>(stream, saved, dy, dx, n);
    case ActivationKind::Sigmoid:
      return launch_backward<ActivationKind::Sigmoid>(stream, saved, dy, dx, n);
  }
}

}  // namespace pipeline::kernels
