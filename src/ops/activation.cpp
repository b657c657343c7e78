#include <pipeline/ops/activation.hpp>
#include <pipeline/ops/convert.hpp>

#include "../core/parallel.hpp"
#include "cuda_dispatch.hpp"
#include "eigen_maps.hpp"

#include <unsupported/Eigen/SpecialFunctions>

#include <algorithm>
#include <cmath>
#include <numbers>

#if PIPELINE_WITH_CUDA
#include "activation.cuh"
#endif

namespace pipeline::ops {

namespace {

using ArrayMap = Eigen::Map<Eigen::ArrayXf, Eigen::Unaligned>;
using ConstArrayMap = Eigen::Map<const Eigen::ArrayXf, Eigen::Unaligned>;

// Each thread gets at least this many elements: below, waking it costs more than it saves (with
// every thread on a 64 x 1024 activation, each of 16 threads had 4096 elements). Pieces are
// multiples of 64 floats, so each starts on a cache line relative to the tensor and vectorises
// without a scalar head.
constexpr std::int64_t kMinPiece = 1 << 14;
constexpr std::int64_t kPieceAlign = 64;

void check_same_size(const char* what, const Tensor& a, const Tensor& b) {
  PIPELINE_CHECK(a.numel() == b.numel(), "{}: tensors of shapes {} and {} differ in size", what,
                 a.shape(), b.shape());
}

#if PIPELINE_WITH_CUDA
kernels::ActivationKind kernel_kind(Activation a) {
  switch (a) {
    case Activation::ReLU:
      return kernels::ActivationKind::ReLU;
    case Activation::GELU:
      return kernels::ActivationKind::GELU;
    case Activation::Tanh:
      return kernels::ActivationKind::Tanh;
    case Activation::Sigmoid:
      return kernels::ActivationKind::Sigmoid;
  }
  PIPELINE_FAIL(Error, "activation {} has no CUDA kernel", static_cast<int>(a));
}
#endif

}  // namespace

std::string_view activation_name(Activation a) {
  switch (a) {
    case Activation::ReLU:
      return "ReLU";
    case Activation::GELU:
      return "GELU";
    case Activation::Tanh:
      return "Tanh";
    case Activation::Sigmoid:
      return "Sigmoid";
  }
  return "?";
}

void activation_forward(Activation a, const Tensor& x, Tensor& y) {
  check_same_size("activation_forward", x, y);
  const bool bf16 = y.dtype() == DType::BFloat16;
#if PIPELINE_WITH_CUDA
  if (const Device d = detail::common_device("activation_forward", {&x, &y}); d.is_cuda()) {
    const detail::CudaScope cuda(d);
    if (bf16)
      kernels::activation_forward_bf16(cuda.stream(), kernel_kind(a), x.device_data<float>(),
                                       y.device_data<std::uint16_t>(), x.numel());
    else
      kernels::activation_forward(cuda.stream(), kernel_kind(a), x.device_data<float>(),
                                  y.device_data<float>(), x.numel());
    return;
  }
#endif
  if (bf16) return compute_rounded(y, [&](Tensor& y32) { activation_forward(a, x, y32); });
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  pipeline::detail::for_each_piece(
      x.numel(), kMinPiece, kPieceAlign, [&](std::int64_t b, std::int64_t n) {
        ConstArrayMap X(xp + b, n);
        ArrayMap Y(yp + b, n);
        switch (a) {
          case Activation::ReLU:
            Y = X.max(0.f);
            break;
          case Activation::GELU:
            Y = 0.5f * X * (1.f + (X * static_cast<float>(std::numbers::sqrt2 / 2)).erf());
            break;
          case Activation::Tanh:
            Y = X.tanh();
            break;
          // 1 / (1 + e^{-x}) overflows e^{-x} to inf for x < -88, which still gives the right 0.
          case Activation::Sigmoid:
            Y = 1.f / (1.f + (-X).exp());
            break;
        }
      });
}

void activation_backward(Activation a, const Tensor& saved, const Tensor& dy, Tensor& dx) {
  check_same_size("activation_backward", saved, dy);
  check_same_size("activation_backward", dy, dx);
#if PIPELINE_WITH_CUDA
  if (const Device d = detail::common_device("activation_backward", {&saved, &dy, &dx});
      d.is_cuda()) {
    const detail::CudaScope cuda(d);
    kernels::activation_backward(cuda.stream(), kernel_kind(a), saved.device_data<float>(),
                                 dy.device_data<float>(), dx.device_data<float>(), dy.numel());
    return;
  }
#endif
  const float* sp = saved.data<float>();
  const float* gp = dy.data<float>();
  float* dp = dx.data<float>();
  pipeline::detail::for_each_piece(
      dy.numel(), kMinPiece, kPieceAlign, [&](std::int64_t b, std::int64_t n) {
        ConstArrayMap S(sp + b, n), G(gp + b, n);
        ArrayMap D(dp + b, n);
        switch (a) {
          case Activation::ReLU:
            D = (S > 0.f).select(G, 0.f);
            break;
          case Activation::GELU: {
            // d/dx [x Φ(x)] = Φ(x) + x φ(x)
            constexpr float inv_sqrt2 = static_cast<float>(std::numbers::sqrt2 / 2);
            constexpr float inv_sqrt_2pi =
                static_cast<float>(std::numbers::inv_sqrtpi * std::numbers::sqrt2 / 2);
            D = G * (0.5f * (1.f + (S * inv_sqrt2).erf()) +
                     S * inv_sqrt_2pi * (-0.5f * S.square()).exp());
            break;
          }
          case Activation::Tanh:
            D = G * (1.f - S.square());
            break;
          case Activation::Sigmoid:
            D = G * S * (1.f - S);
            break;
        }
      });
}

Tensor activation_forward(Activation a, const Tensor& x) {
  Tensor y = Tensor::empty(x.shape(), DType::Float32, x.device());
  activation_forward(a, x, y);
  return y;
}

Tensor activation_backward(Activation a, const Tensor& saved, const Tensor& dy) {
  Tensor dx = Tensor::empty(dy.shape(), DType::Float32, dy.device());
  activation_backward(a, saved, dy, dx);
  return dx;
}

}  // namespace pipeline::ops
