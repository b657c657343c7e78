#include <pipeline/ops/convert.hpp>

#include "cuda_dispatch.hpp"

#if PIPELINE_WITH_CUDA
#include "convert.cuh"
#endif

namespace pipeline::ops {

Tensor to_dtype(const Tensor& x, DType dtype) {
  const auto supported = [](DType t) { return t == DType::Float32 || t == DType::BFloat16; };
  PIPELINE_CHECK(supported(x.dtype()) && supported(dtype),
                 "to_dtype: converts between float32 and bfloat16, not {} to {}",
                 dtype_name(x.dtype()), dtype_name(dtype));
  if (x.dtype() == dtype) return x;
  Tensor y = Tensor::empty(x.shape(), dtype, x.device());
  const std::int64_t n = x.numel();
  const bool narrow = dtype == DType::BFloat16;
#if PIPELINE_WITH_CUDA
  if (x.device().is_cuda()) {
    const detail::CudaScope cuda(x.device());
    if (narrow)
      kernels::float_to_bf16(cuda.stream(), y.device_data<std::uint16_t>(),
                             x.device_data<float>(), n);
    else
      kernels::bf16_to_float(cuda.stream(), y.device_data<float>(),
                             x.device_data<std::uint16_t>(), n);
    return y;
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
  return y;
}

}  // namespace pipeline::ops
