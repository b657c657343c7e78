#include <pipeline/core/rng.hpp>
#include <pipeline/ops/dropout.hpp>

#include "cuda_dispatch.hpp"
#include "eigen_maps.hpp"

#include <cmath>

#if PIPELINE_WITH_CUDA
#include "dropout.cuh"
#endif

namespace pipeline::ops {

Tensor dropout_mask(const Shape& shape, float p, std::uint64_t seed, std::string_view key,
                    Device device) {
  PIPELINE_CHECK_AS(ConfigError, p >= 0.f && p <= 1.f,
                    "dropout probability must lie in [0, 1], got {}", p);
  Tensor mask = Tensor::empty(shape, DType::Float32, device);
  if (p == 0.f) {
    mask.fill(1.f);
    return mask;
  }
  if (p == 1.f) {
    mask.zero();
    return mask;
  }
  const float keep = 1.f / (1.f - p);
#if PIPELINE_WITH_CUDA
  if (device.is_cuda()) {
    const detail::CudaScope cuda(device);
    kernels::dropout_mask(cuda.stream(), mask.device_data<float>(), mask.numel(), p, keep,
                          seed ^ Rng::hash(key));
    return mask;
  }
#endif
  // Drawn serially: one generator step per element costs about a nanosecond, and a serial stream
  // is what keeps the mask independent of the thread count.
  Rng rng(seed, key);
  for (float& m : mask.values()) m = rng.uniform() < p ? 0.f : keep;
  return mask;
}

void apply_mask(const Tensor& x, const Tensor& mask, Tensor& y) {
  PIPELINE_CHECK(x.numel() == mask.numel() && y.numel() == x.numel(),
                 "dropout: input {}, mask {} and output {} must have the same size", x.shape(),
                 mask.shape(), y.shape());
#if PIPELINE_WITH_CUDA
  if (const Device d = detail::common_device("dropout", {&x, &mask, &y}); d.is_cuda()) {
    const detail::CudaScope cuda(d);
    kernels::apply_mask(cuda.stream(), x.device_data<float>(), mask.device_data<float>(),
                        y.device_data<float>(), x.numel());
    return;
  }
#endif
  detail::as_vector(y) = detail::as_vector(x).cwiseProduct(detail::as_vector(mask));
}

Tensor dropout(const Tensor& x, float p, std::uint64_t seed, std::string_view key, Tensor& mask) {
  mask = dropout_mask(x.shape(), p, seed, key, x.device());
  Tensor y = Tensor::empty(x.shape(), DType::Float32, x.device());
  apply_mask(x, mask, y);
  return y;
}

}  // namespace pipeline::ops
