// Losses. SoftmaxCrossEntropy scores logits [..., C] against int32 labels [...] with the fused op
// in ops/softmax_xent.hpp and returns, for the loss scale · Σ_samples −log p[label]:
//   loss     that scaled sum,
//   grad     dL/dlogits (the shape of logits), the gradient to feed the last layer's backward,
//   correct  samples whose argmax equals the label, and count, the samples scored.
// The trainer passes scale = 1/minibatch_size, so the gradients of k accumulated microbatches
// equal those of one batch of k times the size (and the losses add up to the batch mean).
#pragma once

#include <pipeline/ops/softmax_xent.hpp>

#include <cstdint>

namespace pipeline {

struct LossResult {
  double loss;
  Tensor grad;
  std::int64_t correct;
  std::int64_t count;
};

class SoftmaxCrossEntropy {
 public:
  LossResult operator()(const Tensor& logits, const Tensor& labels, float scale) const {
    Tensor grad = Tensor::empty(logits.shape(), DType::Float32, logits.device());
    ops::SoftmaxXentResult r = ops::softmax_cross_entropy(logits, labels, scale, grad);
    return {r.loss, grad, r.correct, r.count};
  }
};

}  // namespace pipeline
