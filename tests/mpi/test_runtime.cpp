// ranks: 2 3 4
// The pipeline runtime over MPI, one process per stage replica: flush schedules equal
// SequentialTrainer with gradient accumulation; 1F1B-stash (with and without vertical sync, with a
// replicated stage) equals the independent weight-stashing reference; a peer that never answers
// ends the wait with a TimeoutError naming the rank's place in its schedule.
//
// Tolerance 1e-5 relative (|a - b| / (1 + |b|)): straight pipelines run the single process's ops
// on the same microbatches in the same order (bitwise equal in practice); replicated stages sum
// their gradients in another association, a few float ulps per step.
#include <doctest/doctest.h>

#include <pipeline/comm/comms/mpi.hpp>
#include <pipeline/core/threads.hpp>
#include <pipeline/data/synthetic.hpp>
#include <pipeline/nn/layers/activation.hpp>
#include <pipeline/nn/layers/dropout.hpp>
#include <pipeline/nn/layers/linear.hpp>
#include <pipeline/optim/sgd.hpp>
#include <pipeline/runtime/stage_executor.hpp>
#include <pipeline/schedule/generator.hpp>
#include <pipeline/schedule/validate.hpp>

#include <cmath>
#include <numeric>

#include "support/param_compare.hpp"
#include "support/stash_reference.hpp"

using namespace pipeline;
using pipeline::testing::max_rel_diff;

namespace {

constexpr int kFeatures = 10;
constexpr int kClasses = 4;
constexpr int kBatch = 8;
constexpr float kLr = 0.05f;
constexpr std::uint64_t kSeed = 11;

// Eight layers, so that up to four stages of two layers each exist.
Sequential model(float dropout) {
  Sequential m("runtime-mpi-mlp");
  m.emplace<Linear>("fc1", kFeatures, 12);
  m.emplace<ReLU>("relu1");
  m.emplace<Linear>("fc2", 12, 12);
  m.emplace<Tanh>("tanh2");
  m.emplace<Linear>("fc3", 12, 12);
  m.emplace<Dropout>("drop", dropout);
  m.emplace<ReLU>("relu3");
  m.emplace<Linear>("fc4", 12, kClasses);
  return m;
}

std::unique_ptr<Optimizer> make_sgd() {
  return std::make_unique<Sgd>(SgdOptions{.momentum = 0.9f});
}

Batch minibatch(std::int64_t j) {
  static const SyntheticDataset data(Shape{kFeatures}, kClasses, 256, 5);
  std::vector<std::int64_t> idx(kBatch);
  std::iota(idx.begin(), idx.end(), j * kBatch);
  return data.get(idx);
}

MinibatchFeed feed() {
  return {[](std::int64_t j) { return minibatch(j); },
          [](std::int64_t) { return std::int64_t{kBatch}; }};
}

// Stages of two layers on the world's ranks: `world` stages, or with `replicate_first` a
// two-replica first stage and world - 2 more stages.
PipelineLayout layout_for(int world, bool replicate_first) {
  PipelineLayout l;
  const int stages = replicate_first ? world - 1 : world;
  const int per = 8 / stages, extra = 8 % stages;
  int begin = 0, rank = 0;
  for (int s = 0; s < stages; ++s) {
    const int end = begin + per + (s < extra ? 1 : 0);
    l.stages.push_back({begin, end});
    if (s == 0 && replicate_first) {
      l.stage_ranks.push_back({0, 1});
      rank = 2;
    } else {
      l.stage_ranks.push_back({rank++});
    }
    begin = end;
  }
  return l;
}

}  // namespace

TEST_CASE("flush schedules over MPI equal SequentialTrainer") {
  set_num_threads(1);
  MpiCommunicator comm;
  comm.set_timeout(60);
  const Sequential m = model(0.2f);
  const int minibatches = 3, micro = 4;
  SequentialTrainer ref(m, m.init(kSeed), make_sgd(), kSeed);
  for (int j = 0; j < minibatches; ++j) ref.step(minibatch(j), kLr, micro);
  for (bool replicated : {false, true}) {
    if (replicated && comm.size() < 3) continue;
    const PipelineLayout layout = layout_for(comm.size(), replicated);
    for (const std::string name : {"gpipe", "1f1b-flush"}) {
      ScheduleSpec spec;
      spec.stage_ranks = layout.stage_ranks;
      spec.microbatches = micro;
      spec.minibatches = minibatches;
      Schedule s = generate_schedule(name, spec);
      StageExecutor ex(m, Shape{kFeatures}, DType::Float32, layout, comm, make_sgd(),
                       {.seed = kSeed});
      ex.train(s, feed(), 0, [](std::int64_t) { return kLr; });
      CAPTURE(name);
      CAPTURE(replicated);
      CHECK(max_rel_diff(ex.params(), ref.params(), ex.layers()) <= 1e-5);
    }
  }
}

TEST_CASE("1f1b-stash over MPI equals the weight-stashing reference") {
  set_num_threads(1);
  MpiCommunicator comm;
  comm.set_timeout(60);
  const Sequential m = model(0.f);
  const int minibatches = 6;
  struct Case {
    bool replicated, vsync;
  };
  for (Case c : {Case{false, false}, Case{false, true}, Case{true, false}, Case{true, true}}) {
    if (c.replicated && comm.size() < 3) continue;
    const PipelineLayout layout = layout_for(comm.size(), c.replicated);
    ScheduleSpec spec;
    spec.stage_ranks = layout.stage_ranks;
    spec.minibatches = minibatches;
    spec.vertical_sync = c.vsync;
    Schedule s = generate_schedule("1f1b-stash", spec);
    testing::StashReference ref{m, kSeed, kLr, make_sgd, minibatch, layout.stages, {}, {}, c.vsync};
    ref.follow(s);
    const ModelParams want = ref.run(minibatches);
    StageExecutor ex(m, Shape{kFeatures}, DType::Float32, layout, comm, make_sgd(),
                     {.seed = kSeed});
    TrainResult r = ex.train(s, feed(), 0, [](std::int64_t) { return kLr; });
    CAPTURE(c.replicated);
    CAPTURE(c.vsync);
    CHECK(max_rel_diff(ex.params(), want, ex.layers()) <= 1e-5);
    CHECK(r.peak_in_flight <=
          validate(s).ranks[static_cast<std::size_t>(comm.rank())].peak_activations);
  }
}

TEST_CASE("a peer that never sends ends the wait with the rank's place in its schedule") {
  set_num_threads(1);
  MpiCommunicator comm;
  const Sequential m = model(0.f);
  const PipelineLayout layout = layout_for(comm.size(), false);
  Schedule s = generate_schedule("gpipe", ScheduleSpec::straight(comm.size(), 2, 1));
  StageExecutor ex(m, Shape{kFeatures}, DType::Float32, layout, comm, make_sgd(), {.seed = kSeed});
  comm.set_timeout(1.0);
  if (comm.rank() > 0) {
    // Rank 0 does not run the schedule: every other rank's first receive (from its predecessor,
    // which is stuck or absent) must time out, not hang.
    const std::string where = fmt::format("stage {} replica 0, action 1 of", comm.rank());
    CHECK_THROWS_WITH_AS(ex.train(s, feed(), 0, [](std::int64_t) { return kLr; }),
                         doctest::Contains(where.c_str()), TimeoutError);
  }
  // Abandoned receives die with their requests; the next communicator is a fresh duplicate.
  comm.set_timeout(60);
  comm.barrier();
}
