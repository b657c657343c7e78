// Launcher of the fused softmax cross-entropy kernel (softmax_xent.cu). CPU reference and
// contract: include/pipeline/ops/softmax_xent.hpp.
//
// logits and grad are row-major [rows, classes] float32 device memory, labels [rows] int32. With
// p = softmax(logits row):
//   grad[r, :] = scale · (p − onehot(label_r))            (overwritten)
//   loss       = scale · Σ_r −log p[r, label_r]          (accumulated in double)
//   correct    = #rows whose first maximum is the label
// Synchronous: the totals are copied to the host, so the call returns once the stream has run
// everything it queued. A label outside [0, classes) is found before anything is written: grad
// is then untouched and the result names the first bad row (the caller raises the error).
#pragma once

#include "check_range.cuh"

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace pipeline::kernels {

struct SoftmaxXentTotals {
  double loss = 0;
  std::int64_t correct = 0;
  RangeViolation bad_label;  // index >= 0: that row's label is outside [0, classes), nothing ran
};

// Bytes of device workspace softmax_xent() needs for `rows` rows (64-byte aligned pieces).
std::size_t softmax_xent_workspace_bytes(std::int64_t rows);

// rows == 0 returns zeros without touching the device. classes must lie in [1, 2^31) (the op
// checks it).
SoftmaxXentTotals softmax_xent(cudaStream_t stream, const float* logits, const std::int32_t* labels,
                               std::int64_t rows, std::int64_t classes, float scale, float* grad,
                               void* workspace);

// The same, queued only (nothing waits, so a CUDA graph can capture it), accumulating into
// `totals`, four doubles of device memory: [0] += loss, [1] += correct, and on a bad label, if
// [2] is still 0, [2] = its row + 1 and [3] = its value (grad is then untouched).
void softmax_xent_accumulate(cudaStream_t stream, const float* logits, const std::int32_t* labels,
                             std::int64_t rows, std::int64_t classes, float scale, float* grad,
                             void* workspace, double* totals);

// Rows longer than a block holds in registers (more than 8192 classes) take a cluster of blocks
// on GPUs that have thread-block clusters (sm_90 on), each block a slice of the row in
// registers; elsewhere, or after set_softmax_xent_clusters(false) (PIPELINE_SOFTMAX_XENT_CLUSTERS=0
// in the environment at start-up), one block a row, the row in shared memory.
void set_softmax_xent_clusters(bool on);

}  // namespace pipeline::kernels
