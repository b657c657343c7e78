#include <pipeline/ops/elementwise.hpp>

#include "cuda_dispatch.hpp"

#if PIPELINE_WITH_CUDA
#include "elementwise.cuh"
#endif

namespace pipeline::ops {

void add_in_place(Tensor& acc, const Tensor& x) {
  PIPELINE_CHECK(acc.numel() == x.numel(), "residual add of {} and {}: sizes differ", acc.shape(),
                 x.shape());
  PIPELINE_CHECK(acc.dtype() == DType::Float32 && x.dtype() == DType::Float32,
                 "add_in_place: expected float32 tensors, got {} and {}", dtype_name(acc.dtype()),
                 dtype_name(x.dtype()));
  const std::int64_t n = acc.numel();
#if PIPELINE_WITH_CUDA
  if (const Device d = detail::common_device("add_in_place", {&acc, &x}); d.is_cuda()) {
    const detail::CudaScope cuda(d);
    kernels::add_in_place(cuda.stream(), acc.device_data<float>(), x.device_data<float>(), n);
    return;
  }
#endif
  float* a = acc.data<float>();
  const float* b = x.data<float>();
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) a[i] += b[i];
}

}  // namespace pipeline::ops
