// Activation recomputation and memory as measured: a recomputing stage trains exactly like a
// stashing one (dropout, batch norm, split backward) while holding fewer activation bytes; the
// partitioner recomputes the stages that would not fit otherwise; plan.json keeps the choice;
// the simulator charges the second forward and stashes only the input; and a run of the
// partitioner's own plan stays under its memory cap, near the simulator's estimate.
#include <doctest/doctest.h>

#include <pipeline/comm/comms/local.hpp>
#include <pipeline/core/threads.hpp>
#include <pipeline/data/synthetic.hpp>
#include <pipeline/nn/layers/activation.hpp>
#include <pipeline/nn/layers/batch_norm.hpp>
#include <pipeline/nn/layers/conv2d.hpp>
#include <pipeline/nn/layers/dropout.hpp>
#include <pipeline/nn/layers/flatten.hpp>
#include <pipeline/nn/layers/linear.hpp>
#include <pipeline/nn/zoo.hpp>
#include <pipeline/optim/sgd.hpp>
#include <pipeline/plan/partition.hpp>
#include <pipeline/plan/plan_json.hpp>
#include <pipeline/profile/profile_json.hpp>
#include <pipeline/profile/profiler.hpp>
#include <pipeline/runtime/stage_executor.hpp>
#include <pipeline/schedule/generator.hpp>
#include <pipeline/schedule/simulator.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <numeric>

namespace test_recompute {

using namespace pipeline;

namespace {

constexpr int kClasses = 5;
constexpr std::int64_t kBatch = 8;
constexpr float kLr = 0.05f;
constexpr std::uint64_t kSeed = 11;

// Dropout in two stages and batch norm (running statistics: buffers a second forward must not
// update again) in the first.
Sequential conv_model() {
  Sequential m("recompute-test-cnn");
  m.emplace<Conv2d>("conv1", 1, 4, 3, 1, 1);
  m.emplace<BatchNorm2d>("bn1", 4);
  m.emplace<ReLU>("relu1");
  m.emplace<Dropout>("drop1", 0.3f);
  m.emplace<Flatten>("flatten");
  m.emplace<Linear>("fc1", 4 * 6 * 6, 16);
  m.emplace<ReLU>("relu2");
  m.emplace<Dropout>("drop2", 0.2f);
  m.emplace<Linear>("fc2", 16, kClasses);
  return m;
}

MinibatchFeed synthetic_feed(Shape sample, std::int64_t batch) {
  auto data = std::make_shared<SyntheticDataset>(sample, kClasses, 4096, 3);
  return {[data, batch](std::int64_t j) {
            std::vector<std::int64_t> idx(static_cast<std::size_t>(batch));
            std::iota(idx.begin(), idx.end(), (j * batch) % (4096 - batch));
            return data->get(idx);
          },
          [batch](std::int64_t) { return batch; }};
}

// One pass, untimed: these tests read a profile's bytes, not its times.
Profile bytes_profile(const ZooModel& zoo, int batch, DType compute = DType::Float32) {
  ProfileOptions po;
  po.warmup = 0;
  po.repeat = 1;
  po.compute_dtype = compute;
  return profile(zoo, batch, Device::cpu(), po);
}

// Fashion-CNN's layers at 16x16 images: the same stages and memory terms at a third of the work
// (the memory tests train it under a dozen plans, in sanitized builds too). Not smaller: fc1's
// input would become smaller than its output, and a stage of fc1 alone would then peak at a
// forward's output (charged among the message buffers) rather than at a backward's input gradient.
ZooOptions small_images() {
  ZooOptions o;
  o.image_size = 16;
  return o;
}

std::unique_ptr<Optimizer> make_sgd() {
  return std::make_unique<Sgd>(SgdOptions{.momentum = 0.9f, .weight_decay = 1e-3f});
}

struct RankOutcome {
  ModelParams params;
  TrainResult result;
  StageMemory peak;
};

// Trains `schedule` on the layout with the given per-stage recomputation; each rank's outcome.
std::vector<RankOutcome> train(const Sequential& model, const Shape& sample,
                               const PipelineLayout& layout, const Schedule& schedule,
                               std::vector<bool> recompute, const MinibatchFeed& feed,
                               DType compute = DType::Float32, DType input = DType::Float32) {
  std::vector<RankOutcome> out(static_cast<std::size_t>(layout.num_ranks()));
  std::mutex m;
  run_local(layout.num_ranks(), [&](Communicator& comm) {
    StageExecutor ex(model, sample, input, layout, comm, make_sgd(),
                     {.seed = kSeed, .compute_dtype = compute, .recompute = recompute});
    TrainResult r = ex.train(schedule, feed, 0, [](std::int64_t) { return kLr; });
    std::lock_guard<std::mutex> lock(m);
    out[static_cast<std::size_t>(comm.rank())] = {ex.params(), r, ex.peak_memory()};
  });
  return out;
}

bool bitwise_equal(const ModelParams& a, const ModelParams& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t l = 0; l < a.size(); ++l) {
    auto same = [](const std::vector<Tensor>& x, const std::vector<Tensor>& y) {
      if (x.size() != y.size()) return false;
      for (std::size_t k = 0; k < x.size(); ++k)
        if (x[k].nbytes() != y[k].nbytes() ||
            std::memcmp(x[k].raw(), y[k].raw(), x[k].nbytes()) != 0)
          return false;
      return true;
    };
    if (!same(a[l].params, b[l].params) || !same(a[l].buffers, b[l].buffers)) return false;
  }
  return true;
}

// The schedule with every backward split into its input-gradient and weight-gradient halves,
// run back to back (the executor's I/W path).
Schedule split_backwards(const Schedule& s) {
  Schedule out = s;
  for (auto& actions : out.ranks) {
    std::vector<Action> split;
    for (const Action& a : actions) {
      if (a.kind != ActionKind::Backward) {
        split.push_back(a);
        continue;
      }
      Action i = a, w = a;
      i.kind = ActionKind::BackwardInput;
      w.kind = ActionKind::BackwardWeight;
      split.push_back(i);
      split.push_back(w);
    }
    actions = std::move(split);
  }
  return out;
}

// Four layers of 1 ms forward, 2 ms backward and 1 MB of parameters; the first two output
// 10 MB each, the last two 1 MB.
Profile uniform_profile() {
  Profile p;
  p.model = "uniform";
  p.batch_size = 32;
  for (int i = 0; i < 4; ++i) {
    LayerProfile l;
    l.name = fmt::format("l{}", i);
    l.kind = fmt::format("X");
    l.forward_s = 0.001;
    l.backward_s = 0.002;
    l.output_bytes = i < 2 ? 10'000'000 : 1'000'000;
    l.parameter_bytes = 1'000'000;
    p.layers.push_back(std::move(l));
  }
  return p;
}

// The smallest memory per worker (to 0.1%) for which partition() finds a plan.
double smallest_memory(const Profile& p, Topology t, const PartitionOptions& o) {
  double lo = 0, hi = 1e12;
  while (hi - lo > 1e-3 * hi) {
    t.memory_bytes_per_worker = 0.5 * (lo + hi);
    try {
      partition(p, t, o);
      hi = *t.memory_bytes_per_worker;
    } catch (const ConfigError&) {
      lo = *t.memory_bytes_per_worker;
    }
  }
  return hi;
}

}  // namespace

