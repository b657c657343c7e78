// Stopping a running pipeline: the ranks agree on a stop minibatch while the schedule runs
// (StopAgreement), every rank stops there (StageExecutor::stop_before), and the result is exactly
// that of a schedule of that many minibatches — for 1F1B-stash and 1F1B-flush, with one rank asked.
#include <doctest/doctest.h>

#include <pipeline/comm/comms/local.hpp>
#include <pipeline/data/synthetic.hpp>
#include <pipeline/nn/layers/activation.hpp>
#include <pipeline/nn/layers/linear.hpp>
#include <pipeline/optim/sgd.hpp>
#include <pipeline/runtime/stage_executor.hpp>
#include <pipeline/runtime/stop_agreement.hpp>
#include <pipeline/schedule/generator.hpp>

#include <cstring>
#include <mutex>
#include <numeric>

namespace test_stop_agreement {

using namespace pipeline;

namespace {

constexpr int kFeatures = 10, kClasses = 4, kBatch = 8;

Sequential model() {
  Sequential m("stop-test-mlp");
  m.emplace<Linear>("fc1", kFeatures, 12);
  m.emplace<ReLU>("relu1");
  m.emplace<Linear>("fc2", 12, 12);
  m.emplace<ReLU>("relu2");
  m.emplace<Linear>("fc3", 12, kClasses);
  return m;
}

MinibatchFeed feed() {
  static const SyntheticDataset data(Shape{kFeatures}, kClasses, 4096, 5);
  return {[](std::int64_t j) {
            std::vector<std::int64_t> idx(kBatch);
            std::iota(idx.begin(), idx.end(), j * kBatch);
            return data.get(idx);
          },
          [](std::int64_t) { return std::int64_t{kBatch}; }};
}

Schedule schedule_for(const std::string& name, const PipelineLayout& layout, int minibatches) {
  ScheduleSpec spec;
  spec.stage_ranks = layout.stage_ranks;
  spec.microbatches = name == "1f1b-stash" ? 1 : 2;
  spec.minibatches = minibatches;
  return generate_schedule(name, spec);
}

// Every rank's final parameters, flattened in rank order.
using Weights = std::vector<std::vector<float>>;

struct Outcome {
  Weights weights;
  std::vector<std::int64_t> stops;  // per rank
};

// Trains `minibatches` under `name`; when `asking_rank` >= 0, that rank asks to stop once its
// position reaches `ask_at`.
Outcome train(const std::string& name, const PipelineLayout& layout, int minibatches,
              int asking_rank = -1, std::int64_t ask_at = 0) {
  const Sequential m = model();
  const Schedule sched = schedule_for(name, layout, minibatches);
  Outcome out;
  out.weights.resize(static_cast<std::size_t>(layout.num_ranks()));
  out.stops.resize(static_cast<std::size_t>(layout.num_ranks()), -1);
  std::mutex mu;
  run_local(layout.num_ranks(), [&](Communicator& comm) {
    StageExecutor ex(m, Shape{kFeatures}, DType::Float32, layout, comm,
                     std::make_unique<Sgd>(SgdOptions{.momentum = 0.9f}), {.seed = 3});
    std::int64_t position = 0;
    StopAgreement stop(comm, 0, stop_margin(sched), 1,
                       [&] { return comm.rank() == asking_rank && position >= ask_at; });
    const MinibatchFeed f = feed();
    ex.train(
        sched, f, 0, [](std::int64_t) { return 0.05f; }, {},
        [&](std::int64_t p) {
          position = p;
          if (asking_rank < 0 || ex.stop_position() >= 0) return;
          if (auto k = stop.poll(p)) ex.stop_before(*k);
        });
    std::vector<float> w;
    for (auto& layer : ex.params())
      for (auto& t : layer.params) {
        auto v = t.values();
        w.insert(w.end(), v.begin(), v.end());
      }
    std::lock_guard lock(mu);
    out.weights[static_cast<std::size_t>(comm.rank())] = std::move(w);
    out.stops[static_cast<std::size_t>(comm.rank())] = ex.stop_position();
  });
  return out;
}

PipelineLayout four_stages() {
  return PipelineLayout::straight({{0, 1}, {1, 2}, {2, 4}, {4, 5}});
}

}  // namespace

TEST_CASE("stop_margin: twice the furthest a rank runs ahead of its steps, plus 2") {
  const PipelineLayout layout = four_stages();
  // 1F1B-stash on 4 stages: the first stage has 4 minibatches started before its first step.
  CHECK(stop_margin(schedule_for("1f1b-stash", layout, 20)) == 2 * 4 + 2);
  // Flush: a minibatch completes before the next starts on every stage.
  CHECK(stop_margin(schedule_for("1f1b-flush", layout, 20)) == 2 * 1 + 2);
  CHECK(stop_margin(schedule_for("gpipe", layout, 20)) == 2 * 1 + 2);
}

TEST_CASE(
    "a stop agreed while a 4-stage pipeline runs equals a schedule of that many minibatches") {
  const PipelineLayout layout = four_stages();
  for (const std::string name : {"1f1b-stash", "1f1b-flush"}) {
    CAPTURE(name);
    // Rank 2 is asked to stop once it has absorbed 6 minibatches.
    const Outcome stopped = train(name, layout, 30, 2, 6);
    const std::int64_t k = stopped.stops[0];
    for (std::int64_t s : stopped.stops) CHECK(s == k);
    CHECK(k > 6);
    CHECK(k <= 6 + 2 * stop_margin(schedule_for(name, layout, 30)));
    const Outcome reference = train(name, layout, static_cast<int>(k));
    REQUIRE(stopped.weights.size() == reference.weights.size());
    for (std::size_t r = 0; r < stopped.weights.size(); ++r) {
      CAPTURE(r);
      REQUIRE(stopped.weights[r].size() == reference.weights[r].size());
      // A rank without weights has empty vectors, whose data() may be null: memcmp must not
      // see it, even for 0 bytes (UBSan's nonnull-attribute check).
      if (!stopped.weights[r].empty())
        CHECK(std::memcmp(stopped.weights[r].data(), reference.weights[r].data(),
                          stopped.weights[r].size() * sizeof(float)) == 0);
    }
    // Without a request nobody stops.
    const Outcome full = train(name, layout, 12, -1);
    for (std::int64_t s : full.stops) CHECK(s == -1);
  }
}

TEST_CASE("stop_before a minibatch this rank has already started is an error") {
  const Sequential m = model();
  const PipelineLayout layout = PipelineLayout::straight({{0, 5}});
  const Schedule sched = schedule_for("1f1b-stash", layout, 8);
  run_local(1, [&](Communicator& comm) {
    StageExecutor ex(m, Shape{kFeatures}, DType::Float32, layout, comm, std::make_unique<Sgd>(),
                     {.seed = 3});
    const MinibatchFeed f = feed();
    std::string error;
    try {
      ex.train(
          sched, f, 0, [](std::int64_t) { return 0.05f; }, {},
          [&](std::int64_t p) {
            if (p == 3) ex.stop_before(2);
          });
    } catch (const Error& e) {
      error = e.what();
    }
    CHECK(error.find("decided too late") != std::string::npos);
  });
}

}  // namespace test_stop_agreement
