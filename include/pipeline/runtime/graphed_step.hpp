// GraphedStep: a single-process training step on a GPU, captured into a CUDA graph once and
// replayed (cuda/graph.hpp), for SequentialTrainer::use_cuda_graphs().
//
// Why: a small model's step is hundreds of short kernels whose launch overhead on the host, not
// the GPU, sets its pace (fashion-cnn at batch 64: ~0.8 ms of launches for far less compute). A
// replay launches them all at once, with the same kernels and arguments, so the results are the
// same as without graphs.
//
// How a step runs: every step, eager or replayed, runs on the GraphedStep's own stream (graphs
// cannot be captured on the legacy default stream), after the caller's current stream. The first
// step of a batch shape (and microbatch count) runs eagerly, which also warms every per-shape
// cache (cuDNN algorithms, cuBLASLt workspaces, the allocator); the next one of that shape is
// captured and replayed, and later ones replay. A step of another shape (a last partial batch)
// runs eagerly and a return to the captured shape replays again; a third shape is warmed and
// captured anew. Before each replay the batch is copied into the graph's input tensors and the
// optimizer's step scalars (learning rate, bias corrections) into device memory; after it, the
// step's loss, correct count and gradient norm come back in one copy.
#pragma once

#include <pipeline/core/device.hpp>
#include <pipeline/core/tensor.hpp>
#include <pipeline/data/dataset.hpp>
#include <pipeline/optim/optimizer.hpp>

#include <functional>
#include <memory>

namespace pipeline {

struct StepResult {
  double loss = 0;  // mean loss over the minibatch
  std::int64_t correct = 0;
  std::int64_t count = 0;
  double grad_norm = 0;  // global gradient norm before clipping
};

// Where a queued step leaves its results: five doubles of device memory (a float32 tensor of 10).
struct StepTotals {
  static constexpr std::int64_t kFloats = 10;
  static constexpr std::int64_t kSumOfSquaresAt = 8;  // the float offset of sum_of_squares
  double loss = 0, correct = 0;
  double bad_label_row = 0, bad_label = 0;  // row + 1 of a label out of range (0: none), value
  double sum_of_squares = 0;                // of the gradients, before clipping
};

class GraphedStep {
 public:
  // What the trainer does in a step, in two forms: run it eagerly, or only queue it (device
  // work, no host waits) on the current stream, adding the loss and correct count into
  // `totals` (ops::softmax_cross_entropy_accumulate), writing the gradients' sum of squares to
  // its last double (ops::sum_of_squares_total), clipping and updating.
  struct Body {
    std::function<StepResult(const Batch& batch)> eager;
    std::function<void(const Batch& batch, Tensor& totals)> queue;
  };

  // ConfigError unless `device` is a CUDA device of a CUDA build.
  GraphedStep(Device device, Optimizer& optimizer);
  ~GraphedStep();
  GraphedStep(const GraphedStep&) = delete;
  GraphedStep& operator=(const GraphedStep&) = delete;

  StepResult step(const Batch& batch, float lr, int microbatches, const Body& body);

  // Steps captured into a graph and replayed so far (a capture counts once).
  std::int64_t replays() const;
  std::int64_t captures() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> m_impl;
};

}  // namespace pipeline