TEST_CASE("a recomputing stage trains bit for bit like a stashing one, with less activation memory") {
  set_num_threads(1);
  const Sequential model = conv_model();
  const Shape sample{1, 6, 6};
  const MinibatchFeed feed = synthetic_feed(sample, kBatch);
  const PipelineLayout layout{{{0, 4}, {4, 8}, {8, 9}}, {{0}, {1}, {2}}};
  struct Case {
    const char* name;
    Schedule schedule;
  };
  const Schedule flush = generate_schedule("1f1b-flush", ScheduleSpec::straight(3, 4, 3));
  const std::vector<Case> cases = {
      {"1f1b-stash", generate_schedule("1f1b-stash", ScheduleSpec::straight(3, 1, 8))},
      {"1f1b-flush", flush},
      {"1f1b-flush, split backward", split_backwards(flush)},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const auto stash = train(model, sample, layout, c.schedule, {}, feed);
    const auto recompute = train(model, sample, layout, c.schedule, {true, true, true}, feed);
    // Only the middle stage recomputes: mixed pipelines agree too.
    const auto mixed = train(model, sample, layout, c.schedule, {false, true, false}, feed);
    for (int r = 0; r < 3; ++r) {
      CAPTURE(r);
      CHECK(bitwise_equal(recompute[r].params, stash[r].params));
      CHECK(bitwise_equal(mixed[r].params, stash[r].params));
      const StageMemory& a = stash[r].peak;
      const StageMemory& b = recompute[r].peak;
      MESSAGE(std::string(c.name) << " rank " << r << ": activation bytes stashing " << a.activation_bytes
                     << ", recomputing " << b.activation_bytes);
      // Weights, gradients and optimizer state are the same bytes either way.
      CHECK(b.parameter_bytes == a.parameter_bytes);
      CHECK(b.gradient_bytes == a.gradient_bytes);
      CHECK(b.optimizer_bytes == a.optimizer_bytes);
      CHECK(b.stashed_weight_bytes == a.stashed_weight_bytes);
      CHECK(a.activation_bytes > 0);
      CHECK(b.activation_bytes <= a.activation_bytes);
      CHECK(a.total_bytes >= a.parameter_bytes + a.gradient_bytes);
      CHECK(recompute[r].result.peak_memory.total_bytes == b.total_bytes);
    }
    // The first stage keeps several microbatches in flight: recomputation saves there.
    CHECK(recompute[0].peak.activation_bytes < stash[0].peak.activation_bytes);
    CHECK(recompute[1].peak.activation_bytes < stash[1].peak.activation_bytes);
  }
}

// uniform_profile with a 20 MB first output and a 1 MB second one: the first two layers stash
// much, and pass little on.
Profile narrowing_profile() {
  Profile p = uniform_profile();
  p.layers[0].output_bytes = 20'000'000;
  p.layers[1].output_bytes = 1'000'000;
  return p;
}

