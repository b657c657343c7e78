// Random plans as the partitioner emits them, for the tests that train every plan it can emit
// (tests/unit/test_plans_train.cpp on in-process CPU ranks, tests/mpi/test_plans_mpi.cpp over
// MPI, tests/gpu/test_gpu_plans.cpp on one GPU): a random MLP or small CNN, its profile (bytes
// measured, times drawn), a random topology of 2 to 6 workers on one or two levels, or a mixed
// cluster of fast and slow workers, partitioned with random options (straight or not, transfers
// ignored or not, interleaved where the layers allow, for 1F1B-stash or a flush schedule, some
// leaving workers idle), the
// plan passed through plan.json and back,
// and some stages marked to recompute as a user may mark them by hand.
#pragma once

#include <fmt/format.h>
#include <pipeline/core/rng.hpp>
#include <pipeline/nn/layers/activation.hpp>
#include <pipeline/nn/layers/conv2d.hpp>
#include <pipeline/nn/layers/dropout.hpp>
#include <pipeline/nn/layers/flatten.hpp>
#include <pipeline/nn/layers/linear.hpp>
#include <pipeline/nn/layers/pool2d.hpp>
#include <pipeline/plan/partition.hpp>
#include <pipeline/plan/plan_json.hpp>
#include <pipeline/plan/typed_partition.hpp>
#include <pipeline/profile/profiler.hpp>
#include <pipeline/runtime/in_process.hpp>
#include <pipeline/runtime/sequential_trainer.hpp>
#include <pipeline/runtime/stage_executor.hpp>
#include <pipeline/schedule/generator.hpp>
#include <pipeline/schedule/simulator.hpp>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "param_compare.hpp"
#include "stash_reference.hpp"
#include "synthetic_minibatches.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

namespace pipeline::testing {

inline constexpr int kPlanFeatures = 10;
inline constexpr int kPlanClasses = 4;
inline constexpr int kPlanBatch = 24;  // divisible by every flush microbatch count drawn below

// The CNNs' images: one channel of 8 x 8.
inline const Shape kPlanImage{1, 8, 8};

// Linear + ReLU pairs of the given widths, a dropout after the first pair (rate 0 keeps the
// layer, so one plan serves both), then the classifier.
inline Sequential plan_mlp(const std::vector<std::int64_t>& widths, float dropout) {
  Sequential m("random-mlp");
  std::int64_t in = kPlanFeatures;
  for (std::size_t i = 0; i < widths.size(); ++i) {
    m.emplace<Linear>("fc" + std::to_string(i), in, widths[i]);
    m.emplace<ReLU>("relu" + std::to_string(i));
    if (i == 0) m.emplace<Dropout>("drop", dropout);
    in = widths[i];
  }
  m.emplace<Linear>("head", in, kPlanClasses);
  return m;
}

// fashion-cnn's shape on 8 x 8 images: two convolutions of widths[0] and widths[1] channels, each
// with a ReLU and a 2 x 2 max pool (the ReLU runs after its pool inside a stage), a flatten, a
// Linear of widths[2] features with its ReLU and a dropout, then the classifier.
inline Sequential plan_cnn(const std::vector<std::int64_t>& widths, float dropout) {
  Sequential m("random-cnn");
  m.emplace<Conv2d>("conv1", 1, widths[0], 3, 1, 1);
  m.emplace<ReLU>("relu1");
  m.emplace<MaxPool2d>("pool1", 2);
  m.emplace<Conv2d>("conv2", widths[0], widths[1], 3, 1, 1);
  m.emplace<ReLU>("relu2");
  m.emplace<MaxPool2d>("pool2", 2);
  m.emplace<Flatten>("flatten");
  m.emplace<Linear>("fc1", widths[1] * 2 * 2, widths[2]);
  m.emplace<ReLU>("relu3");
  m.emplace<Dropout>("drop", dropout);
  m.emplace<Linear>("head", widths[2], kPlanClasses);
  return m;
}

struct RandomPlan {
  bool cnn = false;                  // plan_cnn, else plan_mlp
  std::vector<std::int64_t> widths;  // of that model
  Profile profile;
  Topology topology;
  Plan plan;
  std::vector<bool> recompute;  // per stage (empty: none recomputes)
  DeviceProfiles typed_profiles;  // for a mixed cluster: a profile per worker type (else empty)
  int workers = 0;                // that the plan uses
  int idle_workers = 0;           // that it leaves idle (--allow-idle)
  int flush_microbatches = 0;  // at least one per replica; for interleaved a multiple of the ranks
  int stash_minibatches = 0;   // dealt evenly to every stage's replicas (their allreduces pair up)
  bool vertical_sync = false;  // for 1F1B-stash

