// Bias add and its gradient for row-major [rows, features] activations (features innermost).
#pragma once

#include <pipeline/core/tensor.hpp>

namespace pipeline::ops {

// y[r, f] += bias[f] for every row r; y is viewed as [numel / features, features].
void add_bias(Tensor& y, const Tensor& bias);
// dbias[f] += Σ_r dy[r, f].
void bias_grad(const Tensor& dy, Tensor& dbias);

}  // namespace pipeline::ops