TEST_CASE("the partitioner recomputes the stages that would not fit otherwise") {
  const Profile p = narrowing_profile();
  // Two workers: the first stage has 2 minibatches in flight, the second 1. Per worker
  // (parameters, gradient, momentum and stashed versions; activations and inputs in flight; the
  // input gradient; 4 posted receives and an unfinished send of the 1 MB message between the
  // stages):
  //   [0,2) stashing  2 MB·(2 + 1 + 1) + 21 MB·2 + 5 MB           = 55 MB; recomputing 34 MB
  //   [2,4) stashing  2 MB·(2 + 1)     + (2 + 1) MB + 1 MB + 5 MB = 15 MB
  // and every other split or replication needs more than 35 MB either way (data parallelism 35).
  Topology t{{{2, 1e10}}, 34.5e6};
  PartitionOptions o;
  o.recompute = Recompute::Auto;
  const Plan plan = partition(p, t, o);
  REQUIRE(plan.num_stages() == 2);
  CHECK(plan.stages[0].begin == 0);
  CHECK(plan.stages[0].end == 2);
  CHECK(plan.stages[0].recompute);
  CHECK_FALSE(plan.stages[1].recompute);
  CHECK(plan.stages[0].memory_bytes == doctest::Approx(34e6));
  CHECK(plan.stages[1].memory_bytes == doctest::Approx(15e6));
  // The second forward is charged to the recomputing stage: 2 · (1 + 2) + 2 · 1 ms.
  CHECK(plan.stages[0].compute_s == doctest::Approx(0.008));
  CHECK(plan.stages[1].compute_s == doctest::Approx(0.006));
  CHECK(plan.predicted.time_per_minibatch_s == doctest::Approx(0.008));

  // Without recomputation nothing fits, and the error says what would.
  o.recompute = Recompute::None;
  CHECK_THROWS_WITH_AS(partition(p, t, o), doctest::Contains("--recompute auto"), ConfigError);
  CHECK_THROWS_WITH_AS(evaluate_stages(p, t, parse_manual_stages("0:2,2:4"), o),
                       doctest::Contains("pass --recompute auto"), ConfigError);
  // A manual plan under auto recomputes where needed, like the search.
  o.recompute = Recompute::Auto;
  const Plan manual = evaluate_stages(p, t, parse_manual_stages("0:2,2:4"), o);
  CHECK(manual.stages[0].recompute);
  CHECK_FALSE(manual.stages[1].recompute);
  CHECK(manual.predicted.time_per_minibatch_s == doctest::Approx(0.008));

  // all: every stage, memory or not; auto without a cap: none.
  o.recompute = Recompute::All;
  const Plan all = partition(p, Topology{{{2, 1e10}}, {}}, o);
  for (const auto& s : all.stages) CHECK(s.recompute);
  o.recompute = Recompute::Auto;
  for (const auto& s : partition(p, Topology{{{2, 1e10}}, {}}, o).stages)
    CHECK_FALSE(s.recompute);
  o.cost_model = CostModel::PipeDream;
  o.recompute = Recompute::All;
  CHECK_THROWS_AS(partition(p, t, o), ConfigError);
  CHECK(parse_recompute("auto") == Recompute::Auto);
  CHECK_THROWS_AS(parse_recompute("sometimes"), ConfigError);
}

TEST_CASE("plan.json keeps the per-stage recompute choice; plans without it read as before") {
  const Profile p = narrowing_profile();
  PartitionOptions o;
  o.recompute = Recompute::Auto;
  const Plan plan = partition(p, Topology{{{2, 1e10}}, 34e6}, o);
  const nlohmann::json j = plan_to_json(plan);
  CHECK(j["stages"][0]["recompute"] == true);
  CHECK_FALSE(j["stages"][1].contains("recompute"));  // written only when true
  const Plan back = parse_plan(j.dump(), "round trip");
  CHECK(back.stages[0].recompute);
  CHECK_FALSE(back.stages[1].recompute);
  CHECK(plan_to_json(back) == j);

  const std::string old = R"({"format": "pipeline.plan/1", "workers": 2,
      "stages": [{"layers": [0, 2], "replicas": 1, "ranks": [0]},
                 {"layers": [2, 4], "replicas": 1, "ranks": [1]}]})";
  const Plan legacy = parse_plan(old, "old plan");
  CHECK_FALSE(legacy.stages[0].recompute);
  CHECK_FALSE(plan_to_json(legacy)["stages"][0].contains("recompute"));
  nlohmann::json bad = nlohmann::json::parse(old);
  bad["stages"][1]["recompute"] = "yes";
  CHECK_THROWS_WITH_AS(parse_plan(bad.dump(), "bad plan"), doctest::Contains("recompute"),
                       ConfigError);
}

TEST_CASE("the simulator charges the second forward and stashes only the stage input") {
  const Profile p = uniform_profile();
  // Planned, as simulated, on free links: PipeDream's in-flight counts.
  Plan plan = evaluate_stages(p, Topology{{{2, 1e18}}, {}}, parse_manual_stages("0:2,2:4"));
  const Schedule s = generate_schedule("1f1b-stash", ScheduleSpec::from_plan(plan, 1, 8));
  const Simulation stash = simulate(s, p, plan, Topology{});
  plan.stages[0].recompute = plan.stages[1].recompute = true;
  const Simulation rec = simulate(s, p, plan, Topology{});
  // Stage 0: per minibatch 20 MB of outputs (no received input); stage 1 2 MB and its 10 MB input.
  CHECK(stash.ranks[0].peak_activation_bytes == 2 * 20'000'000);
  CHECK(stash.ranks[1].peak_activation_bytes == 12'000'000);
  // Recomputing: the inputs in flight plus one minibatch's rebuilt outputs.
  CHECK(rec.ranks[0].peak_activation_bytes == 20'000'000);
  CHECK(rec.ranks[1].peak_activation_bytes == 10'000'000 + 2'000'000);
  // One more forward (2 ms) per minibatch on each rank.
  CHECK(rec.ranks[0].busy_s == doctest::Approx(stash.ranks[0].busy_s + 8 * 0.002));
  CHECK(rec.ranks[1].busy_s == doctest::Approx(stash.ranks[1].busy_s + 8 * 0.002));
  CHECK(rec.time_per_minibatch_s == doctest::Approx(0.008));
  CHECK(stash.time_per_minibatch_s == doctest::Approx(0.006));
  const StageTiming t = stage_timing(p, plan, 0, 1.0);
  CHECK(t.recompute);
  CHECK(t.backward_s == doctest::Approx(0.006));
  CHECK(t.activation_bytes == 0);
  CHECK(t.recompute_bytes == 20'000'000);
}

