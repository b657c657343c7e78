// The pipeline runtime on the in-process communicator (one thread per rank): weight store and
// in-flight table contracts; flush schedules equal SequentialTrainer with gradient accumulation;
// 1F1B-stash equals an independent sequential reference of PipeDream's weight stashing; bad
// input ends every rank with an error instead of a hang.
#include <doctest/doctest.h>

#include <pipeline/comm/comms/local.hpp>
#include <pipeline/core/rng.hpp>
#include <pipeline/core/threads.hpp>
#include <pipeline/data/synthetic.hpp>
#include <pipeline/nn/layers/activation.hpp>
#include <pipeline/nn/layers/dropout.hpp>
#include <pipeline/nn/layers/flatten.hpp>
#include <pipeline/nn/layers/linear.hpp>
#include <pipeline/ops/convert.hpp>
#include <pipeline/optim/flatten.hpp>
#include <pipeline/optim/sgd.hpp>
#include <pipeline/runtime/sequential_trainer.hpp>
#include <pipeline/runtime/stage_executor.hpp>
#include <pipeline/schedule/csv.hpp>
#include <pipeline/schedule/dealing.hpp>
#include <pipeline/schedule/generator.hpp>
#include <pipeline/schedule/validate.hpp>

#include "support/param_compare.hpp"
#include "support/synthetic_minibatches.hpp"
#include "support/stash_reference.hpp"

#include <cmath>
#include <map>
#include <mutex>
#include <numeric>

namespace test_runtime {

using namespace pipeline;
using pipeline::testing::max_rel_diff;
using pipeline::testing::StashReference;
using pipeline::testing::steps_before_forward;

namespace {

constexpr int kFeatures = 12;
constexpr int kClasses = 5;
constexpr int kBatch = 8;
constexpr float kLr = 0.05f;
constexpr std::uint64_t kSeed = 7;

// leading_flatten: a Flatten under fc1, so that the first stage's backward skips fc1's input
// gradient (Sequential::first_input_grad_layer).
Sequential small_model(float dropout = 0.25f, bool leading_flatten = false) {
  Sequential m("runtime-test-mlp");
  if (leading_flatten) m.emplace<Flatten>("flatten");
  m.emplace<Linear>("fc1", kFeatures, 16);
  m.emplace<ReLU>("relu1");
  m.emplace<Linear>("fc2", 16, 16);
  m.emplace<ReLU>("relu2");
  m.emplace<Dropout>("drop", dropout);
  m.emplace<Linear>("fc3", 16, kClasses);
  return m;
}

const auto make_sgd = pipeline::testing::momentum_sgd;
const pipeline::testing::SyntheticMinibatches minibatch(Shape{kFeatures}, kClasses, kBatch, 512, 3);

MinibatchFeed feed() { return minibatch.feed(); }
const SyntheticDataset& dataset() { return minibatch.dataset(); }

// Every rank's final parameters of its own stage and its run's result, collected from the rank
// threads.
struct RankParams {
  std::mutex mutex;
  std::vector<ModelParams> params;
  std::vector<LayerRange> ranges;
  std::vector<TrainResult> results;
  explicit RankParams(int n)
      : params(static_cast<std::size_t>(n)),
        ranges(static_cast<std::size_t>(n)),
        results(static_cast<std::size_t>(n)) {}
};

// The layouts the synchronous schedules are checked on: 2, 3 and 4 stages, and a replicated
// first and last stage.
struct LayoutCase {
  std::vector<LayerRange> stages;
  std::vector<std::vector<int>> ranks;
};
const std::vector<LayoutCase> kLayouts = {
    {{{0, 3}, {3, 6}}, {{0}, {1}}},
    {{{0, 1}, {1, 4}, {4, 6}}, {{0}, {1}, {2}}},
    {{{0, 2}, {2, 3}, {3, 5}, {5, 6}}, {{0}, {1}, {2}, {3}}},
    {{{0, 3}, {3, 6}}, {{0, 1}, {2}}},     // replicated input stage
    {{{0, 2}, {2, 6}}, {{0}, {1, 2, 3}}},  // replicated last stage, 3 replicas
};

// Trains `minibatches` minibatches of `schedule` on the layout; returns each rank's parameters.
void run_pipeline(const Sequential& model, const PipelineLayout& layout, const Schedule& schedule,
                  RankParams& out, float clip = 0.f) {
  run_local(layout.num_ranks(), [&](Communicator& comm) {
    StageExecutor ex(model, Shape{kFeatures}, DType::Float32, layout, comm, make_sgd(),
                     {.seed = kSeed, .clip_norm = clip});
    TrainResult r = ex.train(schedule, feed(), 0, [](std::int64_t) { return kLr; });
    std::lock_guard<std::mutex> lock(out.mutex);
    out.results[static_cast<std::size_t>(comm.rank())] = r;
    out.params[static_cast<std::size_t>(comm.rank())] = ex.params();
    out.ranges[static_cast<std::size_t>(comm.rank())] = ex.layers();
  });
}

// Trains two minibatches of a 2-stage GPipe pipeline (2 ranks) on a feed whose minibatch 1
// `change` alters.
void train_changing_minibatch_1(const Sequential& model, void (*change)(Batch&), float clip = 0.f) {
  PipelineLayout layout{{{0, 3}, {3, 6}}, {{0}, {1}}};
  Schedule s = generate_schedule("gpipe", ScheduleSpec::straight(2, 1, 2));
  MinibatchFeed changed = minibatch.whole_minibatch_feed();
  changed.load = [change](std::int64_t j) {
    Batch b = minibatch(j);
    if (j == 1) change(b);
    return b;
  };
  run_local(2, [&](Communicator& comm) {
    StageExecutor ex(model, Shape{kFeatures}, DType::Float32, layout, comm, make_sgd(),
                     {.seed = kSeed, .clip_norm = clip});
    ex.train(s, changed, 0, [](std::int64_t) { return kLr; });
  });
}

// Rounds what passes through it to bfloat16 and back, forward and backward: what a stage
// boundary does to activations and gradients that move as bf16.
class Bf16Round final : public Layer {
 public:
  explicit Bf16Round(std::string name) : Layer(std::move(name)) {}
  std::string kind() const override { return "Bf16Round"; }
  Shape output_shape(const Shape& in) const override { return in; }
  double flops(const Shape&) const override { return 0.0; }

