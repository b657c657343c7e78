// The gradient allreduce of replicated stages in buckets that overlap the backward: every
// schedule kind trains to bitwise the same weights whatever the bucket size (each element is
// summed over the replicas in replica order however the gradients are split), equal to the
// sequential references, and the executor's trace shows the overlap: buckets start before the
// AR action, whose wait is shorter than the allreduce.
#include <doctest/doctest.h>

#include <pipeline/comm/comms/local.hpp>
#include <pipeline/core/threads.hpp>
#include <pipeline/data/synthetic.hpp>
#include <pipeline/nn/layers/activation.hpp>
#include <pipeline/nn/layers/linear.hpp>
#include <pipeline/optim/sgd.hpp>
#include <pipeline/runtime/sequential_trainer.hpp>
#include <pipeline/runtime/stage_executor.hpp>
#include <pipeline/schedule/generator.hpp>

#include "support/param_compare.hpp"
#include "support/stash_reference.hpp"

#include <cmath>
#include <cstring>
#include <mutex>
#include <numeric>

namespace test_allreduce_overlap {

using namespace pipeline;
using pipeline::testing::max_rel_diff;

namespace {

constexpr int kFeatures = 12;
constexpr int kClasses = 5;
constexpr int kBatch = 8;
constexpr float kLr = 0.05f;
constexpr std::uint64_t kSeed = 11;

// Five layers with parameters (two without), so that small buckets split a stage several ways.
Sequential model_of_width(int width) {
  Sequential m("overlap-test-mlp");
  m.emplace<Linear>("fc1", kFeatures, width);
  m.emplace<ReLU>("relu1");
  m.emplace<Linear>("fc2", width, width);
  m.emplace<ReLU>("relu2");
  m.emplace<Linear>("fc3", width, 16);
  m.emplace<Linear>("fc4", 16, kClasses);
  return m;
}

std::unique_ptr<Optimizer> make_sgd() {
  return std::make_unique<Sgd>(SgdOptions{.momentum = 0.9f, .weight_decay = 1e-3f});
}

Batch minibatch(std::int64_t j) {
  static const SyntheticDataset d(Shape{kFeatures}, kClasses, 512, 3);
  std::vector<std::int64_t> idx(kBatch);
  std::iota(idx.begin(), idx.end(), (j * kBatch) % 512);
  return d.get(idx);
}

MinibatchFeed feed() {
  return {[](std::int64_t j) { return minibatch(j); },
          [](std::int64_t) { return std::int64_t{kBatch}; }};
}

bool bitwise_equal(const ModelParams& a, const ModelParams& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].params.size() != b[i].params.size()) return false;
    for (std::size_t k = 0; k < a[i].params.size(); ++k)
      if (a[i].params[k].nbytes() != b[i].params[k].nbytes() ||
          std::memcmp(a[i].params[k].raw(), b[i].params[k].raw(), a[i].params[k].nbytes()) != 0)
        return false;
  }
  return true;
}

struct RankOut {
  ModelParams params;
  LayerRange layers;
  std::vector<LayerRange> buckets;
  std::vector<AllReduceTiming> timings;
  std::vector<TraceEvent> trace;
};

std::vector<RankOut> run(const Sequential& model, const PipelineLayout& layout,
                         const Schedule& schedule, ExecutorOptions options) {
  std::vector<RankOut> out(static_cast<std::size_t>(layout.num_ranks()));
  std::mutex mu;
  options.seed = kSeed;
  run_local(layout.num_ranks(), [&](Communicator& comm) {
    StageExecutor ex(model, Shape{kFeatures}, DType::Float32, layout, comm, make_sgd(), options);
    ex.train(schedule, feed(), 0, [](std::int64_t) { return kLr; });
    std::lock_guard lock(mu);
    RankOut& o = out[static_cast<std::size_t>(comm.rank())];
    o.params = ex.params();
    o.layers = ex.layers();
    o.buckets = ex.allreduce_buckets();
    o.timings = ex.allreduce_timings();
    o.trace = ex.trace_events();
  });
  return out;
}

ExecutorOptions blocking() {
  ExecutorOptions o;
  o.overlap_allreduce = false;
  return o;
}

ExecutorOptions buckets_of(std::int64_t bytes) {
  ExecutorOptions o;
  o.allreduce_bucket_bytes = bytes;
  return o;
}

}  // namespace

TEST_CASE("buckets: one bucket per layer, layers without parameters ride along") {
  set_num_threads(1);
  const Sequential model = model_of_width(16);
  // Stage 0 = fc1, relu1, fc2, relu2, fc3 on two replicas; stage 1 = fc4.
  PipelineLayout layout{{{0, 5}, {5, 6}}, {{0, 1}, {2}}};
  ScheduleSpec spec;
  spec.stage_ranks = layout.stage_ranks;
  spec.microbatches = 2;
  spec.minibatches = 1;
  const Schedule s = generate_schedule("1f1b-flush", spec);
  auto out = run(model, layout, s, buckets_of(1));
  // Backward order: fc3 alone, then relu2 + fc2, then relu1 + fc1.
  const std::vector<LayerRange> want = {{4, 5}, {2, 4}, {0, 2}};
  for (int r : {0, 1}) {
    REQUIRE(out[static_cast<std::size_t>(r)].buckets.size() == want.size());
    for (std::size_t b = 0; b < want.size(); ++b) {
      CHECK(out[static_cast<std::size_t>(r)].buckets[b].begin == want[b].begin);
      CHECK(out[static_cast<std::size_t>(r)].buckets[b].end == want[b].end);
    }
  }
  CHECK(out[2].buckets.empty());  // not replicated: no allreduce
  // A bucket size above the stage's gradients: one bucket; no overlap: one bucket too.
  CHECK(run(model, layout, s, buckets_of(std::int64_t{1} << 40))[0].buckets.size() == 1);
  CHECK(run(model, layout, s, blocking())[0].buckets.size() == 1);
}