TEST_CASE("a run of the partitioner's own plan stays under the memory cap, near the simulator") {
  set_num_threads(1);
  // A narrow, deep MLP at a large batch: activations dominate the parameters.
  constexpr std::int64_t kIn = 32, kHidden = 64, batch = 256;
  Sequential model("recompute-test-mlp");
  model.emplace<Linear>("fc1", kIn, kHidden);
  model.emplace<ReLU>("relu1");
  model.emplace<Linear>("fc2", kHidden, kHidden);
  model.emplace<ReLU>("relu2");
  model.emplace<Linear>("fc3", kHidden, kHidden);
  model.emplace<ReLU>("relu3");
  model.emplace<Linear>("fc4", kHidden, kClasses);
  const Shape sample{kIn};
  Profile prof = profile(model, sample, static_cast<int>(batch), Device::cpu(),
                         {.warmup = 1, .repeat = 3, .seed = kSeed});
  // Measured bytes, fixed times: the same plan on every run.
  for (auto& l : prof.layers) {
    l.forward_s = 0.001;
    l.backward_s = 0.002;
    l.backward_input_s = l.backward_weight_s = 0;
  }
  const int workers = 3;
  Topology topo{{{workers, 1e10}}, {}};
  PartitionOptions o;
  o.recompute = Recompute::Auto;
  o.ignore_transfer = true;
  o.straight = true;
  // A cap between the smallest memory any stash-everything plan needs and the smallest with
  // recomputation.
  o.recompute = Recompute::None;
  const double stash_min = smallest_memory(prof, topo, o);
  o.recompute = Recompute::Auto;
  const double recompute_min = smallest_memory(prof, topo, o);
  MESSAGE("smallest memory per worker: stashing " << stash_min << " B, recomputing "
                                                  << recompute_min << " B");
  REQUIRE(recompute_min < 0.95 * stash_min);
  topo.memory_bytes_per_worker = 0.5 * (stash_min + recompute_min);
  const double cap = *topo.memory_bytes_per_worker;
  o.recompute = Recompute::None;
  CHECK_THROWS_WITH_AS(partition(prof, topo, o), doctest::Contains("--recompute auto"),
                       ConfigError);
  o.recompute = Recompute::Auto;
  const Plan plan = partition(prof, topo, o);
  bool any = false;
  for (const auto& s : plan.stages) {
    any = any || s.recompute;
    CHECK(s.memory_bytes <= cap);
  }
  CHECK(any);

  PipelineLayout layout;
  std::vector<bool> recompute;
  for (const auto& s : plan.stages) {
    layout.stages.push_back({s.begin, s.end});
    layout.stage_ranks.push_back(s.ranks);
    recompute.push_back(s.recompute);
  }
  const int minibatches = 12;
  const Schedule schedule =
      generate_schedule("1f1b-stash", ScheduleSpec::from_plan(plan, 1, minibatches));
  const auto outcome =
      train(model, sample, layout, schedule, recompute, synthetic_feed(sample, batch));
  const Simulation sim = simulate(schedule, prof, plan, Topology{});
  for (int r = 0; r < layout.num_ranks(); ++r) {
    const StageMemory& m = outcome[r].peak;
    const int s = layout.stage_of(r);
    const auto& sr = sim.ranks[static_cast<std::size_t>(r)];
    const double weights = static_cast<double>(m.parameter_bytes + m.stashed_weight_bytes);
    // (The input stage's microbatches of input data, which the plan and the simulator count only
    // where it recomputes.)
    const double data =
        s == 0 && !recompute[s]
            ? static_cast<double>(outcome[r].result.peak_in_flight * batch * kIn * 4)
            : 0.0;
    MESSAGE("rank " << r << " stage " << s << std::string(recompute[s] ? " (recomputing)" : "")
                    << ": measured peak " << m.total_bytes << " B (activations "
                    << m.activation_bytes << ", weights " << weights << "), planned "
                    << plan.stages[s].memory_bytes << ", cap " << cap
                    << "; simulated activations " << sr.peak_activation_bytes << ", weights "
                    << sr.peak_weight_bytes);
    // What the rank holds stays under the cap (but for a stashing input stage's microbatches of
    // input data, which its layers keep as they keep them).
    CHECK(static_cast<double>(m.total_bytes) - data <= cap);
    // Measured against the simulator's estimate: weight versions to 2%; activations within 35%
    // (the simulator charges each layer's saved bytes, or its output where the profile has no
    // saved bytes, and the received input; the runtime holds what the layers save and the input
    // gradient of the backward in progress), with that input data added.
    CHECK(weights == doctest::Approx(static_cast<double>(sr.peak_weight_bytes)).epsilon(0.02));
    CHECK(static_cast<double>(m.activation_bytes) ==
          doctest::Approx(static_cast<double>(sr.peak_activation_bytes) + data).epsilon(0.35));
  }
}