 protected:
  Tensor forward_impl(LayerParams&, const Tensor& x, Saved&, const ForwardContext&) const override {
    return ops::to_dtype(ops::to_dtype(x, DType::BFloat16), DType::Float32);
  }
  Tensor backward_impl(const LayerParams&, const Saved&, const Tensor& dy, std::span<Tensor>,
                       GradParts parts) const override {
    if (!has_part(parts, GradParts::Input)) return {};
    return ops::to_dtype(ops::to_dtype(dy, DType::BFloat16), DType::Float32);
  }
};

}  // namespace

TEST_CASE("WeightStore: copy-on-write steps, versions freed when no microbatch needs them") {
  ModelParams p{LayerParams{{Tensor::full(Shape{2}, 1.f)}, {}}};
  WeightStore store(std::move(p));
  CHECK(store.latest_tag() == 0);
  // Nothing references version 0: the step updates in place.
  store.begin_step().at(0).params[0].fill(2.f);
  CHECK(store.size() == 1);
  CHECK(store.latest_tag() == 1);
  const auto v1 = store.acquire_latest();
  const auto v1b = store.acquire_latest();
  CHECK(v1 == 1);
  CHECK(store.references(1) == 2);
  store.begin_step().at(0).params[0].fill(3.f);  // copy: version 1 is still in use
  CHECK(store.size() == 2);
  CHECK(store.params(1)[0].params[0].values()[0] == 2.f);
  CHECK(store.latest()[0].params[0].values()[0] == 3.f);
  store.release(v1);
  CHECK(store.size() == 2);
  store.release(v1b);
  CHECK(store.size() == 1);  // freed as soon as its last microbatch is done
  CHECK(store.peak() == 2);
  CHECK_THROWS_WITH_AS(store.release(2), doctest::Contains("released more often"), Error);
}

TEST_CASE("WeightStore: vertical sync keeps every version a later request can select") {
  ModelParams p{LayerParams{{Tensor::full(Shape{1}, 0.f)}, {}}};
  WeightStore store(std::move(p), 2, /*vertical_sync=*/true);
  for (int k = 1; k <= 3; ++k) store.begin_step().at(0).params[0].fill(float(k));
  CHECK(store.tags() == std::vector<WeightStore::Tag>{0, 2, 4, 6});
  const auto t = store.acquire(3);  // newest tag <= 3
  CHECK(t == 2);
  CHECK(store.tags() == std::vector<WeightStore::Tag>{2, 4, 6});  // 0 can never be selected again
  CHECK(store.params(t)[0].params[0].values()[0] == 1.f);
  CHECK_THROWS_WITH_AS(store.acquire(1), doctest::Contains("non-decreasing"), Error);
  store.release(t);
  const auto t6 = store.acquire(100);
  CHECK(t6 == 6);
  store.release(t6);
  CHECK(store.tags() == std::vector<WeightStore::Tag>{6});
}

TEST_CASE("InFlightTable: the bound on stashed microbatches is enforced") {
  InFlightTable t(2);
  t.open(3);
  t.open(4);
  CHECK(t.size() == 2);
  CHECK_THROWS_WITH_AS(t.open(5), doctest::Contains("all 2 in-flight slots are taken"), Error);
  CHECK_THROWS_WITH_AS(t.open(3), doctest::Contains("already in flight"), Error);
  t.close(3);
  t.open(5);
  CHECK(t.contains(5));
  CHECK_FALSE(t.contains(3));
  CHECK(t.peak() == 2);
  CHECK_THROWS_WITH_AS(t.at(9), doctest::Contains("not in flight"), Error);
}

// Tolerance: on the straight pipelines every stage runs the same ops on the same microbatches in
// the same order as the single process, so results are bitwise equal and the bound only guards
// against thread-count-dependent gemm blocking. With a replicated stage the replicas' gradients
// are summed in another association ((g0 + g2) + (g1 + g3) instead of g0 + g1 + g2 + g3): a few
// float ulps per element per step, far below 1e-5 relative after 3 steps of SGD.
TEST_CASE("flush schedules equal SequentialTrainer with gradient accumulation") {
  set_num_threads(1);
  for (const bool leading_flatten : {false, true}) {
    CAPTURE(leading_flatten);
    const Sequential model = small_model(0.25f, leading_flatten);
    const int minibatches = 3, micro = 4;
    SequentialTrainer ref(model, model.init(kSeed), make_sgd(), kSeed);
    for (int j = 0; j < minibatches; ++j) ref.step(minibatch(j), kLr, micro);

    for (const std::string name : {"gpipe", "1f1b-flush", "zb-h1"}) {
      for (LayoutCase c : kLayouts) {
        if (leading_flatten) {  // the Flatten joins the first stage
          for (LayerRange& r : c.stages) r = {r.begin == 0 ? 0 : r.begin + 1, r.end + 1};
        }
        PipelineLayout layout{c.stages, c.ranks};
        ScheduleSpec spec;
        spec.stage_ranks = c.ranks;
        spec.microbatches = micro;
        spec.minibatches = minibatches;
        Schedule s = generate_schedule(name, spec);
        CAPTURE(name);
        CAPTURE(s.num_ranks());
        RankParams out(layout.num_ranks());
        run_pipeline(model, layout, s, out);
        for (int r = 0; r < layout.num_ranks(); ++r)
          CHECK(max_rel_diff(out.params[r], ref.params(), out.ranges[r]) <= 1e-5);
      }
    }
  }
}

TEST_CASE("flush schedules dealt by speed equal SequentialTrainer; each microbatch runs once") {
  set_num_threads(1);
  const Sequential model = small_model();
  const int minibatches = 3, micro = 5;
  SequentialTrainer ref(model, model.init(kSeed), make_sgd(), kSeed);
  for (int j = 0; j < minibatches; ++j) ref.step(minibatch(j), kLr, micro);
  // Replicated input and last stages, and two replicated stages next to each other.
  const std::vector<LayoutCase> layouts = {
      kLayouts[3], kLayouts[4], {{{0, 3}, {3, 6}}, {{0, 1}, {2, 3, 4}}}};
  Rng rng(11, "dealt-runtime");
  for (const std::string name : {"gpipe", "1f1b-flush", "zb-h1"}) {
    for (const auto& c : layouts) {
      PipelineLayout layout{c.stages, c.ranks};
      ScheduleSpec spec;
      spec.stage_ranks = c.ranks;
      spec.microbatches = micro;
      spec.minibatches = minibatches;
      // Random speeds per rank, as a rebalancer would measure them.
      std::vector<double> seconds;
      for (int r = 0; r < layout.num_ranks(); ++r) seconds.push_back(1.0 + rng.below(4));
      spec.dealing = dealing_by_speed(spec, seconds);
      const Schedule s = generate_schedule(name, spec);
      CAPTURE(name);
      CAPTURE(seconds);
      // Which rank ran each stage's forward of each microbatch.
      std::mutex mutex;
      std::map<std::pair<int, int>, std::vector<int>> ran;
      RankParams out(layout.num_ranks());
      run_local(layout.num_ranks(), [&](Communicator& comm) {
        ExecutorOptions o{.seed = kSeed};
        o.after_compute = [&, rank = comm.rank()](const Action& a, double) {
          if (a.kind != ActionKind::Forward) return;
          std::lock_guard<std::mutex> lock(mutex);
          ran[{a.stage, a.microbatch}].push_back(rank);
        };
        StageExecutor ex(model, Shape{kFeatures}, DType::Float32, layout, comm, make_sgd(), o);
        ex.train(s, feed(), 0, [](std::int64_t) { return kLr; });
        std::lock_guard<std::mutex> lock(out.mutex);
        out.params[static_cast<std::size_t>(comm.rank())] = ex.params();
        out.ranges[static_cast<std::size_t>(comm.rank())] = ex.layers();
      });
      CHECK(ran.size() == static_cast<std::size_t>(layout.num_stages() * micro * minibatches));
      for (auto& [key, ranks] : ran) {
        REQUIRE(ranks.size() == 1);
        CHECK(ranks[0] == s.rank_of(key.first, key.second));
      }
      for (int r = 0; r < layout.num_ranks(); ++r)
        CHECK(max_rel_diff(out.params[r], ref.params(), out.ranges[r]) <= 1e-5);
    }
  }
}

TEST_CASE("2bw equals its reference: gradients one step stale, two weight versions") {
  set_num_threads(1);
  const Sequential model = small_model();
  const int minibatches = 5, micro = 4;
  const ModelParams want = pipeline::testing::two_buffered_reference(model, kSeed, kLr, make_sgd,
                                                                     minibatch, minibatches, micro);
  // Staleness really changes the result: plain sequential training differs.
  SequentialTrainer seq(model, model.init(kSeed), make_sgd(), kSeed);
  for (int j = 0; j < minibatches; ++j) seq.step(minibatch(j), kLr, micro);
  CHECK(max_rel_diff(want, seq.params(), {0, model.size()}) > 1e-4);
  for (const auto& c : kLayouts) {
    PipelineLayout layout{c.stages, c.ranks};
    ScheduleSpec spec;
    spec.stage_ranks = c.ranks;
    spec.microbatches = micro;
    spec.minibatches = minibatches;
    Schedule s = generate_schedule("2bw", spec);
    CAPTURE(s.num_ranks());
    RankParams out(layout.num_ranks());
    run_pipeline(model, layout, s, out);
    for (int r = 0; r < layout.num_ranks(); ++r) {
      CHECK(max_rel_diff(out.params[r], want, out.ranges[r]) <= 1e-5);
      CHECK(out.results[static_cast<std::size_t>(r)].steps == minibatches);
      CHECK(out.results[static_cast<std::size_t>(r)].peak_weight_versions == 2);
    }
  }
}

TEST_CASE("flush with gradient clipping: one global factor, equal to the single process") {
  set_num_threads(1);
  const Sequential model = small_model();
  const float clip = 0.05f;  // well below the gradient norm, so every step clips
  SequentialTrainer ref(model, model.init(kSeed), make_sgd(), kSeed, clip);
  double norm = 0;
  for (int j = 0; j < 2; ++j) norm = ref.step(minibatch(j), kLr, 2).grad_norm;
  CHECK(norm > clip);
  PipelineLayout layout{{{0, 2}, {2, 4}, {4, 6}}, {{0}, {1}, {2}}};
  Schedule s = generate_schedule("1f1b-flush", ScheduleSpec::straight(3, 2, 2));
  RankParams out(3);
  run_pipeline(model, layout, s, out, clip);
  for (int r = 0; r < 3; ++r)
    CHECK(max_rel_diff(out.params[r], ref.params(), out.ranges[r]) <= 1e-5);
}

TEST_CASE("1f1b-stash equals the sequential reference of weight stashing") {
  set_num_threads(1);
  const Sequential model = small_model(0.f);
  const int minibatches = 8;
  struct Case {
    std::vector<LayerRange> stages;
    std::vector<std::vector<int>> ranks;
    bool vsync;
  };
  const std::vector<Case> cases = {
      {{{0, 2}, {2, 4}, {4, 6}}, {{0}, {1}, {2}}, false},
      {{{0, 2}, {2, 4}, {4, 6}}, {{0}, {1}, {2}}, true},
      {{{0, 1}, {1, 2}, {2, 5}, {5, 6}}, {{0}, {1}, {2}, {3}}, true},
      {{{0, 3}, {3, 6}}, {{0, 1}, {2}}, false},  // replicated input stage
      {{{0, 3}, {3, 6}}, {{0, 1}, {2}}, true},
      {{{0, 3}, {3, 6}}, {{0}, {1, 2}}, false},  // replicated last stage
      // A replicated middle stage, whose first replica waits for each allreduce after its next
      // backward (a second gradient set, one more weight version).
      {{{0, 2}, {2, 4}, {4, 6}}, {{0}, {1, 2}, {3}}, false},
      {{{0, 2}, {2, 4}, {4, 6}}, {{0}, {1, 2}, {3}}, true},
  };
  int delayed = 0;
  for (const auto& c : cases) {
    ScheduleSpec spec;
    spec.stage_ranks = c.ranks;
    spec.minibatches = minibatches;
    spec.vertical_sync = c.vsync;
    Schedule s = generate_schedule("1f1b-stash", spec);
    StashReference ref{model, kSeed, kLr, make_sgd, minibatch, c.stages, {}, {}, c.vsync};
    ref.follow(s);
    for (int d : ref.delaying) delayed += d;
    // The closed form of the reference matches the generated order (without vertical sync the
    // version is the steps taken before the forward).
    for (int j = 0; j < static_cast<int>(c.stages.size()); ++j)
      for (int u = 0; u < minibatches; ++u)
        CHECK(ref.own_version(j, u) == steps_before_forward(s, s.rank_of(j, u), u));
    const ModelParams want = ref.run(minibatches);
    PipelineLayout layout{c.stages, c.ranks};
    RankParams out(layout.num_ranks());
    run_pipeline(model, layout, s, out);
    CAPTURE(c.vsync);
    CAPTURE(layout.num_ranks());
    for (int r = 0; r < layout.num_ranks(); ++r)
      CHECK(max_rel_diff(out.params[r], want, out.ranges[r]) <= 1e-5);
    // Stashing actually happened: the result differs from plain sequential SGD.
    SequentialTrainer seq(model, model.init(kSeed), make_sgd(), kSeed);
    for (int j = 0; j < minibatches; ++j) seq.step(minibatch(j), kLr);
    CHECK(max_rel_diff(out.params[0], seq.params(), out.ranges[0]) > 1e-4);
  }
  CHECK(delayed > 0);
}

TEST_CASE("1f1b-stash keeps at most the schedule's bound of stashes and versions") {
  set_num_threads(1);
  const Sequential model = small_model(0.f);
  PipelineLayout layout{{{0, 2}, {2, 4}, {4, 6}}, {{0}, {1}, {2}}};
  Schedule s = generate_schedule("1f1b-stash", ScheduleSpec::straight(3, 1, 6));
  const ValidationReport report = validate(s);
  std::mutex m;
  std::vector<TrainResult> results(3);
  run_local(3, [&](Communicator& comm) {
    StageExecutor ex(model, Shape{kFeatures}, DType::Float32, layout, comm, make_sgd(),
                     {.seed = kSeed});
    TrainResult r = ex.train(s, feed(), 0, [](std::int64_t) { return kLr; });
    std::lock_guard<std::mutex> lock(m);
    results[static_cast<std::size_t>(comm.rank())] = r;
  });
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(results[r].peak_in_flight == report.ranks[r].peak_activations);
    CHECK(results[r].peak_in_flight == 3 - r);  // PipeDream: p - s in flight on stage s
    CHECK(results[r].peak_weight_versions <= results[r].peak_in_flight + 1);
    CHECK(results[r].steps == 6);
  }
  CHECK(results[2].minibatches == 6);
  CHECK(std::isfinite(results[2].loss));
}

