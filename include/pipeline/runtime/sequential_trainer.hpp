// SequentialTrainer: training a whole model in one process — the reference every pipelined
// schedule must reproduce, and the single-process mode of the example trainers.
//
// A step takes one minibatch, cuts it into `microbatches` views, runs forward and backward on
// each with the loss scaled by 1/minibatch_size so that the gradients accumulate to exactly
// those of the whole minibatch, optionally clips the global gradient norm, and applies one
// optimizer update. Dropout masks are drawn from microbatch_seed(), the formula the pipeline
// runtime uses too, so the same microbatch sees the same mask wherever it runs.
#pragma once

#include <pipeline/data/dataset.hpp>
#include <pipeline/data/loader.hpp>
#include <pipeline/nn/loss.hpp>
#include <pipeline/nn/sequential.hpp>
#include <pipeline/optim/flatten.hpp>
#include <pipeline/optim/grad_clip.hpp>
#include <pipeline/optim/optimizer.hpp>
#include <pipeline/runtime/graphed_step.hpp>

#include <cmath>
#include <memory>

namespace pipeline {

// Seed of the stochastic layers for microbatch `micro` of optimizer step `step`.
inline std::uint64_t microbatch_seed(std::uint64_t run_seed, std::int64_t step, int micro) {
  return Rng(run_seed ^ Rng::hash("microbatch"),
             std::to_string(step) + "/" + std::to_string(micro)).next_u64();
}

struct EvalResult {
  double loss = 0;  // mean over the dataset
  double accuracy = 0;
  std::int64_t count = 0;
};

class SequentialTrainer {
 public:
  // `model` is used, not copied: it must outlive the trainer (a temporary does not compile).
  SequentialTrainer(const Sequential&&, ModelParams, std::unique_ptr<Optimizer>, std::uint64_t = 0,
                    float = 0.f) = delete;
  SequentialTrainer(const Sequential& model, ModelParams params, std::unique_ptr<Optimizer> optimizer,
                    std::uint64_t seed = 0, float clip_norm = 0.f)
      : m_model(&model),
        m_params(std::move(params)),
        m_device(device_of(m_params)),
        m_grads(model.zero_grads(model.all(), m_device)),
        m_optimizer(std::move(optimizer)),
        m_seed(seed),
        m_clip_norm(clip_norm) {
    PIPELINE_CHECK(static_cast<int>(m_params.size()) == model.size(),
                   "trainer for '{}' given parameters for {} of its {} layers", model.name(),
                   m_params.size(), model.size());
    PIPELINE_CHECK(m_optimizer != nullptr, "trainer needs an optimizer");
  }

  // Where the model trains: the device of the parameters it was given (to_device() them first
  // to train on a GPU); batches are copied there at each step.
  Device device() const { return m_device; }
  ModelParams& params() { return m_params; }
  const ModelParams& params() const { return m_params; }
  ModelGrads& grads() { return m_grads; }
  Optimizer& optimizer() { return *m_optimizer; }
  std::int64_t steps_done() const { return m_step; }
  // Continue a run at its step `steps` (a resumed checkpoint's): the dropout masks of the steps
  // that follow are those of the run that wrote it (microbatch_seed keys them by the step).
  void continue_from(std::int64_t steps) {
    PIPELINE_CHECK_AS(ConfigError, steps >= 0, "a run continues from step {}: it must be >= 0",
                      steps);
    m_step = steps;
  }

  // Forward and backward of every microbatch, accumulating gradients; no update.
  StepResult accumulate(const Batch& batch, int microbatches = 1) {
    StepResult r;
    const float scale = 1.f / static_cast<float>(batch.size());
    int micro = 0;
    for (const Batch& mb : split_microbatches(on_device(batch), microbatches)) {
      ForwardContext ctx{Mode::Train, microbatch_seed(m_seed, m_step, micro++)};
      std::vector<Saved> saved;
      Tensor logits = m_model->forward(m_model->all(), m_params, mb.inputs, saved, ctx);
      LossResult l = m_loss(logits, mb.labels, scale);
      PIPELINE_CHECK(std::isfinite(l.loss),
                     "loss became {} at step {} (its microbatch {}): lower the learning rate or "
                     "enable gradient clipping (clip_norm; the trainers' --clip-grad)",
                     l.loss, m_step + 1, micro - 1);
      logits = Tensor{};  // the loss's gradient is all the backward needs of it
      m_model->backward(m_model->all(), m_params, std::move(saved), std::move(l.grad), m_grads,
                        false);
      r.loss += l.loss;
      r.correct += l.correct;
      r.count += l.count;
    }
    return r;
  }

  // One optimizer step on a minibatch: accumulate, clip, update, clear the gradients.
  StepResult step(const Batch& batch, float lr, int microbatches = 1) {
    PIPELINE_CHECK_AS(ConfigError, batch.inputs.defined() && batch.labels.defined(),
                      "a training batch needs inputs and labels; this one has no {}",
                      batch.inputs.defined() ? "labels" : "inputs");
    PIPELINE_CHECK_AS(ConfigError,
                      batch.inputs.rank() > 0 && batch.labels.rank() > 0 &&
                          batch.inputs.dim(0) == batch.labels.dim(0),
                      "a training batch needs a label per sample; this one has inputs of shape {} "
                      "and labels of shape {}",
                      batch.inputs.shape(), batch.labels.shape());
    StepResult r;
    if (m_graphs) {
      r = m_graphs->step(
          batch, lr, microbatches,
          {[&](const Batch& b) { return eager_step(b, lr, microbatches); },
           [&](const Batch& b, Tensor& totals) { queue_step(b, lr, microbatches, totals); }});
      PIPELINE_CHECK(std::isfinite(r.loss),
                     "loss became {} at step {}: lower the learning rate or enable gradient "
                     "clipping (clip_norm; the trainers' --clip-grad)",
                     r.loss, m_step + 1);
      PIPELINE_CHECK(std::isfinite(r.grad_norm), "gradient norm became {} at step {}", r.grad_norm,
                     m_step + 1);
    } else {
      r = eager_step(batch, lr, microbatches);
    }
    ++m_step;
    return r;
  }