TEST_CASE("the planner's memory per stage is what the executor holds, stage inputs counted once") {
  set_num_threads(1);
  const ZooModel zoo = make_model("fashion-cnn", small_images());
  constexpr int batch = 16;
  const Profile prof = bytes_profile(zoo, batch);
  // conv2 keeps pool1's output, fc1 the flattened pool2 output, relu3 fc1's output: each is the
  // input a stage starting there receives, and the stage holds it once.
  auto layer = [&](std::string_view name) -> const LayerProfile& {
    for (const LayerProfile& l : prof.layers)
      if (l.name == name) return l;
    FAIL("no layer " << name);
    return prof.layers.front();
  };
  for (const char* name : {"conv2", "fc1", "relu3"}) {
    const LayerProfile& l = layer(name);
    CAPTURE(name);
    CHECK(l.saved_input_bytes > 0);
    CHECK(l.saved_input_bytes <= l.saved_bytes);
  }
  CHECK(layer("conv1").saved_input_bytes == 0);  // the model's input is no layer's output
  CHECK(layer("pool1").saved_input_bytes == 0);  // keeps its argmax indices, not its input

  const Topology topo{{{4, 1e10}}, {}};
  PartitionOptions o;
  o.ignore_transfer = true;
  // Trains a plan's stages under 1F1B-stash, 12 minibatches: what each rank held.
  auto held_by_executor = [&](const Plan& p, DType dtype = DType::Float32) {
    PipelineLayout l;
    for (const auto& s : p.stages) {
      l.stages.push_back({s.begin, s.end});
      l.stage_ranks.push_back(s.ranks);
    }
    return train(zoo.model, zoo.sample_shape, l,
                 generate_schedule("1f1b-stash", ScheduleSpec::from_plan(p, 1, 12)), {},
                 synthetic_feed(zoo.sample_shape, batch), dtype);
  };
  const Plan plan = evaluate_stages(prof, topo, parse_manual_stages("0:3,3:7,7:8,8:10"), o);
  const auto outcome = held_by_executor(plan);
  for (int r = 0; r < plan.num_stages(); ++r) {
    const double measured =
        static_cast<double>(outcome[static_cast<std::size_t>(r)].peak.total_bytes);
    // The executor counts what it holds; the plan's working memory of a pass (the conv's
    // lowering buffers) is the allocator's to measure (example.memory_model).
    const PlanStage& ps = plan.stages[static_cast<std::size_t>(r)];
    const double planned = ps.memory_bytes - ps.workspace_bytes;
    MESSAGE("stage " << r << ": measured peak " << measured << " B, planned " << planned
                     << " B besides working memory " << ps.workspace_bytes << " B");
    if (r > 0) {
      CHECK(measured == doctest::Approx(planned).epsilon(0.01));
    } else {
      // The input stage peaks after a forward, its output not yet handed over beside its four
      // stashed minibatches; the model charges the later stages' larger input gradient instead.
      const double output = static_cast<double>(prof.layers[2].output_bytes);
      CHECK(measured >= planned);
      CHECK(measured <= planned + 1.01 * output);
    }
  }

  // A stage that starts at relu1 runs pool1 first on the conv output it receives, which neither
  // keeps (the ReLU keeps the pooled tensor); one that ends at relu2 runs it on the full tensor
  // and keeps that (LayerProfile::at_stage_end), and the next stage starts at pool2, which keeps
  // its indices only. Those stages free their received input after the forward
  // (LayerProfile::frees_input); a ReLU that ends a stage works in place on what it received and
  // keeps that. The plan holds what the executor holds there too.
  for (const char* name : {"relu1", "pool1", "relu2", "pool2"}) {
    CAPTURE(name);
    CHECK(layer(name).frees_input);
    CHECK(layer(name).saved_input_bytes == 0);
  }
  for (const char* name : {"relu1", "relu2"}) {
    CAPTURE(name);
    const StageEndCosts& e = *layer(name).at_stage_end;
    CHECK_FALSE(e.frees_input);
    CHECK(e.saved_input_bytes == e.saved_bytes);
  }
  for (const char* name : {"conv1", "conv2", "flatten", "fc1", "relu3", "fc2"}) {
    CAPTURE(name);  // keeps its input, returns a view of it, or reads the model's input
    CHECK_FALSE(layer(name).frees_input);
  }
  // What each layer's backward holds at once of gradients: conv1 makes no input gradient (nothing
  // under it trains), pool1 reads the pooled gradient and makes the full one, flatten's is a view
  // of the one it reads, and relu1 ending a stage works on full tensors.
  const auto out = [&](std::string_view name) { return layer(name).output_bytes; };
  CHECK(layer("conv1").gradient_bytes == out("conv1"));
  CHECK(layer("pool1").gradient_bytes == out("pool1") + out("conv1"));
  CHECK(layer("flatten").gradient_bytes == out("flatten"));
  CHECK(layer("relu1").at_stage_end->gradient_bytes == 2 * out("relu1"));
  CHECK(layer("fc1").gradient_bytes == out("fc1") + out("flatten"));
  // The single-layer stages [relu1] and [relu2] end inside their pairs (as_last_of_stage).
  for (const char* stages : {"0:1,1:5,5:10", "0:1,1:2,2:10", "0:4,4:5,5:10"}) {
    CAPTURE(stages);
    const Plan cut =
        evaluate_stages(prof, Topology{{{3, 1e10}}, {}}, parse_manual_stages(stages), o);
    const auto cut_outcome = held_by_executor(cut);
    for (std::size_t r = 1; r < cut.stages.size(); ++r) {
      const PlanStage& ps = cut.stages[r];
      CAPTURE(r);
      CHECK(static_cast<double>(cut_outcome[r].peak.total_bytes) ==
            doctest::Approx(ps.memory_bytes - ps.workspace_bytes).epsilon(0.01));
    }
  }

  // The optimizer's state: AdamW's two moments cost one copy of the weights more than momentum.
  CHECK(optimizer_state_copies("sgd") == 0);
  CHECK(optimizer_state_copies("momentum") == 1);
  o.optimizer_state_factor = optimizer_state_copies("adamw");
  const Plan adamw = evaluate_stages(prof, topo, parse_manual_stages("0:3,3:7,7:8,8:10"), o);
  for (std::size_t k = 0; k < plan.stages.size(); ++k) {
    double weights = 0;
    for (int l = plan.stages[k].begin; l < plan.stages[k].end; ++l)
      weights += static_cast<double>(prof.layers[static_cast<std::size_t>(l)].parameter_bytes);
    CHECK(adamw.stages[k].memory_bytes - plan.stages[k].memory_bytes == doctest::Approx(weights));
  }
  CHECK_THROWS_WITH_AS(optimizer_state_copies("rmsprop"),
                       doctest::Contains("use sgd, momentum or adamw"), ConfigError);

  // bf16 mixed precision: the stashed weight versions keep their matrices in bf16. A bf16 profile
  // says how many bytes that leaves per version, and the plan and the executor agree again.
  const Profile bf16 = bytes_profile(zoo, batch, DType::BFloat16);
  CHECK(bf16.dtype == "bfloat16");
  for (std::size_t l = 0; l < bf16.layers.size(); ++l) {
    const LayerProfile& b = bf16.layers[l];
    CAPTURE(b.name);
    CHECK(b.parameter_bytes == prof.layers[l].parameter_bytes);
    if (b.kind == "Conv2d" || b.kind == "Linear") {
      CHECK(b.stashed_parameter_bytes < b.parameter_bytes);
      CHECK(b.stashed_parameter_bytes > b.parameter_bytes / 2);  // the bias stays float32
    }
    if (b.kind == "Conv2d") {  // it keeps its input as the products read it, in bf16
      CHECK(b.saved_bytes * 2 == prof.layers[l].saved_bytes);
      CHECK(b.frees_input == (l > 0));  // (the model's input is the data's, not a layer's)
    }
    CHECK(version_bytes(b) <= b.parameter_bytes);
  }
  o.optimizer_state_factor = optimizer_state_copies("momentum");  // make_sgd's
  const Plan plan16 = evaluate_stages(bf16, topo, parse_manual_stages("0:3,3:7,7:8,8:10"), o);
  const Plan plan32 = evaluate_stages(prof, topo, parse_manual_stages("0:3,3:7,7:8,8:10"), o);
  CHECK(plan16.dtype == "bfloat16");  // the trainers' default --dtype for this plan
  CHECK(plan32.dtype.empty());
  const auto outcome16 = held_by_executor(plan, DType::BFloat16);
  for (int r = 1; r < plan.num_stages(); ++r) {
    const PlanStage& s16 = plan16.stages[static_cast<std::size_t>(r)];
    const PlanStage& s32 = plan32.stages[static_cast<std::size_t>(r)];
    const double measured =
        static_cast<double>(outcome16[static_cast<std::size_t>(r)].peak.total_bytes);
    const double held16 = s16.memory_bytes - s16.workspace_bytes;
    const double held32 = s32.memory_bytes - s32.workspace_bytes;
    MESSAGE("bf16 stage " << r << ": measured peak " << measured << " B, planned " << held16
                          << " B (float32: " << held32 << " B) besides working memory");
    CHECK(measured == doctest::Approx(held16).epsilon(0.01));
    double saved = 0;  // per stashed version
    for (int l = s16.begin; l < s16.end; ++l)
      saved += static_cast<double>(bf16.layers[static_cast<std::size_t>(l)].parameter_bytes -
                                   version_bytes(bf16.layers[static_cast<std::size_t>(l)]));
    // The weight versions, and where the stage holds a convolution its kept inputs too.
    const bool convolution =
        std::any_of(bf16.layers.begin() + s16.begin, bf16.layers.begin() + s16.end,
                    [](const LayerProfile& l) { return l.kind == "Conv2d"; });
    if (convolution)
      CHECK(held32 - held16 > saved * (s16.in_flight - 1));
    else
      CHECK(held32 - held16 == doctest::Approx(saved * (s16.in_flight - 1)));
  }

  // Plain data parallelism, a replicated input stage: its replicas load their minibatches together
  // and never delay their allreduce, so no second gradient set is charged (it was: 1.6x the
  // measured peak), and the estimate holds again.
  o.optimizer_state_factor = optimizer_state_copies("momentum");
  const Plan dp =
      evaluate_stages(prof, Topology{{{2, 1e10}}, {}}, parse_manual_stages("0:10x2"), o);
  REQUIRE(dp.stages.size() == 1);
  const PipelineLayout dp_layout{{{0, 10}}, {{0, 1}}};
  const Schedule dp_schedule = generate_schedule("1f1b-stash", ScheduleSpec::from_plan(dp, 1, 12));
  const auto dp_out = train(zoo.model, zoo.sample_shape, dp_layout, dp_schedule, {},
                            synthetic_feed(zoo.sample_shape, batch));
  for (int r = 0; r < 2; ++r) {
    const double measured =
        static_cast<double>(dp_out[static_cast<std::size_t>(r)].peak.total_bytes);
    const double held = dp.stages[0].memory_bytes - dp.stages[0].workspace_bytes;
    MESSAGE("data parallel rank " << r << ": measured peak " << measured << " B, planned " << held
                                  << " B besides working memory");
    CHECK(measured == doctest::Approx(held).epsilon(0.01));
  }
}

