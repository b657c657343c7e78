// Interleaved 1F1B (and its zero-bubble form) executed: v = 2 stages per rank on 2, 3 and 4 ranks
// of the in-process communicator equal SequentialTrainer with gradient accumulation (a flush
// schedule), every stage of every rank, also over data-parallel pipelines; evaluation through the
// interleaved pipeline equals the straight one; and the layout comes from a partitioned,
// serialised plan.
#include <doctest/doctest.h>

#include <pipeline/comm/comms/local.hpp>
#include <pipeline/core/threads.hpp>
#include <pipeline/data/synthetic.hpp>
#include <pipeline/nn/layers/activation.hpp>
#include <pipeline/nn/layers/dropout.hpp>
#include <pipeline/nn/layers/linear.hpp>
#include <pipeline/optim/sgd.hpp>
#include <pipeline/plan/partition.hpp>
#include <pipeline/plan/plan_json.hpp>
#include <pipeline/runtime/sequential_trainer.hpp>
#include <pipeline/runtime/stage_executor.hpp>
#include <pipeline/schedule/generator.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <map>
#include <mutex>
#include <numeric>
#include <tuple>

#include "support/param_compare.hpp"
#include "support/synthetic_minibatches.hpp"

namespace test_interleaved_runtime {

using namespace pipeline;
using pipeline::testing::max_rel_diff;

namespace {

constexpr int kFeatures = 10;
constexpr int kClasses = 4;
constexpr int kBatch = 12;
constexpr float kLr = 0.05f;
constexpr std::uint64_t kSeed = 11;

// Eight layers, so that 4 ranks x 2 stages each get one or more.
Sequential deep_model() {
  Sequential m("interleaved-test-mlp");
  m.emplace<Linear>("fc1", kFeatures, 12);
  m.emplace<ReLU>("relu1");
  m.emplace<Linear>("fc2", 12, 12);
  m.emplace<ReLU>("relu2");
  m.emplace<Dropout>("drop", 0.2f);
  m.emplace<Linear>("fc3", 12, 12);
  m.emplace<ReLU>("relu3");
  m.emplace<Linear>("fc4", 12, kClasses);
  return m;
}

const auto make_sgd = pipeline::testing::momentum_sgd;
const pipeline::testing::SyntheticMinibatches minibatch(Shape{kFeatures}, kClasses, kBatch, 512, 5);

MinibatchFeed feed() { return minibatch.feed(); }

// v·p stages of the 8-layer model cut as evenly as the layers allow, stage k on rank k mod p.
PipelineLayout interleaved_layout(int ranks, int v) {
  const int stages = ranks * v, layers = 8;
  PipelineLayout l;
  for (int k = 0; k < stages; ++k) {
    l.stages.push_back({k * layers / stages, (k + 1) * layers / stages});
    l.stage_ranks.push_back({k % ranks});
  }
  return l;
}

struct Trained {
  std::mutex mutex;
  std::map<int, ModelParams> stage_params;  // stage -> its final weights
  std::vector<TrainResult> results;
  StageExecutor::Eval eval;
};

void run_interleaved(const Sequential& model, const PipelineLayout& layout, const Schedule& s,
                     Trained& out, std::int64_t eval_batches = 0,
                     std::vector<bool> recompute = {}) {
  out.results.assign(static_cast<std::size_t>(layout.num_ranks()), {});
  run_local(layout.num_ranks(), [&](Communicator& comm) {
    StageExecutor ex(model, Shape{kFeatures}, DType::Float32, layout, comm, make_sgd(),
                     {.seed = kSeed, .recompute = recompute});
    const TrainResult r = ex.train(s, feed(), 0, [](std::int64_t) { return kLr; });
    StageExecutor::Eval e;
    if (eval_batches > 0) e = ex.evaluate(feed(), eval_batches);
    std::lock_guard<std::mutex> lock(out.mutex);
    out.results[static_cast<std::size_t>(comm.rank())] = r;
    if (comm.rank() == 0) out.eval = e;
    for (int stage : ex.stages()) out.stage_params[stage] = ex.params(stage);
    CHECK(ex.stage() == ex.stages().front());
  });
}

}  // namespace

// Tolerance: every stage runs the same ops on the same microbatches in the same order as the
// single process (microbatch gradients accumulate in microbatch order), so the results are
// bitwise equal; the bound only guards against thread-count-dependent gemm blocking.
TEST_CASE("interleaved 1F1B (v = 2) equals SequentialTrainer on 2, 3 and 4 ranks") {
  set_num_threads(1);
  const Sequential model = deep_model();
  for (int p : {2, 3, 4}) {
    const int micro = p == 3 ? 6 : 4, minibatches = 3;
    CAPTURE(p);
    SequentialTrainer ref(model, model.init(kSeed), make_sgd(), kSeed);
    for (int j = 0; j < minibatches; ++j) ref.step(minibatch(j), kLr, micro);

    const PipelineLayout layout = interleaved_layout(p, 2);
    const Schedule s =
        generate_schedule("interleaved-1f1b", ScheduleSpec::interleaved(p, 2, micro, minibatches));
    REQUIRE(s.stage_ranks == layout.stage_ranks);
    Trained out;
    run_interleaved(model, layout, s, out);
    REQUIRE(out.stage_params.size() == static_cast<std::size_t>(2 * p));
    // The zero-bubble order (split backward, deferred W's) computes the same weights.
    Trained split;
    run_interleaved(
        model, layout,
        generate_schedule("interleaved-zb-h1", ScheduleSpec::interleaved(p, 2, micro, minibatches)),
        split);
    for (int k = 0; k < 2 * p; ++k)
      CHECK(max_rel_diff(split.stage_params[k], ref.params(), layout.stages[k]) <= 1e-6);
    const ModelParams init = model.init(kSeed);
    double moved = 0;
    for (int k = 0; k < 2 * p; ++k) {
      CAPTURE(k);
      CHECK(max_rel_diff(out.stage_params[k], ref.params(), layout.stages[k]) <= 1e-6);
      moved = std::max(moved, max_rel_diff(out.stage_params[k], init, layout.stages[k]));
    }
    CHECK(moved > 1e-3);  // the weights did train
    // Two optimizer steps per minibatch on every rank (one per stage it holds); the last
    // stage's rank scored every minibatch.
    for (const TrainResult& r : out.results) CHECK(r.steps == 2 * minibatches);
    const TrainResult& last = out.results[static_cast<std::size_t>(p - 1)];
    CHECK(last.minibatches == minibatches);
    CHECK(last.count == minibatches * kBatch);
    CHECK(std::isfinite(last.loss));
    CHECK(out.results[0].peak_memory.total_bytes > 0);

    // Larger groups of microbatches (a slow link's schedule) change the order, not the weights.
    ScheduleSpec grouped = ScheduleSpec::interleaved(p, 2, micro, minibatches);
    grouped.microbatch_group = 2 * p;
    Trained in_groups;
    run_interleaved(model, layout, generate_schedule("interleaved-1f1b", grouped), in_groups);
    for (int k = 0; k < 2 * p; ++k)
      CHECK(max_rel_diff(in_groups.stage_params[k], ref.params(), layout.stages[k]) <= 1e-6);

    // Stages that recompute their activations (every other one: each rank holds one of each)
    // give the same weights.
    std::vector<bool> recompute;
    for (int k = 0; k < 2 * p; ++k) recompute.push_back(k % 3 != 1);
    Trained again;
    run_interleaved(model, layout, s, again, 0, recompute);
    for (int k = 0; k < 2 * p; ++k)
      CHECK(max_rel_diff(again.stage_params[k], ref.params(), layout.stages[k]) <= 1e-6);
  }
}

// Data parallelism over interleaved pipelines: every stage's replicas sum their gradients, so the
// order of the sums differs from one process's (rounding only). Clipping takes the norm over
// every stage of every rank (each rank steps several stages, each replica counts once).
TEST_CASE(
    "interleaved 1F1B on 1 and 2 data-parallel pipelines equals SequentialTrainer, clipped or "
    "not") {
  set_num_threads(1);
  const Sequential model = deep_model();
  const int p = 2, v = 2, micro = 8, minibatches = 3;
  for (const auto& run : {std::pair{1, 0.05f}, {2, 0.f}, {2, 0.05f}}) {
    const int replicas = run.first;
    const float clip = run.second;
    CAPTURE(replicas);
    CAPTURE(clip);
    const ScheduleSpec spec = ScheduleSpec::interleaved(p, v, micro, minibatches, replicas);
    PipelineLayout layout = interleaved_layout(p, v);
    layout.stage_ranks = spec.stage_ranks;  // stage k on ranks k mod 2 (and 2 + k mod 2)
    const Schedule s = generate_schedule("interleaved-1f1b", spec);
    SequentialTrainer ref(model, model.init(kSeed), make_sgd(), kSeed, clip);
    for (int j = 0; j < minibatches; ++j) ref.step(minibatch(j), kLr, micro);
    std::mutex mutex;
    std::vector<std::pair<int, ModelParams>> replica_params;  // (stage, weights) of every replica
    std::vector<TrainResult> results(static_cast<std::size_t>(p * replicas));
    run_local(p * replicas, [&](Communicator& comm) {
      StageExecutor ex(model, Shape{kFeatures}, DType::Float32, layout, comm, make_sgd(),
                       {.seed = kSeed, .clip_norm = clip});
      const TrainResult r = ex.train(s, feed(), 0, [](std::int64_t) { return kLr; });
      std::lock_guard<std::mutex> lock(mutex);
      results[static_cast<std::size_t>(comm.rank())] = r;
      for (int stage : ex.stages()) replica_params.emplace_back(stage, ex.params(stage));
    });
    REQUIRE(replica_params.size() == static_cast<std::size_t>(p * v * replicas));
    for (const auto& entry : replica_params) {
      const int stage = entry.first;
      const ModelParams& params = entry.second;
      CAPTURE(stage);
      CHECK(max_rel_diff(params, ref.params(), layout.stages[static_cast<std::size_t>(stage)]) <=
            1e-5);
    }
    for (const TrainResult& r : results) CHECK(r.steps == v * minibatches);
    // The last stage's first replica reports whole minibatches (its replicas' statistics summed).
    const TrainResult& last = results[static_cast<std::size_t>(p - 1)];
    CHECK(last.minibatches == minibatches);
    CHECK(last.count == minibatches * kBatch);
  }
}

// ZB-V: 2p stages in a V (rank r holds stages r and 2p - 1 - r, so rank 0 both reads the inputs
// and scores the loss, and the activation between stages p - 1 and p stays on rank p - 1), any
// microbatch count; over data-parallel V pipelines with clipping the sums' order differs from one
// process's (rounding only).
TEST_CASE("zb-v equals SequentialTrainer on 2, 3 and 4 ranks and over data-parallel V pipelines") {
  set_num_threads(1);
  const Sequential model = deep_model();
  const int minibatches = 3;
  for (const auto& run : {std::tuple{2, 3, 1, 0.f},
                          {3, 5, 1, 0.f},
                          {4, 4, 1, 0.f},
                          {2, 6, 2, 0.05f},
                          {3, 7, 2, 0.f}}) {
    const int p = std::get<0>(run), micro = std::get<1>(run), replicas = std::get<2>(run);
    const float clip = std::get<3>(run);
    CAPTURE(p);
    CAPTURE(micro);
    CAPTURE(replicas);
    const ScheduleSpec spec = ScheduleSpec::v_shape(p, micro, minibatches, replicas);
    PipelineLayout layout = interleaved_layout(p, 2);
    layout.stage_ranks = spec.stage_ranks;
    const Schedule s = generate_schedule("zb-v", spec);
    SequentialTrainer ref(model, model.init(kSeed), make_sgd(), kSeed, clip);
    for (int j = 0; j < minibatches; ++j) ref.step(minibatch(j), kLr, micro);
    // Stages that recompute their activations too (each rank holds one that does).
    std::vector<bool> recompute;
    for (int k = 0; k < 2 * p; ++k) recompute.push_back(k < p);
    std::mutex mutex;
    std::vector<std::pair<int, ModelParams>> replica_params;  // (stage, weights) of every replica
    std::vector<TrainResult> results(static_cast<std::size_t>(p * replicas));
    run_local(p * replicas, [&](Communicator& comm) {
      StageExecutor ex(model, Shape{kFeatures}, DType::Float32, layout, comm, make_sgd(),
                       {.seed = kSeed, .clip_norm = clip, .recompute = recompute});
      const TrainResult r = ex.train(s, feed(), 0, [](std::int64_t) { return kLr; });
      std::lock_guard<std::mutex> lock(mutex);
      results[static_cast<std::size_t>(comm.rank())] = r;
      for (int stage : ex.stages()) replica_params.emplace_back(stage, ex.params(stage));
    });
    REQUIRE(replica_params.size() == static_cast<std::size_t>(2 * p * replicas));
    const double tolerance = replicas > 1 ? 1e-5 : 1e-6;
    for (const auto& entry : replica_params) {
      const int stage = entry.first;
      CAPTURE(stage);
      CHECK(max_rel_diff(entry.second, ref.params(),
                         layout.stages[static_cast<std::size_t>(stage)]) <= tolerance);
    }
    for (const TrainResult& r : results) CHECK(r.steps == 2 * minibatches);
    // Rank 0 holds the loss stage: it scored every minibatch (its replicas' statistics summed).
    CHECK(results[0].minibatches == minibatches);
    CHECK(results[0].count == minibatches * kBatch);
    CHECK(std::isfinite(results[0].loss));
  }
}

TEST_CASE(
    "interleaved plan: partitioned, written, read, trained, evaluated like the straight pipeline") {
  set_num_threads(1);
  const Sequential model = deep_model();
  // A profile of the model: equal layers, so the plan cuts 8 layers into 4 stages of 2.
  Profile prof;
  prof.model = model.name();
  prof.batch_size = kBatch;
  for (int i = 0; i < model.size(); ++i)
    prof.layers.push_back(
        {fmt::format("l{}", i), "X", 0.001, 0.002, 0, 0, 0, 0, 480, 100, 0, {}, false});
  PartitionOptions o;
  o.virtual_stages = 2;
  const Plan plan =
      parse_plan(plan_to_json(partition(prof, Topology{{{2, 1e10}}, {}}, o)).dump(), "plan.json");
  REQUIRE(plan.virtual_stages == 2);
  const PipelineLayout layout = PipelineLayout::from_plan(plan, model);
  CHECK(layout.stages_of(0) == std::vector<int>{0, 2});
  CHECK(layout.stages_of(1) == std::vector<int>{1, 3});
  const int micro = 4, minibatches = 2;
  const Schedule s =
      generate_schedule(plan.schedule, ScheduleSpec::from_plan(plan, micro, minibatches));
  Trained out;
  run_interleaved(model, layout, s, out, /*eval_batches=*/3);

  SequentialTrainer ref(model, model.init(kSeed), make_sgd(), kSeed);
  for (int j = 0; j < minibatches; ++j) ref.step(minibatch(j), kLr, micro);
  for (int k = 0; k < 4; ++k)
    CHECK(max_rel_diff(out.stage_params[k], ref.params(), layout.stages[k]) <= 1e-6);

  // The same weights through a straight 2-stage pipeline give the same evaluation.
  const PipelineLayout straight = PipelineLayout::straight({{0, 4}, {4, 8}});
  Trained flat;
  run_interleaved(model, straight,
                  generate_schedule("1f1b-flush", ScheduleSpec::straight(2, micro, minibatches)),
                  flat, 3);
  CHECK(out.eval.count == 3 * kBatch);
  CHECK(out.eval.loss == doctest::Approx(flat.eval.loss).epsilon(1e-6));
  CHECK(out.eval.accuracy == doctest::Approx(flat.eval.accuracy));

  // A rank of several stages holds them in an interleaved layout only.
  PipelineLayout bad = layout;
  bad.stage_ranks = {{0, 1}, {1}, {0}, {1}};
  CHECK_THROWS_AS(run_local(2,
                            [&](Communicator& comm) {
                              StageExecutor ex(model, Shape{kFeatures}, DType::Float32, bad, comm,
                                               make_sgd(), {.seed = kSeed});
                            }),
                  ConfigError);
}

}  // namespace test_interleaved_runtime