TEST_CASE("evaluation through the pipeline equals the single process") {
  set_num_threads(1);
  const Sequential model = small_model();
  SequentialTrainer ref(model, model.init(kSeed), make_sgd(), kSeed);
  EvalResult want = ref.evaluate(dataset(), 64);
  PipelineLayout layout{{{0, 3}, {3, 6}}, {{0}, {1, 2}}};
  const std::int64_t n = dataset().size();
  MinibatchFeed f{[&](std::int64_t u) {
                    std::vector<std::int64_t> idx;
                    for (std::int64_t i = u * 64; i < std::min(n, (u + 1) * 64); ++i)
                      idx.push_back(i);
                    return dataset().get(idx);
                  },
                  [&](std::int64_t u) { return std::min<std::int64_t>(64, n - u * 64); }};
  std::mutex m;
  std::vector<StageExecutor::Eval> got(3);
  run_local(3, [&](Communicator& comm) {
    StageExecutor ex(model, Shape{kFeatures}, DType::Float32, layout, comm, make_sgd(),
                     {.seed = kSeed});
    auto e = ex.evaluate(f, (n + 63) / 64);
    std::lock_guard<std::mutex> lock(m);
    got[static_cast<std::size_t>(comm.rank())] = e;
  });
  for (auto& e : got) {
    CHECK(e.count == want.count);
    CHECK(e.accuracy == doctest::Approx(want.accuracy));
    CHECK(e.loss == doctest::Approx(want.loss).epsilon(1e-5));
  }
}