TEST_CASE("the last stage holds the loss's gradient of each minibatch in flight, as planned") {
  // A language model's logits are wider than the hidden state its last stage receives: the loss's
  // gradient, made at the forward and read by the backward, is what that stage holds most of
  // beside its records.
  set_num_threads(1);
  ZooOptions zo;
  zo.dim = 32;
  zo.heads = 2;
  zo.blocks = 2;
  zo.seq_len = 16;
  const ZooModel zoo = make_model("transformer-lm", zo);
  constexpr std::int64_t batch = 4;
  const Profile prof = bytes_profile(zoo, batch);
  const std::int64_t loss_gradient = batch * zo.seq_len * zo.vocab * 4;  // float32 logits
  CHECK(prof.loss_gradient_bytes == loss_gradient);
  CHECK(profile_from_json(profile_to_json(prof), "round trip").loss_gradient_bytes ==
        loss_gradient);
  const std::int64_t tokens = batch * zo.seq_len * 4;  // the model's input: int32 token ids
  CHECK(prof.input_bytes == tokens);
  CHECK(profile_from_json(profile_to_json(prof), "round trip").input_bytes == tokens);

  const Topology topo{{{2, 1e10}}, {}};
  PartitionOptions o;
  o.ignore_transfer = true;
  o.optimizer_state_factor = optimizer_state_copies("momentum");  // make_sgd's
  const std::vector<ManualStage> stages =
      parse_manual_stages("0:2,2:5");  // embed, block1 | block2, ln_f, head
  const Plan plan = evaluate_stages(prof, topo, stages, o);
  Profile unknown = prof;  // an imported profile says nothing of the loss
  unknown.loss_gradient_bytes = 0;
  const Plan uncharged = evaluate_stages(unknown, topo, stages, o);
  const double input = static_cast<double>(prof.layers[1].output_bytes);
  REQUIRE(static_cast<double>(loss_gradient) > 2 * input);

  const PipelineLayout layout = PipelineLayout::from_plan(plan, zoo.model);
  const MinibatchFeed feed{[&](std::int64_t j) {
                             Batch b;
                             b.inputs = Tensor::empty(zoo.input_shape(batch), DType::Int32);
                             b.labels = Tensor::empty(zoo.input_shape(batch), DType::Int32);
                             std::int32_t* x = b.inputs.data<std::int32_t>();
                             std::int32_t* y = b.labels.data<std::int32_t>();
                             for (std::int64_t i = 0; i < b.inputs.numel(); ++i) {
                               x[i] = static_cast<std::int32_t>((i * 7 + j) % zo.vocab);
                               y[i] = static_cast<std::int32_t>((i * 5 + 3 * j) % zo.vocab);
                             }
                             return b;
                           },
                           [](std::int64_t) { return batch; }};
  for (const bool recompute : {false, true}) {
    CAPTURE(recompute);
    PartitionOptions ro = o;
    ro.recompute = recompute ? Recompute::All : Recompute::None;
    const Plan p = recompute ? evaluate_stages(prof, topo, stages, ro) : plan;
    const Plan q = recompute ? evaluate_stages(unknown, topo, stages, ro) : uncharged;
    const auto outcome = train(zoo.model, zoo.sample_shape, layout,
                               generate_schedule("1f1b-stash", ScheduleSpec::from_plan(p, 1, 8)),
                               {recompute, recompute}, feed, DType::Float32, DType::Int32);
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      const PlanStage& s = p.stages[static_cast<std::size_t>(r)];
      const PlanStage& before = q.stages[static_cast<std::size_t>(r)];
      const double measured =
          static_cast<double>(outcome[static_cast<std::size_t>(r)].peak.total_bytes);
      const double held = s.memory_bytes - s.workspace_bytes;
      MESSAGE("stage " << r << std::string(recompute ? " (recomputing)" : "") << ": measured peak "
                       << measured << " B, planned " << held << " B besides working memory, "
                       << before.memory_bytes - before.workspace_bytes
                       << " B without the loss's gradient");
      if (r == 0) {
        CHECK(s.memory_bytes == before.memory_bytes);  // the first stage holds none of it
        if (recompute) {
          // It keeps the model's input per minibatch in flight to run its forward again from
          // (which it was charged none of). Its embedding keeps the token ids too, which the
          // estimate counts again for the backward in progress: over by one minibatch's.
          CHECK(measured <= held);
          CHECK(held - measured <= static_cast<double>(tokens));
          Profile no_input = prof;
          no_input.input_bytes = 0;
          const Plan uncounted = evaluate_stages(no_input, topo, stages, ro);
          CHECK(s.memory_bytes - uncounted.stages[0].memory_bytes ==
                doctest::Approx(static_cast<double>(tokens * s.in_flight)));
        }
        continue;
      }
      if (recompute) {
        // The executor counts between passes, where a recomputing stage never holds its records
        // and the loss's gradient at once; inside its backward it does, which the allocator sees.
        CHECK(measured <= held);
      } else {
        CHECK(measured == doctest::Approx(held).epsilon(0.01));
      }
      // One minibatch in flight on the last stage: the loss's gradient instead of an input
      // gradient as large as the input, and what a layer's backward holds beyond it.
      CHECK(held - (before.memory_bytes - before.workspace_bytes) ==
            doctest::Approx(static_cast<double>(loss_gradient) - input));
      CHECK(s.memory_bytes <= before.memory_bytes + static_cast<double>(loss_gradient) - input);
    }
  }
}

