// Every plan the partitioner emits trains, the way a user reaches it: random models, profiles
// (measured bytes, random times) and cluster topologies are partitioned, the plan goes through
// plan.json and back, and each schedule kind generated from it validates, simulates and runs on
// the in-process communicator. Flush schedules (GPipe, 1F1B-flush, ZB-H1, interleaved 1F1B for
// interleaved plans) equal the single process with gradient accumulation; 1F1B-stash equals the
// independent reference of weight stashing with the plan's replicas, warm-ups and delays, with and
// without vertical sync; stages marked to recompute change nothing.
#include <doctest/doctest.h>

#include <pipeline/comm/comms/local.hpp>
#include <pipeline/core/rng.hpp>
#include <pipeline/core/threads.hpp>
#include <pipeline/nn/layers/activation.hpp>
#include <pipeline/nn/layers/dropout.hpp>
#include <pipeline/nn/layers/linear.hpp>
#include <pipeline/plan/partition.hpp>
#include <pipeline/plan/plan_json.hpp>
#include <pipeline/profile/profiler.hpp>
#include <pipeline/runtime/sequential_trainer.hpp>
#include <pipeline/runtime/stage_executor.hpp>
#include <pipeline/schedule/generator.hpp>
#include <pipeline/schedule/simulator.hpp>
#include <pipeline/schedule/validate.hpp>

#include "support/param_compare.hpp"
#include "support/stash_reference.hpp"
#include "support/synthetic_minibatches.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