TEST_CASE("trace events record every executed action") {
  set_num_threads(1);
  const Sequential model = small_model();
  PipelineLayout layout{{{0, 3}, {3, 6}}, {{0}, {1}}};
  Schedule s = generate_schedule("1f1b-flush", ScheduleSpec::straight(2, 2, 1));
  std::mutex m;
  std::size_t events = 0;
  run_local(2, [&](Communicator& comm) {
    StageExecutor ex(model, Shape{kFeatures}, DType::Float32, layout, comm, make_sgd(),
                     {.seed = kSeed, .record_trace = true});
    ex.train(s, feed(), 0, [](std::int64_t) { return kLr; });
    const auto& t = ex.trace_events();
    CHECK(t.size() == s.ranks[static_cast<std::size_t>(comm.rank())].size());
    for (std::size_t i = 1; i < t.size(); ++i) CHECK(t[i].start_s >= t[i - 1].end_s - 1e-9);
    std::lock_guard<std::mutex> lock(m);
    events += t.size();
  });
  CHECK(events == s.num_actions());
}

TEST_CASE("bad input: layouts, plans and schedules that cannot run fail on every rank") {
  set_num_threads(1);
  const Sequential model = small_model();
  SUBCASE("layout for more ranks than the job has") {
    PipelineLayout layout{{{0, 3}, {3, 6}}, {{0}, {1, 2}}};
    CHECK_THROWS_WITH_AS(run_local(2,
                                   [&](Communicator& comm) {
                                     StageExecutor ex(model, Shape{kFeatures}, DType::Float32,
                                                      layout, comm, make_sgd());
                                   }),
                         doctest::Contains("needs 3 ranks but the job has 2"), ConfigError);
  }
  SUBCASE("plan for another model") {
    Plan plan;
    plan.model = "fashion-cnn";
    plan.workers = 2;
    plan.stages = {{0, 3, 1, {0}}, {3, 6, 1, {1}}};
    CHECK_THROWS_WITH_AS(PipelineLayout::from_plan(plan, model),
                         doctest::Contains("plan is for model 'fashion-cnn'"), ConfigError);
    plan.model = model.name();
    plan.stages = {{0, 3, 1, {0}}, {3, 9, 1, {1}}};
    CHECK_THROWS_WITH_AS(PipelineLayout::from_plan(plan, model), doctest::Contains("has 6 layers"),
                         ConfigError);
  }
  SUBCASE("a hand-written schedule that deadlocks is rejected before anything runs") {
    // Both ranks wait for the other's message first.
    Schedule s = schedule_from_csv(
        "rank,actions\n"
        "0,0RG0@1 0F0 0SA0@1 0B0 0ST0\n"
        "1,1RA0@0 1F0 1B0 1SG0@0 1ST0\n");
    PipelineLayout layout{{{0, 3}, {3, 6}}, {{0}, {1}}};
    CHECK_THROWS_AS(run_local(2,
                              [&](Communicator& comm) {
                                StageExecutor ex(model, Shape{kFeatures}, DType::Float32, layout,
                                                 comm, make_sgd());
                                ex.train(s, feed(), 0, [](std::int64_t) { return kLr; });
                              }),
                    ConfigError);
  }
  SUBCASE("a schedule for another pipeline") {
    Schedule s = generate_schedule("gpipe", ScheduleSpec::straight(3, 2, 1));
    PipelineLayout layout{{{0, 3}, {3, 6}}, {{0}, {1}}};
    CHECK_THROWS_WITH_AS(run_local(2,
                                   [&](Communicator& comm) {
                                     StageExecutor ex(model, Shape{kFeatures}, DType::Float32,
                                                      layout, comm, make_sgd());
                                     ex.train(s, feed(), 0, [](std::int64_t) { return kLr; });
                                   }),
                         doctest::Contains("generate the schedule for this plan"), ConfigError);
  }
  SUBCASE("a rank that dies mid-run ends its peers instead of hanging them") {
    LocalHub hub(3);
    PipelineLayout layout{{{0, 2}, {2, 4}, {4, 6}}, {{0}, {1}, {2}}};
    Schedule s = generate_schedule("1f1b-flush", ScheduleSpec::straight(3, 4, 2));
    MinibatchFeed broken = minibatch.whole_minibatch_feed();
    broken.load = [](std::int64_t j) -> Batch {
      if (j == 1) throw IoError("minibatch 1 is unreadable");
      return minibatch(j);
    };
    CHECK_THROWS_WITH_AS(run_local(hub,
                                   [&](Communicator& comm) {
                                     comm.set_timeout(20);
                                     StageExecutor ex(model, Shape{kFeatures}, DType::Float32,
                                                      layout, comm, make_sgd());
                                     ex.train(s, broken, 0, [](std::int64_t) { return kLr; });
                                   }),
                         doctest::Contains("unreadable"), IoError);
  }
  SUBCASE("a non-finite loss names the step") {
    CHECK_THROWS_WITH_AS(
        train_changing_minibatch_1(
            model, [](Batch& b) { b.inputs.values()[0] = std::numeric_limits<float>::infinity(); }),
        doctest::Contains("at step 2 (its microbatch 0)"), Error);  // counted from 1
  }
  SUBCASE("a feed of another model's samples names both shapes") {
    const std::string expected = fmt::format(
        "the feed's minibatch 1 has inputs of [{}, {}] float32, but the model takes "
        "samples of [{}] float32",
        kBatch, kFeatures + 1, kFeatures);
    CHECK_THROWS_WITH_AS(
        train_changing_minibatch_1(model,
                                   [](Batch& b) {
                                     b.inputs = Tensor::zeros(Shape{b.size(), kFeatures + 1});
                                   }),
        doctest::Contains(expected.c_str()), ConfigError);
  }
  SUBCASE("a feed without a label per sample says so") {
    CHECK_THROWS_WITH_AS(
        train_changing_minibatch_1(model, [](Batch& b) { b.labels = Tensor{}; }),
        doctest::Contains("the feed's minibatch 1 has no labels for 8 samples"), ConfigError);
    CHECK_THROWS_WITH_AS(
        train_changing_minibatch_1(model, [](Batch& b) { b.labels = b.labels.slice(0, 6); }),
        doctest::Contains("the feed's minibatch 1 has labels of shape [6] for 8 samples"),
        ConfigError);
  }
  SUBCASE("a gradient that overflows names its layer and the step") {
    // Inputs of 1e25 keep the loss finite, but the weight gradients' squares overflow a float.
    for (float clip : {0.f, 1.f}) {  // the norm in the update's pass, and before clipping
      CAPTURE(clip);
      CHECK_THROWS_WITH_AS(train_changing_minibatch_1(
                               model,
                               [](Batch& b) {
                                 for (float& v : b.inputs.values()) v *= 1e25f;
                               },
                               clip),
                           doctest::Contains("became inf at step 2: lower the"), Error);
    }
  }
}