TEST_CASE("the simulator's memory under every schedule kind is what the executor holds") {
  // What pipeline-simulate predicts of a plan under a schedule the partitioner did not plan for
  // (flush schedules, other microbatch counts, replicas that delay their allreduce): activations,
  // weight versions, gradient sets and optimizer state at once, against what the executor holds.
  set_num_threads(1);
  const ZooModel zoo = make_model("fashion-cnn", small_images());
  constexpr int microbatch = 16;
  const Profile prof = bytes_profile(zoo, microbatch);
  PartitionOptions o;
  o.ignore_transfer = true;
  o.optimizer = "momentum";  // make_sgd's
  struct Case {
    const char* stages;
    const char* schedule;
    int microbatches;
  };
  for (const Case& c : {Case{"0:4,4:10", "1f1b-stash", 1}, Case{"0:4,4:10", "gpipe", 4},
                        Case{"0:4,4:10", "1f1b-flush", 4}, Case{"0:4,4:10", "zb-h1", 4},
                        Case{"0:4,4:10x2", "1f1b-stash", 1}, Case{"0:4,4:10x2", "1f1b-flush", 2},
                        // Every stage keeps the versions its microbatches on their way will ask
                        // for (the last stage's were one short).
                        Case{"0:3,3:7,7:10", "1f1b-stash-vsync", 1}}) {
    CAPTURE(c.stages);
    CAPTURE(c.schedule);
    const std::vector<ManualStage> stages = parse_manual_stages(c.stages);
    int workers = 0;
    for (const ManualStage& s : stages) workers += s.replicas;
    const Plan plan = evaluate_stages(prof, Topology{{{workers, 1e10}}, {}}, stages, o);
    const PipelineLayout layout = PipelineLayout::from_plan(plan, zoo.model);
    const Schedule schedule =
        generate_schedule(c.schedule, ScheduleSpec::from_plan(plan, c.microbatches, 6));
    const std::int64_t minibatch = std::int64_t{microbatch} * c.microbatches;
    const auto outcome = train(zoo.model, zoo.sample_shape, layout, schedule, {},
                               synthetic_feed(zoo.sample_shape, minibatch));
    const Simulation sim =
        simulate(schedule, prof, plan, Topology{}, {.microbatch_size = microbatch});
    for (int r = 0; r < layout.num_ranks(); ++r) {
      CAPTURE(r);
      const StageMemory& m = outcome[static_cast<std::size_t>(r)].peak;
      const RankSimulation& sr = sim.ranks[static_cast<std::size_t>(r)];
      const std::int64_t held = sr.peak_memory_bytes - sr.workspace_bytes;
      MESSAGE(std::string(c.stages)
              << " " << std::string(c.schedule) << " rank " << r << ": measured " << m.total_bytes
              << " B (gradients " << m.gradient_bytes << ", optimizer " << m.optimizer_bytes
              << ", activations " << m.activation_bytes << ", weights "
              << m.parameter_bytes + m.stashed_weight_bytes << "), simulated " << held
              << " B (state " << sr.peak_state_bytes << ", activations " << sr.peak_activation_bytes
              << ", weights " << sr.peak_weight_bytes << ")");
      const auto measured = static_cast<double>(m.total_bytes);
      const bool vsync = std::string_view(c.schedule) == "1f1b-stash-vsync";
      if (r > 0 && vsync) {
        // The same versions at most; the simulated total peaks at a step, between the
        // microbatches, the measured one at a forward, with a microbatch's activations.
        CHECK(m.parameter_bytes + m.stashed_weight_bytes == sr.peak_weight_bytes);
        CHECK(measured == doctest::Approx(static_cast<double>(held)).epsilon(0.01));
      } else if (r > 0) {
        CHECK(measured == doctest::Approx(static_cast<double>(held)).epsilon(0.001));
      } else {
        // The input stage also holds its minibatch of data, which a profile charges only to a
        // recomputing stage, and an output from its forward to its send, which the plan counts
        // among the message buffers.
        const std::int64_t data = minibatch * zoo.sample_shape.numel() * 4;
        CHECK(m.total_bytes >= held);
        CHECK(m.total_bytes <= held + data + prof.layers[3].output_bytes);
      }
      // Under the schedule it plans for, the simulator charges what the partitioner does.
      if (std::string_view(c.schedule) == "1f1b-stash" && workers == 2)
        CHECK(static_cast<double>(sr.peak_memory_bytes) ==
              doctest::Approx(plan.stages[static_cast<std::size_t>(r)].memory_bytes));
    }
  }
}

}  // namespace test_recompute