TEST_CASE("bucketed allreduce: every schedule kind gives bitwise the weights of one allreduce") {
  set_num_threads(1);
  const Sequential model = model_of_width(16);
  const int minibatches = 4, micro = 4;
  struct Case {
    std::vector<LayerRange> stages;
    std::vector<std::vector<int>> ranks;
  };
  const std::vector<Case> cases = {
      {{{0, 6}}, {{0, 1}}},                  // data parallelism (config 2)
      {{{0, 5}, {5, 6}}, {{0, 1}, {2}}},     // replicated input stage
      {{{0, 2}, {2, 6}}, {{0}, {1, 2, 3}}},  // replicated last stage, 3 replicas
  };
  SequentialTrainer flush_ref(model, model.init(kSeed), make_sgd(), kSeed);
  for (int j = 0; j < minibatches; ++j) flush_ref.step(minibatch(j), kLr, micro);
  for (const std::string name : {"1f1b-flush", "gpipe", "zb-h1", "2bw", "1f1b-stash"}) {
    for (const auto& c : cases) {
      PipelineLayout layout{c.stages, c.ranks};
      ScheduleSpec spec;
      spec.stage_ranks = c.ranks;
      spec.microbatches = name == "1f1b-stash" ? 1 : micro;
      spec.minibatches = name == "1f1b-stash" ? 2 * minibatches : minibatches;
      if (name == "1f1b-stash" && c.ranks.back().size() == 3) spec.minibatches = 3 * minibatches;
      const Schedule s = generate_schedule(name, spec);
      CAPTURE(name);
      CAPTURE(layout.num_ranks());
      const auto one = run(model, layout, s, blocking());
      for (std::int64_t bytes : {std::int64_t{1}, std::int64_t{300}, std::int64_t{4} << 20}) {
        CAPTURE(bytes);
        const auto split = run(model, layout, s, buckets_of(bytes));
        for (std::size_t r = 0; r < one.size(); ++r)
          CHECK(bitwise_equal(split[r].params, one[r].params));
      }
      if (name == "1f1b-flush" || name == "gpipe" || name == "zb-h1") {
        for (std::size_t r = 0; r < one.size(); ++r)
          CHECK(max_rel_diff(one[r].params, flush_ref.params(), one[r].layers) <= 1e-5);
      }
      if (name == "1f1b-stash") {
        pipeline::testing::StashReference ref{model,    kSeed, kLr, make_sgd, minibatch,
                                              c.stages, {},    {},  false};
        ref.follow(s);
        const ModelParams want = ref.run(spec.minibatches);
        for (std::size_t r = 0; r < one.size(); ++r)
          CHECK(max_rel_diff(one[r].params, want, one[r].layers) <= 1e-5);
      }
    }
  }
}

TEST_CASE("overlap in the executor's trace: buckets start in the backward, the AR waits less") {
  set_num_threads(1);
  // fc2 is 1024 x 1024: its backward (about a millisecond) runs after fc3's bucket has started.
  const Sequential model = model_of_width(1024);
  PipelineLayout layout{{{0, 5}, {5, 6}}, {{0, 1}, {2}}};
  ScheduleSpec spec;
  spec.stage_ranks = layout.stage_ranks;
  spec.microbatches = 2;
  spec.minibatches = 3;
  const Schedule s = generate_schedule("1f1b-flush", spec);
  ExecutorOptions o = buckets_of(1);
  o.record_trace = true;
  const auto out = run(model, layout, s, o);
  for (int r : {0, 1}) {
    CAPTURE(r);
    const RankOut& ro = out[static_cast<std::size_t>(r)];
    REQUIRE(ro.timings.size() == 3);  // one allreduce per minibatch
    std::vector<TraceEvent> ars;
    for (const TraceEvent& e : ro.trace)
      if (e.action.kind == ActionKind::AllReduce) ars.push_back(e);
    REQUIRE(ars.size() == 3);
    for (std::size_t k = 0; k < 3; ++k) {
      const AllReduceTiming& t = ro.timings[k];
      CHECK(t.buckets == 3);
      CHECK(t.bytes == (12 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 16 + 16) * 4);
      CHECK(t.microbatch == ars[k].action.microbatch);
      // The first bucket started during the backward, before the AR action ...
      CHECK(t.start_s < ars[k].start_s);
      // ... so the AR's wait is only the part of the allreduce that the backward did not hide.
      CHECK(ars[k].end_s - ars[k].start_s < t.end_s - t.start_s);
    }
  }
  CHECK(out[2].timings.empty());
}

}  // namespace test_allreduce_overlap