TEST_CASE("a feed that loads each microbatch alone trains the same bits, holding less input") {
  // Under 1F1B-flush the input stage has fewer of a minibatch's microbatches in flight than it
  // has: a whole-minibatch feed keeps all their inputs alive meanwhile (one storage).
  set_num_threads(1);
  const Sequential model = small_model();
  for (const LayoutCase& c : kLayouts) {
    const PipelineLayout layout{c.stages, c.ranks};
    CAPTURE(layout.num_stages());
    ScheduleSpec spec;
    spec.stage_ranks = layout.stage_ranks;
    spec.microbatches = 6;  // of 2, 2, 1, 1, 1 and 1 samples
    spec.minibatches = 3;
    const Schedule s = generate_schedule("1f1b-flush", spec);
    std::vector<std::vector<ModelParams>> params;
    std::vector<std::int64_t> input_stage_held;
    for (const MinibatchFeed& f : {minibatch.whole_minibatch_feed(), feed()}) {
      std::mutex m;
      std::vector<ModelParams> got(static_cast<std::size_t>(layout.num_ranks()));
      std::int64_t held = 0;
      run_local(layout.num_ranks(), [&](Communicator& comm) {
        StageExecutor ex(model, Shape{kFeatures}, DType::Float32, layout, comm, make_sgd(),
                         {.seed = kSeed});
        const TrainResult r = ex.train(s, f, 0, [](std::int64_t) { return kLr; });
        std::lock_guard<std::mutex> lock(m);
        got[static_cast<std::size_t>(comm.rank())] = ex.params();
        if (comm.rank() == 0) held = r.peak_memory.activation_bytes;
      });
      params.push_back(std::move(got));
      input_stage_held.push_back(held);
    }
    for (std::size_t r = 0; r < params[0].size(); ++r)
      CHECK(max_rel_diff(params[1][r], params[0][r], {0, static_cast<int>(params[0][r].size())}) ==
            0.0);
    CHECK(input_stage_held[1] < input_stage_held[0]);
  }
}

