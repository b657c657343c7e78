// Fused, in-place optimizer updates on float32 tensors, with PyTorch's semantics so that a run
// here and a run of torch.optim with the same hyper-parameters follow the same trajectory.
//
// Every function updates `param` (and the state tensors it is given) in place from `grad`; all
// tensors must be CPU float32 with the same element count (shapes are not compared, so a
// flattened view is fine). The elementwise work is one pass of Eigen array expressions, split
// into contiguous chunks over the ops' threads for large tensors.
//
// sum_of_squares and scale are the two halves of global gradient-norm clipping: the partial sums
// can be added up across pipeline stages before every stage applies the same factor.
#pragma once

#include <pipeline/core/tensor.hpp>

#include <cstdint>
#include <span>
#include <vector>

namespace pipeline::ops {

struct SgdParams {
  float lr = 0.01f;
  float momentum = 0.f;
  float dampening = 0.f;
  float weight_decay = 0.f;  // L2: added to the gradient as weight_decay * param
  bool nesterov = false;
};

// SGD step, torch.optim.SGD:
//   g   = grad + weight_decay * param
//   buf = g                                   on the first step (first_step = true)
//   buf = momentum * buf + (1 - dampening) g  afterwards
//   d   = nesterov ? g + momentum * buf : buf (d = g when momentum == 0; buf may then be null)
//   param -= lr * d
// grad is not modified.
void sgd_update(Tensor& param, const Tensor& grad, Tensor* momentum_buffer, bool first_step,
                const SgdParams& p);

struct AdamWParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 1e-2f;
  // true: AdamW (param *= 1 - lr * weight_decay before the Adam step); false: Adam with L2
  // weight decay added to the gradient, as torch.optim.Adam.
  bool decoupled = true;
};

// Adam(W) step, torch.optim.AdamW (non-amsgrad). `step` is the 1-based count of this update,
// used for bias correction:
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g²
//   param -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
void adamw_update(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                  std::int64_t step, const AdamWParams& p);

// The same updates for many tensors with one step count: on a GPU one multi-tensor launch for
// all of them (a model's many small parameters cost one kernel, not one each), on the CPU one
// parallel region whose threads split all of them (not a region, or one thread, per tensor).
// Element for element the arithmetic is the per-tensor update's, so
// the results are bitwise the same. momentum_buffers[i] may be null only without momentum.
//
// step_scalars (GPU only, for CUDA graphs): a float32 tensor on the parameters' device holding
// what sgd_step_scalars() / adamw_step_scalars() give; the kernels then read the step's learning
// rate and bias corrections from it instead of taking them from p and step as arguments, so a
// captured update replays with each step's values (written there before each replay).
void sgd_update_many(std::span<Tensor> params, std::span<const Tensor> grads,
                     std::span<Tensor* const> momentum_buffers, bool first_step, const SgdParams& p,
                     const Tensor* step_scalars = nullptr);
void adamw_update_many(std::span<Tensor> params, std::span<const Tensor> grads,
                       std::span<Tensor> exp_avg, std::span<Tensor> exp_avg_sq, std::int64_t step,
                       const AdamWParams& p, const Tensor* step_scalars = nullptr);
// What an update can do in the same pass over the gradients, where each would otherwise take a
// pass over memory of its own (a step's tail: fashion-cnn's 12.3 MiB of gradients were read for
// their norm, read by the update and written to zero them, three trips to memory):
//   sums_of_squares  if not empty, one per gradient: sum_of_squares() of each before the update,
//                    bit for bit (the blocks it sums are the update's chunks);
//   zero             the gradients set to zero after the update.
// On a GPU the two run as launches of their own around the update.
struct GradientTail {
  std::span<double> sums_of_squares;
  bool zero = false;
};
void sgd_update_many(std::span<Tensor> params, std::span<Tensor> grads,
                     std::span<Tensor* const> momentum_buffers, bool first_step, const SgdParams& p,
                     const GradientTail& tail);
void adamw_update_many(std::span<Tensor> params, std::span<Tensor> grads, std::span<Tensor> exp_avg,
                       std::span<Tensor> exp_avg_sq, std::int64_t step, const AdamWParams& p,
                       const GradientTail& tail);
// The values behind step_scalars: {lr} for SGD; {lr / (1 − beta1^step), 1 / sqrt(1 −
// beta2^step), 1 − lr · weight_decay} for Adam(W), computed as the update computes them.
std::vector<float> sgd_step_scalars(const SgdParams& p);
std::vector<float> adamw_step_scalars(std::int64_t step, const AdamWParams& p);

// Σ x² over a float32 tensor, accumulated in double.
double sum_of_squares(const Tensor& x);
// sum_of_squares of each tensor (all on one device), with one wait for all of them on a GPU
// instead of one per tensor, in one parallel region on the CPU: the values are those of
// sum_of_squares, bit for bit.
std::vector<double> sums_of_squares(std::span<const Tensor> xs);
// x *= factor in place.
void scale_inplace(Tensor& x, float factor);

// The same two halves with the norm kept on the device (nothing waits: a CUDA graph can capture
// them). `total` is device memory for one double (a tensor of at least 8 bytes, any dtype):
// sum_of_squares_total writes Σ sum_of_squares(x) over xs, added in order as the host adds the
// values of sums_of_squares(), and scale_by_clip_factor scales every x by clip_factor(sqrt(total),
// max_norm) (optim/grad_clip.hpp), bit for bit as the host computes it. GPU tensors only.
void sum_of_squares_total(std::span<const Tensor> xs, Tensor& total);
void scale_by_clip_factor(std::span<Tensor> xs, const Tensor& total, float max_norm);

}  // namespace pipeline::ops
