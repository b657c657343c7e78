// Global gradient-norm clipping (torch.nn.utils.clip_grad_norm_).
//
// The norm is over all gradients of the model, which in a pipeline live on different ranks. So
// the operation is split: every stage computes sum_of_squares() of its own gradients, the
// partial sums are added across stages (an allreduce), each stage takes
// clip_factor(sqrt(total), max_norm) and scale()s its gradients by it. Every stage then applies
// the same factor, exactly as one process would. clip_grad_norm() is the one-process form.
//
// A non-finite norm (an overflowed or NaN gradient) gives factor 1, i.e. no scaling; the caller
// sees the norm and decides (skip the step, stop).
#pragma once

#include <pipeline/core/error.hpp>
#include <pipeline/core/tensor.hpp>
#include <pipeline/ops/optimizer_update.hpp>

#include <algorithm>
#include <cmath>
#include <span>

namespace pipeline {

inline double sum_of_squares(std::span<const Tensor> grads) {
  double s = 0.0;
  for (double x : ops::sums_of_squares(grads)) s += x;
  return s;
}

inline void scale(std::span<Tensor> grads, float factor) {
  if (factor == 1.f) return;
  for (auto& g : grads) ops::scale_inplace(g, factor);
}

// min(1, max_norm / (total_norm + 1e-6)), as PyTorch.
inline float clip_factor(double total_norm, double max_norm) {
  PIPELINE_CHECK_AS(ConfigError, max_norm > 0.0, "gradient clipping needs max_norm > 0, got {}",
                    max_norm);
  if (!std::isfinite(total_norm)) return 1.f;
  return static_cast<float>(std::min(1.0, max_norm / (total_norm + 1e-6)));
}

// Clips in place; returns the norm before clipping.
inline double clip_grad_norm(std::span<Tensor> grads, float max_norm) {
  const double norm =
      std::sqrt(sum_of_squares(std::span<const Tensor>(grads.data(), grads.size())));
  scale(grads, clip_factor(norm, max_norm));
  return norm;
}

}  // namespace pipeline