TEST_CASE(
    "a replicated last stage reports whole minibatches' losses, equal to the single process") {
  set_num_threads(1);
  const Sequential model = small_model();
  SequentialTrainer ref(model, model.init(kSeed), make_sgd(), kSeed);
  std::vector<double> want;
  for (int j = 0; j < 3; ++j) want.push_back(ref.step(minibatch(j), kLr, 4).loss);
  PipelineLayout layout{{{0, 2}, {2, 6}}, {{0}, {1, 2}}};
  ScheduleSpec spec;
  spec.stage_ranks = layout.stage_ranks;
  spec.microbatches = 4;
  spec.minibatches = 3;
  Schedule s = generate_schedule("1f1b-flush", spec);
  std::mutex m;
  std::vector<MinibatchStats> got;
  std::vector<TrainResult> results(3);
  run_local(3, [&](Communicator& comm) {
    StageExecutor ex(model, Shape{kFeatures}, DType::Float32, layout, comm, make_sgd(),
                     {.seed = kSeed});
    TrainResult r = ex.train(
        s, feed(), 0, [](std::int64_t) { return kLr; },
        [&](const MinibatchStats& st) {
          CHECK(ex.is_loss_rank());
          std::lock_guard<std::mutex> lock(m);
          got.push_back(st);
        });
    std::lock_guard<std::mutex> lock(m);
    results[static_cast<std::size_t>(comm.rank())] = r;
  });
  REQUIRE(got.size() == 3);
  for (int j = 0; j < 3; ++j) {
    CHECK(got[j].minibatch == j);
    CHECK(got[j].count == kBatch);
    CHECK(got[j].loss == doctest::Approx(want[j]).epsilon(1e-5));
  }
  CHECK(results[1].minibatches == 3);
  CHECK(results[2].minibatches == 3);
}