  // The model (its dropout at `dropout`) and one sample's shape.
  Sequential model(float dropout) const {
    return cnn ? plan_cnn(widths, dropout) : plan_mlp(widths, dropout);
  }
  Shape sample() const { return cnn ? kPlanImage : Shape{kPlanFeatures}; }
  // Minibatch j of kPlanBatch samples of that shape (the same data for every plan of the kind).
  const SyntheticMinibatches& minibatches() const {
    static const SyntheticMinibatches vectors(Shape{kPlanFeatures}, kPlanClasses, kPlanBatch, 480,
                                              9);
    static const SyntheticMinibatches images(kPlanImage, kPlanClasses, kPlanBatch, 480, 9);
    return cnn ? images : vectors;
  }

  int max_replicas() const {
    int r = 1;
    for (const PlanStage& s : plan.stages) r = std::max(r, s.replicas);
    return r;
  }
  bool recomputes() const { return std::count(recompute.begin(), recompute.end(), true) > 0; }
  // `schedule` timed by the simulator, each stage from its worker type's profile where typed.
  Simulation simulate_schedule(const Schedule& schedule) const {
    SimulateOptions options;
    if (!typed_profiles.empty()) options.device_profiles = &typed_profiles;
    return simulate(schedule, profile, plan, topology, options);
  }
  // "0:3x2 3:7r", with each stage's worker type on a mixed cluster ("fast@0:3"), for the log.
  std::string describe() const {
    std::string out;
    for (const PlanStage& s : plan.stages)
      out +=
          fmt::format("{}{}:{}{}{} ", s.device.empty() ? "" : s.device + "@", s.begin, s.end,
                      s.replicas > 1 ? fmt::format("x{}", s.replicas) : "", s.recompute ? "r" : "");
    return out;
  }
};

// `workers` > 0 fixes the cluster's size (a plan on a mixed cluster may still use fewer).
inline RandomPlan random_plan(Rng& rng, std::uint64_t seed, int workers = 0) {
  RandomPlan c;
  c.cnn = rng.below(3) == 0;
  c.widths.resize(c.cnn ? 3 : 2 + rng.below(4));
  for (auto& w : c.widths) w = 4 + static_cast<std::int64_t>(rng.below(c.cnn ? 13 : 29));
  // Measured bytes, drawn times: plans of every shape, the same on every run.
  c.profile = profile(c.model(0.2f), c.sample(), kPlanBatch, Device::cpu(),
                      {.warmup = 0, .repeat = 1, .seed = seed});
  for (LayerProfile& l : c.profile.layers) {
    l.forward_s = (l.parameter_bytes > 0 ? 1e-3 : 1e-4) * (0.2 + 2.8 * rng.uniform(0, 1));
    l.backward_s = 2 * l.forward_s * (0.7 + 0.6 * rng.uniform(0, 1));
    l.backward_input_s = l.backward_weight_s = 0;
  }
  c.workers = workers > 0 ? workers : 2 + static_cast<int>(rng.below(5));
  const double bandwidth = 1e8 * (1 + static_cast<double>(rng.below(100)));
  if (c.workers % 2 == 0 && rng.below(2) == 0)
    c.topology.levels = {{2, 1e10}, {c.workers / 2, bandwidth}};
  else
    c.topology.levels = {{c.workers, bandwidth}};
  PartitionOptions o;
  o.ignore_transfer = rng.below(3) == 0;
  o.straight = rng.below(4) == 0;
  const int kind = static_cast<int>(rng.below(5));
  Plan plan;
  if (kind == 0 && static_cast<int>(c.profile.layers.size()) >= 2 * (o.straight ? c.workers : 2)) {
    // Interleaved where the model has the cuts, for one pipeline of every worker or data-parallel
    // pipelines of 2 or more (a ReLU and the max pool after it stay together; where even 2 ranks
    // of 2 stages cannot be cut, the partitioner says so, and the plan is then a plain one).
    o.virtual_stages = 2;
    if (rng.below(2) == 0) o.placement = StagePlacement::V;  // zb-v's layout
    try {
      plan = partition(c.profile, c.topology, o);
    } catch (const ConfigError& e) {
      if (std::string(e.what()).find("cuts between layers") == std::string::npos) throw;
      o.virtual_stages = 1;
      o.placement = StagePlacement::Looped;
      plan = partition(c.profile, c.topology, o);
    }
  } else if (kind == 1) {
    // A mixed cluster: "fast" workers and "slow" ones 1.5-4x slower on every layer, one level;
    // the plan may leave workers of either type unused.
    const int fast = 1 + static_cast<int>(rng.below(static_cast<std::uint64_t>(c.workers - 1)));
    c.topology.levels = {{c.workers, bandwidth}};
    c.topology.types = {{"fast", fast}, {"slow", c.workers - fast}};
    c.typed_profiles = {{"fast", c.profile}, {"slow", c.profile}};
    const double slower = 1.5 + 2.5 * rng.uniform(0, 1);
    for (LayerProfile& l : c.typed_profiles.at("slow").layers) {
      l.forward_s *= slower;
      l.backward_s *= slower;
    }
    plan = partition_typed(c.typed_profiles, c.topology, o);
  } else if (kind == 2) {
    // Planned for a flush schedule: data-parallel copies of a straight pipeline.
    const char* flush[] = {"1f1b-flush", "zb-h1", "gpipe"};
    o.schedule = flush[rng.below(3)];
    const int counts[] = {2, 3, 4, 6, 8, 12};
    do o.microbatches = counts[rng.below(6)];
    while (o.microbatches < c.workers);
    plan = partition(c.profile, c.topology, o);
  } else {
    // Sometimes on as many workers as are worth it (PipeDream's --use_fewer_machines), over
    // links slow enough that fewer often are.
    o.allow_idle = rng.below(3) == 0;
    if (o.allow_idle) {
      o.ignore_transfer = false;
      const double slower = std::pow(10.0, 2 + static_cast<double>(rng.below(4)));
      for (TopologyLevel& level : c.topology.levels) level.bandwidth_bytes_per_s /= slower;
    }
    plan = partition(c.profile, c.topology, o);
  }
  // As the trainers run it: on the ranks it uses.
  c.plan = compact_ranks(parse_plan(plan_to_json(plan).dump(), "random plan"));
  c.idle_workers = plan.workers - c.plan.workers;
  c.workers = c.plan.workers;
  if (rng.below(3) == 0)
    for (PlanStage& s : c.plan.stages) c.recompute.push_back(s.recompute = rng.below(2) == 0);
  const int counts[] = {2, 3, 4, 6, 8, 12};
  if (c.plan.virtual_stages > 1)
    c.flush_microbatches = c.workers * (1 + static_cast<int>(rng.below(2)));
  else if (c.plan.microbatches > 0)
    c.flush_microbatches = c.plan.microbatches;  // what it was planned for
  else
    do c.flush_microbatches = counts[rng.below(6)];
    while (c.flush_microbatches < c.max_replicas());
  int whole = 1;
  for (const PlanStage& s : c.plan.stages) whole = std::lcm(whole, s.replicas);
  c.stash_minibatches = whole * ((6 + whole - 1) / whole);
  c.vertical_sync = rng.below(2) == 0;
  return c;
}

// 2BW's schedule for `plan` with the fewest microbatches it admits (at least `first`; each stage
// needs its warm-up forwards on every replica within one minibatch, and says so otherwise).
inline Schedule two_buffered_schedule_for(const Plan& plan, int first, int minibatches) {
  for (const int m : {first, 4, 6, 8, 12, 24}) {
    if (m < first) continue;
    try {
      return generate_schedule("2bw", ScheduleSpec::from_plan(plan, m, minibatches));
    } catch (const ConfigError& e) {
      if (std::string(e.what()).find("--microbatches") == std::string::npos) throw;
    }
  }
  throw ConfigError("2bw admits none of 4 to 24 microbatches for this plan");
}

// Each stage's final parameters (by stage, as the ranks reported them; the replicas of a stage end
// equal) against the parameters of the reference, over the stage's layers.
inline void check_stages(const std::map<int, ModelParams>& got, const ModelParams& want,
                         const PipelineLayout& layout, double tol) {
  REQUIRE(got.size() == static_cast<std::size_t>(layout.num_stages()));
  for (const auto& entry : got) {
    const int stage = entry.first;
    CAPTURE(stage);
    CHECK(max_rel_diff(entry.second, want, layout.stages[static_cast<std::size_t>(stage)]) <= tol);
  }
}

// The flush schedules' reference: the single process on `device`, `minibatches` steps of `micro`
// microbatches with gradient accumulation; its parameters on the host.
inline ModelParams sequential_run(const RandomPlan& c, const Sequential& model, int minibatches,
                                  int micro, std::uint64_t seed, float lr,
                                  Device device = Device::cpu()) {
  SequentialTrainer ref(model, to_device(model.init(seed), device), momentum_sgd(), seed);
  for (int j = 0; j < minibatches; ++j) ref.step(c.minibatches()(j), lr, micro);
  return to_device(ref.params(), Device::cpu());
}

// Trains `schedule` with every rank a thread of this process on `device` (on a GPU each with its
// own stream): each stage's final parameters on the host (a replicated stage's replicas end
// equal: the first to report stands for it).
inline std::map<int, ModelParams> train_in_process(const RandomPlan& c, const Sequential& model,
                                                   const PipelineLayout& layout,
                                                   const Schedule& schedule, std::uint64_t seed,
                                                   float lr, Device device = Device::cpu()) {
  std::mutex mutex;
  std::map<int, ModelParams> out;
  run_in_process(
      {.ranks = layout.num_ranks(), .device = device}, [&](Communicator& comm, Device d) {
        StageExecutor ex(model, c.sample(), DType::Float32, layout, comm, momentum_sgd(),
                         {.seed = seed, .device = d, .recompute = c.recompute});
        const TrainResult r =
            ex.train(schedule, c.minibatches().feed(), 0, [lr](std::int64_t) { return lr; });
        CHECK(std::isfinite(r.loss));
        std::lock_guard<std::mutex> lock(mutex);
        for (int stage : ex.stages())
          out.emplace(stage, to_device(ex.params(stage), Device::cpu()));
      });
  return out;
}

// A schedule of a plan, the model it trains and the weights its reference ends with.
struct ReferenceRun {
  Sequential model;
  Schedule schedule;
  ModelParams want;
};

// 2BW with the fewest microbatches the plan admits (at least `micro`) over `minibatches`, against
// the reference of double-buffered weights (SGD with momentum, the dropout of `c.model(0.2f)`).
inline ReferenceRun two_buffered_run(const RandomPlan& c, int micro, int minibatches,
                                     std::uint64_t seed, float lr) {
  ReferenceRun r{c.model(0.2f), two_buffered_schedule_for(c.plan, micro, minibatches), {}};
  r.want = two_buffered_reference(r.model, seed, lr, momentum_sgd, c.minibatches(), minibatches,
                                  r.schedule.microbatches);
  return r;
}

// 1F1B-stash with the plan's own in-flight counts and the drawn vertical sync, against the
// reference of weight stashing (the model without dropout: the reference draws no masks).
inline ReferenceRun stash_run(const RandomPlan& c, const PipelineLayout& layout, std::uint64_t seed,
                              float lr) {
  ScheduleSpec spec = ScheduleSpec::from_plan(c.plan, 1, c.stash_minibatches);
  spec.vertical_sync = c.vertical_sync;
  ReferenceRun r{c.model(0.f), generate_schedule("1f1b-stash", spec), {}};
  StashReference stash{r.model,       seed, lr, momentum_sgd,   c.minibatches(),
                       layout.stages, {},   {}, c.vertical_sync};
  stash.follow(r.schedule);
  r.want = stash.run(c.stash_minibatches);
  return r;
}

// The flush schedules that run a plan: interleaved 1F1B and its zero-bubble form for an
// interleaved plan (ZB-V for one in a V), else GPipe, 1F1B-flush and ZB-H1.
inline std::vector<std::string> flush_schedules(const Plan& plan) {
  if (placement_of(plan) == StagePlacement::V) return {"zb-v"};
  if (plan.virtual_stages > 1) return {"interleaved-1f1b", "interleaved-zb-h1"};
  return {"gpipe", "1f1b-flush", "zb-h1"};
}

}  // namespace pipeline::testing
