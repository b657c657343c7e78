#include <pipeline/ops/bias.hpp>

#include "cuda_dispatch.hpp"
#include "eigen_maps.hpp"

#if PIPELINE_WITH_CUDA
#include "bias.cuh"
#endif

namespace pipeline::ops {

using detail::as_matrix;

void add_bias(Tensor& y, const Tensor& bias) {
  const std::int64_t f = bias.numel();
  PIPELINE_CHECK(f > 0 && y.numel() % f == 0 && y.dim(-1) == f,
                 "add_bias: bias of {} features does not match activation {}", f, y.shape());
#if PIPELINE_WITH_CUDA
  if (const Device d = detail::common_device("add_bias", {&y, &bias}); d.is_cuda()) {
    const detail::CudaScope cuda(d);
    kernels::add_bias(cuda.stream(), y.device_data<float>(), bias.device_data<float>(),
                      y.numel() / f, f);
    return;
  }
#endif
  auto Y = as_matrix(y, y.numel() / f, f);
  Y.rowwise() += detail::as_vector(bias).transpose();
}

void bias_grad(const Tensor& dy, Tensor& dbias) {
  const std::int64_t f = dbias.numel();
  PIPELINE_CHECK(f > 0 && dy.numel() % f == 0 && dy.dim(-1) == f,
                 "bias_grad: bias of {} features does not match gradient {}", f, dy.shape());
#if PIPELINE_WITH_CUDA
  if (const Device d = detail::common_device("bias_grad", {&dy, &dbias}); d.is_cuda()) {
    const detail::CudaScope cuda(d);
    const std::int64_t rows = dy.numel() / f;
    Tensor workspace = cuda.scratch_floats(kernels::bias_grad_workspace_floats(rows, f));
    kernels::bias_grad(cuda.stream(), dy.device_data<float>(), rows, f, dbias.device_data<float>(),
                       workspace.device_data<float>());
    return;
  }
#endif
  auto D = as_matrix(dy, dy.numel() / f, f);
  detail::as_vector(dbias) += D.colwise().sum().transpose();
}

}  // namespace pipeline::ops