TEST_CASE("bf16 transfers: the pipeline equals one process that rounds at the stage boundary") {
  set_num_threads(1);
  const Sequential model = small_model(0.f);
  // The same layers (same names, so the same initial weights) with the rounding between fc2 and
  // relu2, where the pipeline below cuts.
  Sequential rounded("runtime-test-mlp");
  rounded.emplace<Linear>("fc1", kFeatures, 16);
  rounded.emplace<ReLU>("relu1");
  rounded.emplace<Linear>("fc2", 16, 16);
  rounded.emplace<Bf16Round>("wire");
  rounded.emplace<ReLU>("relu2");
  rounded.emplace<Dropout>("drop", 0.f);
  rounded.emplace<Linear>("fc3", 16, kClasses);
  const int minibatches = 3, micro = 4;
  SequentialTrainer ref(rounded, rounded.init(kSeed), make_sgd(), kSeed);
  SequentialTrainer plain(model, model.init(kSeed), make_sgd(), kSeed);
  for (int j = 0; j < minibatches; ++j) {
    ref.step(minibatch(j), kLr, micro);
    plain.step(minibatch(j), kLr, micro);
  }
  const PipelineLayout layout{{{0, 3}, {3, 6}}, {{0}, {1}}};
  ScheduleSpec spec;
  spec.stage_ranks = layout.stage_ranks;
  spec.microbatches = micro;
  spec.minibatches = minibatches;
  const Schedule s = generate_schedule("1f1b-flush", spec);
  std::vector<ModelParams> got(2);
  run_local(2, [&](Communicator& comm) {
    StageExecutor ex(model, Shape{kFeatures}, DType::Float32, layout, comm, make_sgd(),
                     {.seed = kSeed, .transfer_dtype = DType::BFloat16});
    ex.train(s, feed(), 0, [](std::int64_t) { return kLr; });
    got[static_cast<std::size_t>(comm.rank())] = ex.params();
  });
  // Pipeline layers 0..2 are the reference's 0..2, pipeline layers 3..5 its 4..6.
  ModelParams want(ref.params().begin(), ref.params().begin() + 3);
  want.insert(want.end(), ref.params().begin() + 4, ref.params().end());
  CHECK(max_rel_diff(got[0], want, {0, 3}) <= 1e-6);
  CHECK(max_rel_diff(got[1], want, {3, 6}) <= 1e-6);
  // The rounding mattered: float32 transfers would have ended elsewhere.
  CHECK(max_rel_diff(got[0], plain.params(), {0, 3}) > 1e-5);
  CHECK_THROWS_WITH_AS(run_local(2,
                                 [&](Communicator& comm) {
                                   StageExecutor ex(model, Shape{kFeatures}, DType::Float32, layout,
                                                    comm, make_sgd(),
                                                    {.transfer_dtype = DType::Int32});
                                 }),
                       doctest::Contains("as float32 or bfloat16, not int32"), ConfigError);
}

}  // namespace test_runtime
