// Fused softmax cross-entropy over the last dimension, numerically stable (log-sum-exp with the
// row maximum subtracted).
//
// logits [..., C] float32, labels [...] int32 with values in [0, C) (any shape holding one label
// per row of logits). With R rows, p = softmax(logits):
//   loss    = scale · Σ_r −log p[r, label_r]       (a SUM over samples, times scale)
//   grad    = scale · (p − onehot(label))          (dL/dlogits of that scaled loss; overwritten)
//   correct = #rows whose argmax (first maximum) equals the label
// The trainer passes scale = 1/minibatch_size, so k accumulated microbatches equal one batch of
// k times the size. A label outside [0, C) is rejected with a ConfigError before anything is
// written.
#pragma once

#include <pipeline/core/tensor.hpp>

#include <cstdint>

namespace pipeline::ops {

struct SoftmaxXentResult {
  double loss = 0;
  std::int64_t correct = 0;
  std::int64_t count = 0;  // rows (samples) scored
};

SoftmaxXentResult softmax_cross_entropy(const Tensor& logits, const Tensor& labels, float scale,
                                        Tensor& grad);

// The same on a GPU, queued without waiting for the device (so a CUDA graph can capture it): the
// results are added into device memory instead of returned. `totals` is four doubles of memory
// on the logits' device (a tensor of at least 32 bytes, any dtype; zero it before the first
// call): [0] += loss, [1] += correct. A bad label leaves grad untouched and, if [2] is still 0,
// writes its row + 1 to [2] and its value to [3]; the caller reads the totals back and raises it.
void softmax_cross_entropy_accumulate(const Tensor& logits, const Tensor& labels, float scale,
                                      Tensor& grad, Tensor& totals);

// On a GPU with thread-block clusters (sm_90 on), rows of more than 8192 classes are split over a
// cluster of blocks; false gives them one block a row, the row in shared memory, as on older
// GPUs (PIPELINE_SOFTMAX_XENT_CLUSTERS=0 in the environment does the same from start-up). For
// tests and timings; nothing changes on the CPU.
void set_softmax_xent_clusters(bool on);

}  // namespace pipeline::ops
