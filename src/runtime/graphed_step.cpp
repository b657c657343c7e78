#include <pipeline/runtime/graphed_step.hpp>

#include <pipeline/core/error.hpp>

#if PIPELINE_WITH_CUDA
#include <pipeline/cuda/graph.hpp>
#include <pipeline/cuda/stream.hpp>
#endif

#include <cmath>
#include <cstddef>
#include <cstring>
#include <optional>
#include <tuple>
#include <vector>

namespace pipeline {

#if PIPELINE_WITH_CUDA

namespace {

// What a captured graph was captured for: a step of another key cannot replay it.
struct StepKey {
  Shape inputs, labels;
  DType input_dtype = DType::Float32;
  int microbatches = 1;
  bool operator==(const StepKey&) const = default;
};

StepKey key_of(const Batch& b, int microbatches) {
  return {b.inputs.shape(), b.labels.shape(), b.inputs.dtype(), microbatches};
}

}  // namespace

struct GraphedStep::Impl {
  Device device;
  Optimizer* optimizer = nullptr;
  cuda::Stream stream;
  cuda::Event caller_ready, step_done;  // ordering with the caller's stream
  std::optional<StepKey> warm;          // the shape of the last eager step
  std::optional<StepKey> captured;
  cuda::Graph graph;
  Batch inputs;    // the graph's batch, refilled before each replay
  Tensor totals;   // StepTotals, on the device
  Tensor scalars;  // the optimizer's step scalars, on the device
  std::int64_t replays = 0, captures = 0;

  // The optimizer can read its step's values from device memory: one update for all parameters.
  bool optimizer_ready() const {
    return !optimizer->state().empty() && optimizer->uniform_steps() &&
           optimizer->state().front().step >= 1;
  }

  void write_scalars(float lr) {
    const std::int64_t next = optimizer->state().front().step + 1;
    const std::vector<float> v = optimizer->step_scalars(lr, next);
    scalars.copy_from(Tensor::from_vector(Shape{static_cast<std::int64_t>(v.size())}, v));
  }

  void fill_inputs(const Batch& batch) {
    inputs.inputs.copy_from(batch.inputs);
    inputs.labels.copy_from(batch.labels);
  }

  void capture(const Batch& batch, float lr, const Body& body, const StepKey& key) {
    graph = {};  // the old graph's memory goes back first
    captured.reset();
    inputs.inputs = Tensor::empty(batch.inputs.shape(), batch.inputs.dtype(), device);
    inputs.labels = Tensor::empty(batch.labels.shape(), batch.labels.dtype(), device);
    totals = Tensor::zeros(Shape{StepTotals::kFloats}, DType::Float32, device);
    const std::size_t n = optimizer->step_scalars(lr, 1).size();
    scalars = Tensor::zeros(Shape{static_cast<std::int64_t>(n)}, DType::Float32, device);
    fill_inputs(batch);
    write_scalars(lr);
    // Only the captured update reads its values from `scalars` (eager steps take arguments);
    // the capture counts the update in the optimizer's state (its host side runs once here).
    optimizer->read_step_scalars_from(scalars);
    try {
      graph = cuda::Graph::capture(stream, [&] {
        totals.zero();
        body.queue(inputs, totals);
      });
    } catch (...) {
      optimizer->read_step_scalars_from({});
      throw;
    }
    optimizer->read_step_scalars_from({});
    captured = key;
    ++captures;
  }

  // Runs the graph; `count`: the samples (labels) the loss scored.
  StepResult replay(std::int64_t count) {
    graph.replay(stream.get());
    StepTotals t;
    static_assert(sizeof(StepTotals) == StepTotals::kFloats * sizeof(float));
    static_assert(offsetof(StepTotals, sum_of_squares) ==
                  StepTotals::kSumOfSquaresAt * sizeof(float));
    const Tensor host = totals.to(Device::cpu());  // waits for the stream
    std::memcpy(&t, host.raw(), sizeof(t));
    graph.run_checks(stream.get());
    ++replays;
    PIPELINE_CHECK_AS(ConfigError, t.bad_label_row == 0,
                      "label {} of sample {} is outside the model's classes: check the dataset's "
                      "labels and the model's class count",
                      t.bad_label, static_cast<std::int64_t>(t.bad_label_row) - 1);
    StepResult r;
    r.loss = t.loss;
    r.correct = static_cast<std::int64_t>(t.correct);
    r.count = count;
    r.grad_norm = std::sqrt(t.sum_of_squares);
    return r;
  }
};

GraphedStep::GraphedStep(Device device, Optimizer& optimizer) : m_impl(std::make_unique<Impl>()) {
  PIPELINE_CHECK_AS(ConfigError, device.is_cuda(),
                    "CUDA graphs are for training on a GPU, not on {}: use --device cuda",
                    device.str());
  m_impl->device = device;
  m_impl->optimizer = &optimizer;
  m_impl->stream = cuda::Stream::create(device.index);
  m_impl->caller_ready = cuda::Event::create(device.index);
  m_impl->step_done = cuda::Event::create(device.index);
}

GraphedStep::~GraphedStep() {
  if (m_impl == nullptr) return;
  try {
    m_impl->stream.synchronize();
  } catch (...) {
  }
}

StepResult GraphedStep::step(const Batch& batch, float lr, int microbatches, const Body& body) {
  Impl& m = *m_impl;
  const StepKey key = key_of(batch, microbatches);
  const cudaStream_t caller = cuda::current_stream(m.device.index);
  m.caller_ready.record(caller);
  m.caller_ready.block(m.stream.get());
  const cuda::StreamGuard guard(m.stream);
  StepResult r;
  if (m.captured == key) {
    m.fill_inputs(batch);
    m.write_scalars(lr);
    m.optimizer->count_replayed_step();
    r = m.replay(batch.labels.numel());
  } else if (m.warm == key && m.optimizer_ready()) {
    m.capture(batch, lr, body, key);
    r = m.replay(batch.labels.numel());
  } else {
    r = body.eager(batch);
    m.warm = key;
  }
  // The caller's later work comes after this step's.
  m.step_done.record(m.stream.get());
  m.step_done.block(caller);
  return r;
}

std::int64_t GraphedStep::replays() const {
  return m_impl->replays;
}
std::int64_t GraphedStep::captures() const {
  return m_impl->captures;
}

#else  // no CUDA

struct GraphedStep::Impl {};

GraphedStep::GraphedStep(Device device, Optimizer&) {
  PIPELINE_FAIL(ConfigError,
                "CUDA graphs need a GPU build (PIPELINE_WITH_CUDA) and a CUDA device, not {}: "
                "drop --cuda-graphs",
                device.str());
}
GraphedStep::~GraphedStep() = default;
StepResult GraphedStep::step(const Batch&, float, int, const Body&) {
  PIPELINE_FAIL(ConfigError, "CUDA graphs need a GPU build");
}
std::int64_t GraphedStep::replays() const {
  return 0;
}
std::int64_t GraphedStep::captures() const {
  return 0;
}

#endif

}  // namespace pipeline
