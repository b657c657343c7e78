#include <pipeline/ops/bias.hpp>

#include "eigen_maps.hpp"

namespace pipeline::ops {

using detail::as_matrix;

void add_bias(Tensor& y, const Tensor& bias) {
  const std::int64_t f = bias.numel();
  PIPELINE_CHECK(f > 0 && y.numel() % f == 0 && y.dim(-1) == f,
                 "add_bias: bias of {} features does not match activation {}", f, y.shape());
  auto Y = as_matrix(y, y.numel() / f, f);
  Y.rowwise() += detail::as_vector(bias).transpose();
}

void bias_grad(const Tensor& dy, Tensor& dbias) {
  const std::int64_t f = dbias.numel();
  PIPELINE_CHECK(f > 0 && dy.numel() % f == 0 && dy.dim(-1) == f,
                 "bias_grad: bias of {} features does not match gradient {}", f, dy.shape());
  auto D = as_matrix(dy, dy.numel() / f, f);
  detail::as_vector(dbias) += D.colwise().sum().transpose();
}

}  // namespace pipeline::ops