  // CUDA graphs (runtime/graphed_step.hpp): on a GPU, the first step of a batch shape runs as
  // usual, the next is captured into a graph and later ones replay it, with the same results.
  // ConfigError on the CPU, in a build without CUDA, and for a model that draws random numbers
  // (dropout), whose masks a replay cannot change.
  void use_cuda_graphs() {
    for (int i = 0; i < m_model->size(); ++i)
      PIPELINE_CHECK_AS(ConfigError, !m_model->layer(i).draws_random_numbers(),
                        "CUDA graphs replay every step with the random numbers of the captured "
                        "one, but layer '{}' of '{}' draws new ones each step (dropout): set its "
                        "dropout to 0 or train without CUDA graphs",
                        m_model->layer(i).name(), m_model->name());
    m_graphs = std::make_unique<GraphedStep>(m_device, *m_optimizer);
  }
  // Null without CUDA graphs.
  const GraphedStep* graphs() const { return m_graphs.get(); }

  // Forward-only pass over a dataset in eval mode (batch norm uses running statistics).
  EvalResult evaluate(const Dataset& data, std::int64_t batch_size) {
    DataLoader loader(data, {.batch_size = batch_size, .shuffle = false});
    EvalResult r;
    double correct = 0;
    for (const Batch& host : loader.epoch(0)) {
      const Batch b = on_device(host);
      std::vector<Saved> saved;
      Tensor logits = m_model->forward(m_model->all(), m_params, b.inputs, saved, {Mode::Eval, 0});
      LossResult l = m_loss(logits, b.labels, 1.f);
      r.loss += l.loss;
      correct += static_cast<double>(l.correct);
      r.count += l.count;
    }
    if (r.count > 0) {
      r.loss /= static_cast<double>(r.count);
      r.accuracy = correct / static_cast<double>(r.count);
    }
    return r;
  }

 private:
  Batch on_device(const Batch& b) const {
    if (m_device.is_cpu()) return b;
    Batch out = b;
    out.inputs = b.inputs.to(m_device);
    out.labels = b.labels.to(m_device);
    return out;
  }

  StepResult eager_step(const Batch& batch, float lr, int microbatches) {
    StepResult r = accumulate(batch, microbatches);
    std::vector<Tensor> params = flatten_params(m_params), grads = flatten_grads(m_grads);
    const auto check_norm = [&] {
      PIPELINE_CHECK(std::isfinite(r.grad_norm),
                     "gradient norm became {} at step {}: lower the learning rate{}", r.grad_norm,
                     m_step + 1,
                     m_clip_norm > 0.f ? "" : " or enable gradient clipping (clip_norm; the trainers' --clip-grad)");
    };
    if (m_clip_norm > 0.f) {
      r.grad_norm = std::sqrt(sum_of_squares(grads));
      check_norm();
      scale(grads, clip_factor(r.grad_norm, m_clip_norm));
      m_optimizer->step(params, grads, lr);
      zero_all(grads);
    } else {
      // The norm is only reported: taken in the update's pass over the gradients, which zeroes
      // them too. A non-finite one is then found after the update, which spoiled the weights;
      // the run stops either way.
      std::vector<double> sums(grads.size(), 0.0);
      m_optimizer->step_and_zero(params, grads, lr, sums);
      double total = 0;  // as sum_of_squares(grads) adds them up
      for (double s : sums) total += s;
      r.grad_norm = std::sqrt(total);
      check_norm();
    }
    return r;
  }

  // eager_step's device work, only queued (no value comes back to the host), for a CUDA graph to
  // capture: the loss, correct count and gradients' sum of squares go to `totals` (StepTotals),
  // and the optimizer reads its step's values from device memory (GraphedStep arranges both).
  void queue_step(const Batch& batch, float lr, int microbatches, Tensor& totals) {
    const float scale = 1.f / static_cast<float>(batch.size());
    int micro = 0;
    for (const Batch& mb : split_microbatches(batch, microbatches)) {
      ForwardContext ctx{Mode::Train, microbatch_seed(m_seed, m_step, micro++)};
      std::vector<Saved> saved;
      Tensor logits = m_model->forward(m_model->all(), m_params, mb.inputs, saved, ctx);
      Tensor grad = Tensor::empty(logits.shape(), DType::Float32, logits.device());
      ops::softmax_cross_entropy_accumulate(logits, mb.labels, scale, grad, totals);
      m_model->backward(m_model->all(), m_params, saved, grad, m_grads, false);
    }
    std::vector<Tensor> params = flatten_params(m_params), grads = flatten_grads(m_grads);
    Tensor sum_of_squares = totals.slice(StepTotals::kSumOfSquaresAt, StepTotals::kFloats);
    ops::sum_of_squares_total(grads, sum_of_squares);
    if (m_clip_norm > 0.f) ops::scale_by_clip_factor(grads, sum_of_squares, m_clip_norm);
    m_optimizer->step(params, grads, lr);
    zero_all(grads);
  }

  const Sequential* m_model;
  ModelParams m_params;
  Device m_device;
  ModelGrads m_grads;
  std::unique_ptr<Optimizer> m_optimizer;
  SoftmaxCrossEntropy m_loss;
  std::uint64_t m_seed;
  float m_clip_norm;
  std::int64_t m_step = 0;
  std::unique_ptr<GraphedStep> m_graphs;
};

}  // namespace pipeline
