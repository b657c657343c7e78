// Launchers of the optimizer kernels (optimizer.cu): fused multi-tensor SGD(-momentum) and
// Adam(W) steps, and the two halves of gradient-norm clipping (Σ x², x *= factor). CPU reference
// and contract: include/pipeline/ops/optimizer_update.hpp (PyTorch's torch.optim semantics).
//
// A multi-tensor launch updates any number of tensors with a few kernel launches: the tensors are
// cut into chunks of 65536 elements and each block of a launch takes one chunk of one tensor, so
// a model's hundreds of small parameters cost one launch instead of hundreds. All pointers are
// float32 device memory of the stream's device; updates are in place and asynchronous on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace pipeline::kernels {

struct SgdTensor {
  float* param = nullptr;
  const float* grad = nullptr;
  float* momentum_buffer = nullptr;  // null when momentum == 0
  std::int64_t n = 0;
};

struct SgdStep {
  float lr = 0, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
  bool first_step = false;  // the buffer is set to the gradient instead of decayed into
  // Non-null: the learning rate is read from scalars[0] (device memory) instead of lr, so that a
  // replayed CUDA graph takes each step's value.
  const float* scalars = nullptr;
};

// For each tensor: g = grad + wd·param; buf = first ? g : momentum·buf + (1 − dampening)·g;
// param −= lr · (nesterov ? g + momentum·buf : buf), or lr · g without momentum.
void sgd_update(cudaStream_t stream, const SgdTensor* tensors, int count, const SgdStep& step);

struct AdamWTensor {
  float* param = nullptr;
  const float* grad = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  std::int64_t n = 0;
};

// The per-step scalars, computed on the host as the CPU op computes them (in double, then float).
struct AdamWStep {
  float step_size = 0;     // lr / (1 − beta1^step)
  float inv_sqrt_bc2 = 0;  // 1 / sqrt(1 − beta2^step)
  float beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  float decay = 1;        // 1 − lr · weight_decay (decoupled decay)
  bool decoupled = true;  // AdamW; false: Adam with L2 decay added to the gradient
  // Non-null: step_size, inv_sqrt_bc2 and decay are read from scalars[0..2] (device memory), so
  // that a replayed CUDA graph takes each step's values.
  const float* scalars = nullptr;
};

// For each tensor: [param *= decay]; m = b1 m + (1 − b1) g; v = b2 v + (1 − b2) g²;
// param −= step_size · m / (sqrt(v) · inv_sqrt_bc2 + eps).
void adamw_update(cudaStream_t stream, const AdamWTensor* tensors, int count,
                  const AdamWStep& step);

// Doubles of device workspace sum_of_squares() needs.
constexpr std::int64_t kSumOfSquaresWorkspace = 1025;

// Σ x² (each square in float, summed in double) as a deterministic two-pass reduction: the
// block count depends only on n, each block's partial sum goes to the workspace and one block adds
// the partials in order. Asynchronous: the result is written to *out (device memory).
void sum_of_squares_async(cudaStream_t stream, const float* x, std::int64_t n, double* workspace,
                          double* out);
// The same, waited for: returns the value (blocks until the stream reaches it). `workspace` holds
// kSumOfSquaresWorkspace doubles.
double sum_of_squares(cudaStream_t stream, const float* x, std::int64_t n, double* workspace);

// x *= factor.
void scale(cudaStream_t stream, float* x, std::int64_t n, float factor);

// *total = Σ parts[i] in order (one double each; what the host would add up).
void add_in_order(cudaStream_t stream, const double* parts, int count, double* total);

// Clipping with the norm on the device: x *= min(1, max_norm / (sqrt(*sum_of_squares) + 1e-6))
// computed as clip_factor() computes it on the host (factor 1 when the norm is not finite).
void scale_by_clip_factor(cudaStream_t stream, float* x, std::int64_t n,
                          const double* sum_of_squares, double max_norm);

}  // namespace pipeline::kernels
