#include <pipeline/ops/convert.hpp>

#include "cuda_dispatch.hpp"

#if PIPELINE_WITH_CUDA
#include "convert.cuh"
#endif

namespace pipeline::ops {

Tensor to_dtype(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  Tensor y = Tensor::empty(x.shape(), dtype, x.device());
  to_dtype(x, y);
  return y;
}

void to_dtype(const Tensor& x, Tensor& y) {
  const auto supported = [](DType t) { return t == DType::Float32 || t == DType::BFloat16; };
  PIPELINE_CHECK(supported(x.dtype()) && supported(y.dtype()),
                 "to_dtype: converts between float32 and bfloat16, not {} to {}",
                 dtype_name(x.dtype()), dtype_name(y.dtype()));
  PIPELINE_CHECK(x.numel() == y.numel() && x.device() == y.device(),
                 "to_dtype: the output is {} on {}, the input {} on {}", y.shape(),
                 y.device().str(), x.shape(), x.device().str());
  const std::int64_t n = x.numel();
  PIPELINE_CHECK(x.dtype() != y.dtype(), "to_dtype: both tensors are {}; copy instead",
                 dtype_name(x.dtype()));
  const bool narrow = y.dtype() == DType::BFloat16;
#if PIPELINE_WITH_CUDA
  if (x.device().is_cuda()) {
    const detail::CudaScope cuda(x.device());
    if (narrow)
      kernels::float_to_bf16(cuda.stream(), y.device_data<std::uint16_t>(),
                             x.device_data<float>(), n);
    else
      kernels::bf16_to_float(cuda.stream(), y.device_data<float>(),
                             x.device_data<std::uint16_t>(), n);
    return;
  }
#endif
  if (narrow) {
    const float* in = x.data<float>();
    std::uint16_t* out = y.data<std::uint16_t>();
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) out[i] = float_to_bf16(in[i]);
  } else {
    const std::uint16_t* in = x.data<std::uint16_t>();
    float* out = y.data<float>();
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(in[i]);
  }
}

}  // namespace pipeline::ops