namespace test_plans_train {

using namespace pipeline;
using pipeline::testing::max_rel_diff;
using pipeline::testing::StashReference;

namespace {

constexpr int kFeatures = 10;
constexpr int kClasses = 4;
constexpr int kBatch = 24;  // divisible by every microbatch count drawn below
constexpr float kLr = 0.05f;
constexpr std::uint64_t kSeed = 5;

const auto make_sgd = pipeline::testing::momentum_sgd;
const pipeline::testing::SyntheticMinibatches minibatch(Shape{kFeatures}, kClasses, kBatch, 480, 9);

// An MLP of Linear + ReLU pairs of the given widths, a dropout after the first pair (rate 0 keeps
// the layer, so one plan serves both), then the classifier.
Sequential mlp(const std::vector<std::int64_t>& widths, float dropout) {
  Sequential m("random-mlp");
  std::int64_t in = kFeatures;
  for (std::size_t i = 0; i < widths.size(); ++i) {
    m.emplace<Linear>("fc" + std::to_string(i), in, widths[i]);
    m.emplace<ReLU>("relu" + std::to_string(i));
    if (i == 0) m.emplace<Dropout>("drop", dropout);
    in = widths[i];
  }
  m.emplace<Linear>("head", in, kClasses);
  return m;
}

// "0:3x2 3:7" for the log.
std::string stages_of(const Plan& plan) {
  std::string out;
  for (const PlanStage& s : plan.stages)
    out += std::to_string(s.begin) + ":" + std::to_string(s.end) +
           (s.replicas > 1 ? "x" + std::to_string(s.replicas) : "") + (s.recompute ? "r " : " ");
  return out;
}

// Each rank's stages' final parameters, by stage.
std::map<int, ModelParams> train_plan(const Sequential& model, const PipelineLayout& layout,
                                      const Schedule& schedule,
                                      const std::vector<bool>& recompute) {
  std::mutex mutex;
  std::map<int, ModelParams> out;
  run_local(layout.num_ranks(), [&](Communicator& comm) {
    StageExecutor ex(model, Shape{kFeatures}, DType::Float32, layout, comm, make_sgd(),
                     {.seed = kSeed, .recompute = recompute});
    const TrainResult r = ex.train(schedule, minibatch.feed(), 0, [](std::int64_t) { return kLr; });
    CHECK(std::isfinite(r.loss));
    std::lock_guard<std::mutex> lock(mutex);
    // A replicated stage's replicas end equal; the first to report stands for the stage.
    for (int stage : ex.stages()) out.emplace(stage, ex.params(stage));
  });
  return out;
}

void check_stages(const std::map<int, ModelParams>& got, const ModelParams& want,
                  const PipelineLayout& layout, double tol) {
  REQUIRE(got.size() == static_cast<std::size_t>(layout.num_stages()));
  for (const auto& entry : got) {
    const int stage = entry.first;
    CAPTURE(stage);
    CHECK(max_rel_diff(entry.second, want, layout.stages[static_cast<std::size_t>(stage)]) <= tol);
  }
}

}  // namespace

TEST_CASE("random partitioner plans schedule, validate, simulate and train like their references") {
  set_num_threads(1);
  Rng rng(2026, "plans-train");
  int replicated = 0, interleaved = 0, recomputing = 0;
  for (int trial = 0; trial < 40; ++trial) {
    CAPTURE(trial);
    std::vector<std::int64_t> widths(2 + rng.below(4));
    for (auto& w : widths) w = 4 + static_cast<std::int64_t>(rng.below(29));
    const Sequential model = mlp(widths, 0.2f);
    const Sequential still = mlp(widths, 0.f);  // for the stash reference

    // Measured bytes, random times: plans of every shape, the same on every run.
    Profile prof = profile(model, Shape{kFeatures}, kBatch, Device::cpu(),
                           {.warmup = 0, .repeat = 1, .seed = kSeed});
    for (LayerProfile& l : prof.layers) {
      const bool weights = l.parameter_bytes > 0;
      l.forward_s = (weights ? 1e-3 : 1e-4) * (0.2 + 2.8 * rng.uniform(0, 1));
      l.backward_s = 2 * l.forward_s * (0.7 + 0.6 * rng.uniform(0, 1));
      l.backward_input_s = l.backward_weight_s = 0;
    }
    const int workers = 2 + static_cast<int>(rng.below(5));
    Topology topo;
    if (workers % 2 == 0 && rng.below(2) == 0)
      topo.levels = {{2, 1e10}, {workers / 2, 1e8 * (1 + static_cast<double>(rng.below(100)))}};
    else
      topo.levels = {{workers, 1e8 * (1 + static_cast<double>(rng.below(100)))}};
    PartitionOptions o;
    o.ignore_transfer = rng.below(3) == 0;
    o.straight = rng.below(4) == 0;
    const int layers = static_cast<int>(prof.layers.size());
    if (layers >= 2 * workers && rng.below(4) == 0) o.virtual_stages = 2;
    CAPTURE(workers);
    CAPTURE(layers);
    CAPTURE(o.virtual_stages);
    Plan plan = parse_plan(plan_to_json(partition(prof, topo, o)).dump(), "random plan");
    // Stages marked to recompute, as a user may mark them by hand.
    std::vector<bool> recompute;
    if (rng.below(3) == 0)
      for (PlanStage& s : plan.stages) recompute.push_back(s.recompute = rng.below(2) == 0);
    const PipelineLayout layout = PipelineLayout::from_plan(plan, model);
    int max_replicas = 1;
    for (const PlanStage& s : plan.stages) max_replicas = std::max(max_replicas, s.replicas);
    replicated += max_replicas > 1;
    interleaved += plan.virtual_stages > 1;
    recomputing += std::count(recompute.begin(), recompute.end(), true) > 0;
    CAPTURE(stages_of(plan));

    // Flush schedules against the single process.
    // Microbatches: at least one per replica; for an interleaved plan a multiple of the ranks.
    const int counts[] = {2, 3, 4, 6, 8, 12};
    int micro = 0;
    if (plan.virtual_stages > 1)
      micro = workers * (1 + static_cast<int>(rng.below(2)));
    else
      do micro = counts[rng.below(6)];
      while (micro < max_replicas);
    const int minibatches = 2;
    SequentialTrainer ref(model, model.init(kSeed), make_sgd(), kSeed);
    for (int j = 0; j < minibatches; ++j) ref.step(minibatch(j), kLr, micro);
    const std::vector<std::string> flush =
        plan.virtual_stages > 1 ? std::vector<std::string>{"interleaved-1f1b"}
                                : std::vector<std::string>{"gpipe", "1f1b-flush", "zb-h1"};
    for (const std::string& name : flush) {
      CAPTURE(name);
      CAPTURE(micro);
      const Schedule s = generate_schedule(name, ScheduleSpec::from_plan(plan, micro, minibatches));
      CHECK(validation_error(s).empty());
      CHECK(simulate(s, prof, plan, topo).samples_per_s > 0);
      check_stages(train_plan(model, layout, s, recompute), ref.params(), layout, 1e-5);
    }

    // 1F1B-stash with the plan's own in-flight counts against the reference of weight stashing.
    if (plan.virtual_stages == 1) {
      // Minibatches dealt evenly to every stage's replicas (their allreduces pair up).
      int whole = 1;
      for (const PlanStage& st : plan.stages) whole = std::lcm(whole, st.replicas);
      const int stash_minibatches = whole * ((6 + whole - 1) / whole);
      ScheduleSpec spec = ScheduleSpec::from_plan(plan, 1, stash_minibatches);
      spec.vertical_sync = rng.below(2) == 0;
      CAPTURE(spec.vertical_sync);
      const Schedule s = generate_schedule("1f1b-stash", spec);
      CHECK(validation_error(s).empty());
      CHECK(simulate(s, prof, plan, topo).samples_per_s > 0);
      std::vector<LayerRange> stages(layout.stages.begin(), layout.stages.end());
      StashReference stash{still,  kSeed, kLr, make_sgd,          minibatch,
                           stages, {},    {},  spec.vertical_sync};
      stash.follow(s);
      check_stages(train_plan(still, layout, s, recompute), stash.run(stash_minibatches), layout,
                   1e-5);
    }
  }
  MESSAGE("plans with replicated stages: " << replicated << ", interleaved: " << interleaved
                                           << ", with recomputing stages: " << recomputing);
  CHECK(replicated > 0);
  CHECK(interleaved > 0);
  CHECK(recomputing > 0);
}

}  // namespace test_plans_train
