// The partitioner's optimum equals exhaustive enumeration of every partition on thousands of
// random small instances (chains and DAGs, 1-3 levels, memory limits, replication, idle
// workers, transfers) for both cost models; and its PipeDream-model times equal what PipeDream's
// released optimizer prints ("Time per stage in pipeline") on the shipped profiles.
#include <pipeline/core/error.hpp>
#include <pipeline/core/log.hpp>
#include <pipeline/core/rng.hpp>
#include <pipeline/plan/antichain.hpp>
#include <pipeline/plan/partition.hpp>
#include <pipeline/plan/plan_json.hpp>
#include <pipeline/plan/typed_partition.hpp>
#include <pipeline/profile/pipedream_graph.hpp>
#include <pipeline/schedule/simulator.hpp>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "support/pipedream_profiles.hpp"
#include "support/uniform_profile.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <random>

namespace test_partition {

using namespace pipeline;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Independent statement of the model: enumerate every chain of states s = k0 < ... < kn = e,
// every replica count per stage and (with idle workers) every number of unused machines after
// each stage, and take the best bottleneck. Upper levels use the best inner time of a segment.
struct Brute {
  const StateGraph& g;
  const Topology& t;
  const PartitionOptions& o;
  bool pd;
  bool transfer;
  double R;

  double diff(const std::vector<double>& v, int s, int e) const { return v[e] - (s < 0 ? 0.0 : v[s]); }

  double seg_time(int level, int s, int e) const {
    if (level == 0) return diff(g.compute_s, s, e);
    return best(level - 1, s, e);
  }

  double best(int level, int s, int e) const {
    int M = t.levels[level].count;
    double result = kInf;
    std::vector<int> ks{s}, rs;
    std::vector<int> used;  // machines used up to and including each stage (with idle)
    recurse(level, s, e, M, ks, rs, used, 0, 0.0, result);
    return result;
  }

  // ks: boundaries so far (last = current end); m: machines counted so far (with idle).
  void recurse(int level, int s, int e, int M, std::vector<int>& ks, std::vector<int>& rs, std::vector<int>& used, int m,
               double worst, double& result) const {
    int cur = ks.back();
    if (cur == e) {
      result = std::min(result, worst);
      return;
    }
    for (int nxt = cur + 1; nxt <= e; ++nxt) {
      if (!g.is_ancestor(cur, nxt) || (nxt != e && !g.is_ancestor(nxt, e))) continue;
      if (nxt != e && !g.can_end(nxt)) continue;  // no stage ends inside a reordered pair
      int max_r = std::min(o.straight ? 1 : M, M - m);
      for (int r = 1; r <= max_r; ++r) {
        bool first = ks.size() == 1;
        int idle_max = o.allow_idle ? M - m - r : 0;
        for (int idle = 0; idle <= idle_max; ++idle) {
          int mm = m + r;  // machines through this stage, as the DP counts them
          double v = stage(level, cur, nxt, r, mm, M, first);
          if (!std::isfinite(v)) continue;
          if (nxt != e && idle == 0 && !o.allow_idle && mm == M) continue;
          if (nxt == e && !o.allow_idle && mm + idle != M) continue;
          ks.push_back(nxt);
          recurse(level, s, e, M, ks, rs, used, mm + idle, std::max(worst, v), result);
          ks.pop_back();
        }
      }
    }
  }

  double stage(int level, int a, int b, int r, int m, int M, bool first) const {
    double T = seg_time(level, a, b);
    if (!std::isfinite(T)) return kInf;
    double B = t.levels[level].bandwidth_bytes_per_s;
    int G = 1;
    for (int l = 0; l < level; ++l) G *= t.levels[l].count;
    double share = pd ? (first ? (level == 0 ? 1.0 : t.levels[level - 1].count) : 1.0) : G;
    double par = diff(g.parameter_bytes, a, b), act = diff(g.activation_bytes, a, b);
    if (t.memory_bytes_per_worker) {
      double mem = *t.memory_bytes_per_worker;
      if (pd) {
        if (std::ceil(double(M - m) / r) * (act + par) > mem) return kInf;
      } else if (level == 0) {
        int flight = (t.workers() - 1 - (m - r)) / r + 1;
        // The stage input (bytes crossing into it) is held per in-flight minibatch, and once more
        // as the input gradient of the backward in progress; four posted receives and one
        // unfinished send hold a buffer of the larger message each. A stage whose first layer reads
        // its input alone and keeps none of it frees it.
        double in = a < 0 ? 0.0 : g.boundary_bytes[a];
        double held = g.stage_frees_input(a, b) ? 0.0 : in;
        double posted = 5 * std::max(in, g.boundary_bytes[b]) / R;
        if (par * (2 + o.optimizer_state_factor + flight - 1) + (act + held) * flight + in +
                posted >
            mem)
          return kInf;
      }
    }
    double v = (T + 4.0 * (r - 1) * par / (B * r * share)) / r;
    // A stage's replicas move its input and output over their own links; PipeDream's model
    // charges the receiving stage alone, so its first stage moves nothing.
    if (transfer && (!first || !pd)) {
      const auto& bytes = pd ? g.pipedream_boundary_bytes : g.boundary_bytes;
      if (!first) v = std::max(v, 2 * bytes[a] / (B * r * R));
      if (b != g.size() - 1) v = std::max(v, 2 * bytes[b] / (B * r * R));
    }
    return v;
  }
};

Profile random_profile(std::mt19937& rng, bool dag) {
  std::uniform_int_distribution<int> nl(2, dag ? 6 : 6);
  int n = nl(rng);
  Profile p;
  p.model = "random";
  p.batch_size = 4;
  std::uniform_real_distribution<double> time(0.0, 1.0);
  std::uniform_int_distribution<int> bytes(0, 4), coin(0, 2);
  for (int i = 0; i < n; ++i) {
    LayerProfile l;
    l.name = fmt::format("l{}", i);
    // Coarse values make ties common, which is where tie-breaking bugs hide.
    l.forward_s = std::round(time(rng) * 8) / 1000;
    l.backward_s = std::round(time(rng) * 8) / 1000;
    l.output_bytes = bytes(rng) * 2500000;
    l.parameter_bytes = bytes(rng) * 5000000;
    l.frees_input = coin(rng) == 0;
    if (dag && i > 0) {
      std::vector<int> in;
      for (int j = 0; j < i; ++j)
        if (j == i - 1 ? coin(rng) != 0 : coin(rng) == 0) in.push_back(j);
      if (in.empty()) in.push_back(std::uniform_int_distribution<int>(0, i - 1)(rng));
      l.inputs = in;
    }
    p.layers.push_back(l);
  }
  // Some layers run after their successor inside a stage (a ReLU before a max pool): where the
  // successor takes their output alone, and nothing else does.
  for (int i = 0; i + 1 < n; ++i) {
    bool alone = p.predecessors(i + 1) == std::vector<int>{i};
    for (int j = i + 2; j < n; ++j)
      for (int in : p.predecessors(j)) alone = alone && in != i;
    if (alone && coin(rng) == 0)
      p.layers[i].at_stage_end = StageEndCosts{
          p.layers[i].forward_s * 3, p.layers[i].backward_s * 3, 0, 0, 1000000, 0, coin(rng) == 0};
  }
  return p;
}

Topology random_topology(std::mt19937& rng) {
  std::uniform_int_distribution<int> nlev(1, 3);
  int levels = nlev(rng);
  Topology t;
  const int max_total = levels == 1 ? 6 : 8;
  int total = 1;
  for (int l = 0; l < levels; ++l) {
    int cap = std::max(1, max_total / total);
    int c = std::uniform_int_distribution<int>(1, std::min(cap, levels == 1 ? 6 : 3))(rng);
    total *= c;
    double bw = std::vector<double>{1e9, 1e10, 2.5e9}[std::uniform_int_distribution<int>(0, 2)(rng)];
    t.levels.push_back({c, bw});
  }
  return t;
}

}  // namespace

TEST_CASE("the optimum equals exhaustive enumeration on random small instances") {
  std::mt19937 rng(20240611);
  int checked = 0, infeasible = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    bool dag = iter % 2 == 1;
    Profile p = random_profile(rng, dag);
    Topology t = random_topology(rng);
    PartitionOptions o;
    o.cost_model = iter % 4 < 2 ? CostModel::Pipeline : CostModel::PipeDream;
    o.straight = std::uniform_int_distribution<int>(0, 4)(rng) == 0;
    o.allow_idle = std::uniform_int_distribution<int>(0, 2)(rng) == 0;
    int tr = std::uniform_int_distribution<int>(0, 2)(rng);
    o.ignore_transfer = tr == 0;
    if (tr == 2) o.activation_compression = 2.0;
    if (std::uniform_int_distribution<int>(0, 2)(rng) == 0)
      t.memory_bytes_per_worker = std::uniform_int_distribution<int>(1, 12)(rng) * 1e7;
    StateGraph g = StateGraph::build(p, 100000);
    Brute brute{g, t, o, o.cost_model == CostModel::PipeDream,
                !o.ignore_transfer && (o.cost_model == CostModel::Pipeline || o.activation_compression.has_value()),
                o.activation_compression.value_or(1.0)};
    double expect = brute.best(static_cast<int>(t.levels.size()) - 1, -1, g.size() - 1);
    CAPTURE(iter);
    CAPTURE(p.size());
    CAPTURE(t.levels.size());
    if (!std::isfinite(expect)) {
      CHECK_THROWS_AS(partition(p, t, o), ConfigError);
      ++infeasible;
      continue;
    }
    Plan plan = partition(p, t, o);
    // (Idle workers under a memory limit on one level are charged exactly, as the enumeration
    // does not: never slower; see the next test.)
    if (o.allow_idle && t.memory_bytes_per_worker && t.levels.size() == 1 &&
        o.cost_model == CostModel::Pipeline)
      CHECK(plan.predicted.time_per_minibatch_s <= expect * (1 + 1e-12));
    else
      CHECK(plan.predicted.time_per_minibatch_s == doctest::Approx(expect).epsilon(1e-12));
    // Every layer lands in exactly one stage, and no rank serves two stages.
    std::vector<int> owner(p.size(), 0), rank_used(t.workers(), 0);
    for (const auto& s : plan.stages) {
      if (s.layer_ids.empty())
        for (int v = s.begin; v < s.end; ++v) ++owner[v];
      else
        for (int v : s.layer_ids) ++owner[v];
      for (int r : s.ranks) ++rank_used[r];
      if (o.straight) CHECK(s.replicas == 1);
    }
    // The per-stage rows are the search's own numbers: the slowest row is the headline.
    double slowest = 0;
    for (const auto& s : plan.stages) slowest = std::max(slowest, std::max(s.compute_s + s.sync_s, s.transfer_s));
    CHECK(slowest == doctest::Approx(plan.predicted.time_per_minibatch_s).epsilon(1e-12));
    for (int c : owner) CHECK(c == 1);
    for (int c : rank_used) CHECK(c <= 1);
    ++checked;
  }
  MESSAGE(checked << " instances matched, " << infeasible << " infeasible on both sides");
  CHECK(checked > 1500);
}

TEST_CASE(
    "allow_idle under a memory limit on one level: the fastest plan on any count, charged "
    "exactly") {
  // Each count's plan without idle workers charges its stages the minibatches in flight of its
  // own pipeline; the search over all counts at once could only charge every worker's.
  std::mt19937 rng(42);
  int checked = 0, faster = 0;
  for (int iter = 0; iter < 400; ++iter) {
    const Profile p = random_profile(rng, iter % 2 == 1);
    Topology t;
    t.levels.push_back({std::uniform_int_distribution<int>(2, 6)(rng), 1e9});
    t.memory_bytes_per_worker = std::uniform_int_distribution<int>(2, 40)(rng) * 1e7;
    PartitionOptions o;
    o.allow_idle = true;
    double expect = kInf;
    for (int w = 1; w <= t.workers(); ++w) {
      Topology sub = t;
      sub.levels.front().count = w;
      PartitionOptions busy = o;
      busy.allow_idle = false;
      if (const std::optional<Plan> q = try_partition(p, sub, busy))
        expect = std::min(expect, q->predicted.time_per_minibatch_s);
    }
    CAPTURE(iter);
    if (!std::isfinite(expect)) {
      CHECK_THROWS_AS(partition(p, t, o), ConfigError);
      continue;
    }
    const Plan plan = partition(p, t, o);
    CHECK(plan.predicted.time_per_minibatch_s == doctest::Approx(expect).epsilon(1e-12));
    CHECK(plan.workers == t.workers());
    CHECK(plan.predicted.peak_memory_bytes.size() == static_cast<std::size_t>(t.workers()));
    for (const auto& st : plan.stages) CHECK(st.memory_bytes <= *t.memory_bytes_per_worker);
    // The same search on a topology too large for every count to be planned: charged for every
    // worker, never faster.
    Topology multi;
    multi.levels = {{1, 1e9}, t.levels.front()};
    multi.memory_bytes_per_worker = t.memory_bytes_per_worker;
    if (const std::optional<Plan> q = try_partition(p, multi, o)) {
      CHECK(q->predicted.time_per_minibatch_s >= plan.predicted.time_per_minibatch_s * (1 - 1e-12));
      faster +=
          q->predicted.time_per_minibatch_s > plan.predicted.time_per_minibatch_s * (1 + 1e-9);
    }
    ++checked;
  }
  MESSAGE(checked << " instances; " << faster
                  << " faster than the search charged for every worker");
  CHECK(checked > 100);
}

TEST_CASE("deterministic ties and manual stages") {
  Profile p;
  p.model = "flat";
  p.batch_size = 1;
  for (int i = 0; i < 8; ++i) p.layers.push_back({fmt::format("l{}", i), "X", 0.001, 0.002, 0, 0, 0, 0, 100, 1000, 0, {}, false});
  Topology t{{{4, 1e10}}, {}};
  Plan a = partition(p, t), b = partition(p, t);
  CHECK(a.config == b.config);
  CHECK(a.predicted.time_per_minibatch_s == doctest::Approx(0.006));
  Plan m = evaluate_stages(p, t, parse_manual_stages("0:2,2:4,4:6,6:8"));
  CHECK(m.predicted.time_per_minibatch_s == doctest::Approx(0.006));
  CHECK(m.config == "1-1-1-1");
  // The threads the profile was timed on travel with every kind of plan.
  p.threads = 2;
  CHECK(partition(p, t).profile_threads == 2);
  CHECK(evaluate_stages(p, t, parse_manual_stages("0:2,2:4,4:6,6:8")).profile_threads == 2);
  PartitionOptions flush;
  flush.schedule = "1f1b-flush";
  CHECK(partition(p, t, flush).profile_threads == 2);
  PartitionOptions interleaved;
  interleaved.virtual_stages = 2;
  CHECK(partition(p, t, interleaved).profile_threads == 2);
  p.threads = 0;
  CHECK_THROWS_AS(evaluate_stages(p, t, parse_manual_stages("0:2,3:8")), ConfigError);
  CHECK_THROWS_AS(evaluate_stages(p, t, parse_manual_stages("0:2x4,2:8")), ConfigError);
  CHECK_THROWS_AS(evaluate_stages(p, t, parse_manual_stages("0:2,2:7")), ConfigError);
  CHECK_THROWS_AS(parse_manual_stages("0-2"), ConfigError);
  CHECK_THROWS_AS(parse_manual_stages("0:2x0"), ConfigError);
  Topology small{{{4, 1e10}}, 10.0};
  CHECK_THROWS_WITH_AS(partition(p, small), doctest::Contains("smallest memory"), ConfigError);
}

TEST_CASE("levels of thousands of workers plan; a level too large to search names the remedy") {
  const Profile p = testing::uniform_profile(8, 0.001, 0.002, 100, 1000);
  // Past 512 workers a level's search no longer remembers its windows per machine pair.
  const Plan wide = partition(p, Topology{{{3000, 1e10}}, {}});
  int workers = 0;
  for (int r : wide.replica_counts()) workers += r;
  CHECK(workers <= 3000);
  CHECK(wide.predicted.time_per_minibatch_s < 0.024 / 100);
  CHECK_THROWS_WITH_AS(
      partition(p, Topology{{{100000, 1e10}}, {}}),
      doctest::Contains("topology level 0 has 100000 workers, more than the 65536"), ConfigError);
  CHECK_THROWS_WITH_AS(partition(p, Topology{{{4, 1e11}, {200000, 1e10}}, {}}),
                       doctest::Contains("--level 25000:<bandwidth between servers>"), ConfigError);
}

TEST_CASE("the optimizer's measured steps join each replica's compute, once per minibatch") {
  Profile p = testing::uniform_profile(6, 0.001, 0.002, 100, 1000);
  for (int i = 0; i < 6; ++i)
    p.layers[static_cast<std::size_t>(i)].step_s = {
        .sgd = 1e-4, .momentum = 2e-4, .adamw = 4e-4 * (i + 1)};
  const Topology one{{{1, 1e10}}, {}};
  PartitionOptions none, adamw;
  adamw.optimizer = "adamw";
  // One worker: every layer's forward, backward and step.
  CHECK(partition(p, one, none).predicted.time_per_minibatch_s == doctest::Approx(0.018));
  const Plan single = partition(p, one, adamw);
  CHECK(single.predicted.time_per_minibatch_s == doctest::Approx(0.018 + 4e-4 * 21));
  CHECK(single.optimizer == "adamw");
  CHECK(partition(p, one, none).optimizer.empty());
  // Data parallelism on 2 workers: each replica steps after each of its minibatches, so the step
  // shares the replicas like compute; free links leave only that.
  const Topology two{{{2, 1e18}}, {}};
  Plan dp = evaluate_stages(p, two, parse_manual_stages("0:6x2"), adamw);
  CHECK(dp.predicted.time_per_minibatch_s == doctest::Approx((0.018 + 4e-4 * 21) / 2));
  CHECK(data_parallel_time(p, two, adamw) == doctest::Approx((0.018 + 4e-4 * 21) / 2));
  // The manual stages' split: the step of each stage's own layers.
  Plan split = evaluate_stages(p, two, parse_manual_stages("0:4,4:6"), adamw);
  CHECK(split.stages[0].compute_s == doctest::Approx(0.012 + 4e-4 * 10));
  CHECK(split.stages[1].compute_s == doctest::Approx(0.006 + 4e-4 * 11));
  // PipeDream's model reproduces its optimizer, which has no step time.
  PartitionOptions pd = adamw;
  pd.cost_model = CostModel::PipeDream;
  CHECK(evaluate_stages(p, one, parse_manual_stages("0:6"), pd).predicted.time_per_minibatch_s ==
        doctest::Approx(0.018));
  // A profile without step times charges none.
  Profile unmeasured = p;
  for (auto& l : unmeasured.layers) l.step_s = {};
  CHECK(partition(unmeasured, one, adamw).predicted.time_per_minibatch_s == doctest::Approx(0.018));
  adamw.optimizer = "lamb";
  CHECK_THROWS_WITH_AS(partition(p, one, adamw), doctest::Contains("unknown optimizer 'lamb'"),
                       ConfigError);
}

TEST_CASE("PipeDream parity on the shipped profiles") {
  std::string dir = testing::pipedream_profiles_dir();
  if (dir.empty()) {
    MESSAGE("shared/reference/pipedream-profiles not found; skipping");
    return;
  }
  // "Time per stage in pipeline" printed by PipeDream's optimizer_graph_hierarchical.py
  // (commit 7db6a1c) for the same profile, topology and flags.
  struct Case {
    const char* model;
    std::vector<TopologyLevel> levels;
    bool straight, idle;
    std::optional<double> ratio, memory;
    double expect;
  };
  const Case cases[] = {
      {"alexnet", {{4, 1e10}}, false, false, {}, {}, 0.022186000000000004},
      {"alexnet", {{16, 1e10}}, false, false, {}, {}, 0.005662875902040816},
      {"alexnet", {{16, 1.25e9}}, false, false, 1.0, {}, 0.0150994944},
      {"alexnet", {{8, 1e10}}, true, false, 1.0, {}, 0.032171},
      {"alexnet", {{8, 1e9}}, false, true, 1.0, {}, 0.018874368},
      {"vgg16", {{4, 1e10}}, false, false, {}, {}, 0.17017906240000003},
      {"vgg16", {{8, 1e10}}, false, false, {}, {}, 0.08992645988571431},
      {"vgg16", {{16, 1e10}}, false, false, {}, {}, 0.04322707431111117},
      {"vgg16", {{16, 1.25e9}}, false, false, 1.0, {}, 0.05479489083076924},
      {"vgg16", {{8, 1e10}}, true, false, 1.0, {}, 0.23559000000000002},
      {"vgg16", {{8, 1e9}}, false, true, 1.0, {}, 0.10383317028571429},
      {"vgg16", {{8, 1e10}}, false, false, {}, 4e9, 0.10827944520000002},
      {"resnet18", {{16, 1e10}}, false, false, {}, {}, 0.016898391839999995},
      {"resnet18", {{16, 1.25e9}}, false, false, 1.0, {}, 0.02442549714567901},
      {"resnet18", {{8, 1e10}}, false, false, {}, 4e9, 0.0345134146},
      {"squeezenet1_0", {{8, 1e10}}, true, false, 1.0, {}, 0.068269},
      {"squeezenet1_0", {{8, 1e9}}, false, true, 1.0, {}, 0.03769312065306122},
      {"gnmt", {{4, 1e10}}, false, false, {}, {}, 0.025868000000000002},
      {"gnmt", {{16, 1e10}}, false, false, {}, {}, 0.011080999999999987},
      {"gnmt", {{8, 1e9}}, false, true, 1.0, {}, 0.01928500000000001},
      {"resnet50", {{16, 1e10}}, false, false, {}, {}, 0.028320726200000004},
      {"resnet50", {{16, 1.25e9}}, false, false, 1.0, {}, 0.043847790044444446},
      {"resnet50", {{8, 1e10}}, true, false, 1.0, {}, 0.0822083584},
      {"resnet50", {{8, 1e10}}, false, false, {}, 4e9, 0.059899855599999996},
      {"resnext50", {{16, 1e10}}, false, false, {}, {}, 0.038055635444897984},
      {"resnext50", {{8, 1e9}}, false, true, 1.0, {}, 0.102760448},
      {"_derived/compressed_graphs/inception_v3", {{4, 1e10}}, false, false, {}, {}, 0.17461284231111107},
      {"_derived/compressed_graphs/inception_v3", {{8, 1e10}}, false, false, {}, {}, 0.08724295057777777},
      {"alexnet", {{4, 1e10}, {4, 1.25e9}}, false, false, {}, {}, 0.006011178400000001},
      {"alexnet", {{8, 1e10}, {2, 1.25e9}}, false, false, {}, {}, 0.005782271600000004},
      {"alexnet", {{2, 1e11}, {2, 1e10}, {4, 1.25e9}}, false, false, {}, {}, 0.006026226479999999},
      {"vgg16", {{4, 1e10}, {4, 1.25e9}}, false, false, {}, {}, 0.044121074311111085},
      {"vgg16", {{8, 1e10}, {2, 1.25e9}}, false, false, {}, {}, 0.04641190300000001},
      {"vgg16", {{2, 1e11}, {2, 1e10}, {4, 1.25e9}}, false, false, {}, {}, 0.046811248599999994},
      {"vgg16", {{4, 1e10}, {4, 1.25e9}}, false, false, 1.0, {}, 0.06713399693333331},
      {"resnet18", {{4, 1e10}, {4, 1.25e9}}, false, false, {}, {}, 0.01709254},
      {"resnet18", {{8, 1e10}, {2, 1.25e9}}, false, false, {}, {}, 0.01700137696},
      {"resnet18", {{2, 1e11}, {2, 1e10}, {4, 1.25e9}}, false, false, {}, {}, 0.01690795684},
      {"resnet18", {{4, 1e10}, {4, 1.25e9}}, false, false, 1.0, {}, 0.0234932072},
      {"gnmt", {{2, 1e11}, {2, 1e10}, {4, 1.25e9}}, false, false, {}, {}, 0.010019644159999997},
      {"squeezenet1_0", {{8, 1e10}, {2, 1.25e9}}, false, false, {}, {}, 0.01819307359999998},
      {"squeezenet1_0", {{4, 1e10}, {4, 1.25e9}}, false, false, 1.0, {}, 0.018618375466666667},
      {"resnet50", {{4, 1e10}, {4, 1.25e9}}, false, false, {}, {}, 0.028717022400000004},
      {"resnet50", {{2, 1e11}, {2, 1e10}, {4, 1.25e9}}, false, false, {}, {}, 0.028018550879999955},
  };
  for (const Case& c : cases) {
    CAPTURE(c.model);
    CAPTURE(c.expect);
    Profile p = read_pipedream_graph(dir + "/" + c.model + "/graph.txt");
    Topology t{c.levels, c.memory};
    PartitionOptions o;
    o.cost_model = CostModel::PipeDream;
    o.straight = c.straight;
    o.allow_idle = c.idle;
    o.activation_compression = c.ratio;
    Plan plan = partition(p, t, o);
    CHECK(plan.predicted.time_per_minibatch_s == doctest::Approx(c.expect).epsilon(1e-9));
  }
}

namespace {

// A wide random DAG: each layer reads one or two earlier layers, rarely the previous one, so
// parallel branches (and many antichain states) are common.
Profile wide_profile(std::mt19937& rng, int n) {
  Profile p;
  p.model = "wide";
  p.batch_size = 4;
  std::uniform_real_distribution<double> time(0.0, 1.0);
  std::uniform_int_distribution<int> bytes(0, 4), two(0, 1);
  for (int i = 0; i < n; ++i) {
    LayerProfile l;
    l.name = fmt::format("l{}", i);
    l.forward_s = std::round(time(rng) * 8 + 1) / 1000;
    l.backward_s = std::round(time(rng) * 8) / 1000;
    l.output_bytes = bytes(rng) * 2500000;
    l.parameter_bytes = bytes(rng) * 5000000;
    if (i > 0) {
      std::uniform_int_distribution<int> any(std::max(0, i - 5), i - 1);
      std::vector<int> in{any(rng)};
      if (two(rng) && i > 1) in.push_back(any(rng));
      std::sort(in.begin(), in.end());
      in.erase(std::unique(in.begin(), in.end()), in.end());
      l.inputs = in;
    }
    p.layers.push_back(l);
  }
  return p;
}

std::vector<char> members(const StateGraph& g, int state, int n) {
  std::vector<char> in(static_cast<std::size_t>(n), 0);
  for (int v : g.layers_between(-1, state)) in[static_cast<std::size_t>(v)] = 1;
  return in;
}

}  // namespace

TEST_CASE("coarsened antichain states: ideals, subset order, series cuts and prefixes kept, optimum over them") {
  std::mt19937 rng(4242);
  int coarsened = 0, with_prefixes = 0;
  // partition() logs every coarsening; hundreds of those lines say nothing here.
  const LogThresholdScope quiet(LogLevel::Warn);
  for (int iter = 0; iter < 300; ++iter) {
    const int n = std::uniform_int_distribution<int>(7, 11)(rng);
    Profile p = wide_profile(rng, n);
    if (p.is_chain()) continue;
    const int exact = StateGraph::build(p, 1000000).size();
    if (exact < 8) continue;
    const std::size_t cap = std::uniform_int_distribution<std::size_t>(4, static_cast<std::size_t>(exact) - 1)(rng);
    CAPTURE(iter);
    CAPTURE(exact);
    CAPTURE(cap);
    StateGraph g;
    try {
      g = StateGraph::build_coarsened(p, cap);
    } catch (const ConfigError&) {
      continue;  // nothing left to merge: partition() plans over one topological order
    }
    ++coarsened;
    REQUIRE(static_cast<std::size_t>(g.size()) <= cap);
    CHECK(g.num_groups() < n);
    std::vector<std::vector<char>> sets;
    for (int j = 0; j < g.size(); ++j) sets.push_back(members(g, j, n));
    for (int j = 0; j < g.size(); ++j) {
      // A state is closed under predecessors, and the state order is the subset order.
      for (int v = 0; v < n; ++v)
        if (sets[j][v])
          for (int u : p.predecessors(v)) CHECK(sets[j][u]);
      for (int k = 0; k < g.size(); ++k) {
        bool subset = k != j, strict = false;
        for (int v = 0; v < n; ++v) {
          if (sets[k][v] && !sets[j][v]) subset = false;
          if (!sets[k][v] && sets[j][v]) strict = true;
        }
        CHECK(g.is_ancestor(k, j) == (subset && strict));
      }
    }
    CHECK(std::count(sets.back().begin(), sets.back().end(), 1) == n);
    // The cut after a layer that every path passes through is always a state.
    StateGraph full = StateGraph::build(p, 1000000);
    const bool prefixes = cap >= static_cast<std::size_t>(n + std::min(n, 200));
    with_prefixes += prefixes;
    for (int v = 0; v < n; ++v) {
      std::vector<char> below(static_cast<std::size_t>(n), 0), above(static_cast<std::size_t>(n), 0);
      below[v] = above[v] = 1;
      for (int i = v; i >= 0; --i)
        if (below[i])
          for (int u : p.predecessors(i)) below[u] = 1;
      for (int i = v; i < n; ++i)
        for (int u : p.predecessors(i))
          if (above[u]) above[i] = 1;
      int comparable = 0;
      for (int i = 0; i < n; ++i) comparable += below[i] || above[i];
      if (comparable != n) continue;
      CHECK(std::find(sets.begin(), sets.end(), below) != sets.end());
    }
    if (prefixes)
      for (int t = 1; t <= n; ++t) {
        std::vector<char> prefix(static_cast<std::size_t>(n), 0);
        std::fill(prefix.begin(), prefix.begin() + t, 1);
        CHECK(std::find(sets.begin(), sets.end(), prefix) != sets.end());
      }
    // partition() with that budget finds the optimum over exactly these states.
    Topology t = random_topology(rng);
    if (t.workers() > 4) t.levels.resize(1);
    PartitionOptions o;
    o.cost_model = iter % 2 ? CostModel::Pipeline : CostModel::PipeDream;
    o.max_states = cap;
    o.allow_idle = iter % 3 == 0;
    Brute brute{g, t, o, o.cost_model == CostModel::PipeDream, o.cost_model == CostModel::Pipeline, 1.0};
    const double expect = brute.best(static_cast<int>(t.levels.size()) - 1, -1, g.size() - 1);
    if (!std::isfinite(expect)) continue;
    Plan plan = partition(p, t, o);
    CHECK(plan.predicted.time_per_minibatch_s == doctest::Approx(expect).epsilon(1e-12));
    // Never worse than the full antichain optimum's lower bound... and, with the prefixes,
    // never worse than the best plan over the layer order.
    Brute exact_brute{full, t, o, brute.pd, brute.transfer, 1.0};
    CHECK(plan.predicted.time_per_minibatch_s >=
          exact_brute.best(static_cast<int>(t.levels.size()) - 1, -1, full.size() - 1) * (1 - 1e-12));
    if (prefixes) {
      StateGraph lin = StateGraph::linear(p);
      Brute lin_brute{lin, t, o, brute.pd, brute.transfer, 1.0};
      CHECK(plan.predicted.time_per_minibatch_s <=
            lin_brute.best(static_cast<int>(t.levels.size()) - 1, -1, lin.size() - 1) * (1 + 1e-12));
    }
  }
  MESSAGE(coarsened << " coarsened DAGs checked, " << with_prefixes << " with the layer order's prefixes");
  CHECK(coarsened > 150);
  CHECK(with_prefixes > 20);
}

TEST_CASE("replicated plans hold the minibatches their schedule needs, where memory allows") {
  // 1-2-1 on 4 workers: PipeDream's counts 4, 2, 1, and as the runtime schedules replicas one
  // more at the input stage (the wait for the replicas, stash_in_flights) and at the replicated
  // stage, whose replicas may also delay their allreduces: a second gradient set and one more
  // weight version each.
  const Profile p = testing::uniform_profile(6, 0.001, 0.002, 100, 1000);
  const Topology roomy{{{4, 1e10}}, {}};
  const Plan plan = evaluate_stages(p, roomy, parse_manual_stages("0:2,2:4x2,4:6"));
  REQUIRE(plan.config == "1-2-1");
  CHECK(stash_in_flights(4, {1, 2, 1}) == std::vector<int>{5, 3, 1});
  CHECK(plan.in_flight == 5);
  CHECK(plan.stages[0].in_flight == 5);
  CHECK(plan.stages[1].in_flight == 3);
  CHECK(plan.stages[2].in_flight == 1);
  CHECK(plan.stages[1].delay_allreduce);
  // Where the deeper counts do not fit, a stage keeps PipeDream's (and its replicas do not
  // delay); every stage stays within the memory.
  const double tight = plan.stages[0].memory_bytes - 1;
  const Plan kept =
      evaluate_stages(p, Topology{{{4, 1e10}}, tight}, parse_manual_stages("0:2,2:4x2,4:6"));
  CHECK(kept.in_flight == 4);
  const std::vector<int> pipedream = {4, 2, 1};
  for (std::size_t s = 0; s < 3; ++s) {
    CAPTURE(s);
    CHECK(kept.stages[s].memory_bytes <= tight);
    const bool deeper = kept.stages[s].in_flight == plan.stages[s].in_flight;
    CHECK((deeper || kept.stages[s].in_flight == pipedream[s]));
    if (!deeper) CHECK(kept.stages[s].memory_bytes < plan.stages[s].memory_bytes);
    if (kept.stages[s].replicas > 1) CHECK(kept.stages[s].delay_allreduce == deeper);
  }
}

TEST_CASE("the data-parallel baseline exists only where the whole model fits a worker") {
  // Large weights: a worker that holds a third of them holds a pipeline stage, not the model.
  const Profile p = testing::uniform_profile(6, 0.001, 0.002, 100, 1000000);
  const Topology roomy{{{3, 1e9}}, {}};
  const Plan whole = evaluate_stages(p, roomy, parse_manual_stages("0:6x3"));
  const double need = whole.stages[0].memory_bytes;
  const double baseline = data_parallel_time(p, roomy);
  CHECK(partition(p, roomy).predicted.data_parallel_time_per_minibatch_s == baseline);
  CHECK(partition(p, Topology{{{3, 1e9}}, need}).predicted.data_parallel_time_per_minibatch_s ==
        baseline);
  for (const std::string schedule : {"1f1b-stash", "1f1b-flush"}) {
    CAPTURE(schedule);
    PartitionOptions o;
    o.schedule = schedule;
    const std::optional<Plan> tight = try_partition(p, Topology{{{3, 1e9}}, need - 1}, o);
    REQUIRE(tight.has_value());  // a pipeline fits
    CHECK(tight->stages.size() > 1);
    CHECK(tight->predicted.data_parallel_time_per_minibatch_s == 0);
  }
}

TEST_CASE("plans that leave workers idle hold the minibatches of the ranks they use") {
  // Manual stages on 3 of 8 workers (1-2): the counts of a 3-rank job, not of 8 workers; the
  // plan keeps the topology's workers and runs as a job of its 3 ranks.
  const Profile p = testing::uniform_profile(6, 0.001, 0.002, 100, 1000);
  const Plan plan = evaluate_stages(p, Topology{{{8, 1e10}}, {}}, parse_manual_stages("0:3,3:6x2"));
  CHECK(plan.workers == 8);
  CHECK(plan.ranks_used() == std::vector<int>{0, 1, 2});
  CHECK(plan.stages[0].in_flight == stash_in_flights(3, {1, 2}).front());
  CHECK(plan.predicted.peak_memory_bytes.size() == 8);
  const Plan job = compact_ranks(plan);
  CHECK(job.workers == 3);
  CHECK(job.predicted.peak_memory_bytes.size() == 3);

  // --allow-idle over three levels can skip a worker inside a group: the ranks keep their places
  // (the links between them), and the job numbers them 0..k-1 in order.
  std::mt19937 rng(7);
  int gaps = 0;
  for (int iter = 0; iter < 400 && gaps < 3; ++iter) {
    const Profile q = random_profile(rng, false);
    Topology t = random_topology(rng);
    PartitionOptions o;
    o.allow_idle = true;
    Plan idle;
    try {
      idle = partition(q, t, o);
    } catch (const ConfigError&) {
      continue;
    }
    CHECK(idle.workers == t.workers());
    const std::vector<int> used = idle.ranks_used();
    const Plan compact = compact_ranks(idle);
    CHECK(compact.workers == static_cast<int>(used.size()));
    for (std::size_t s = 0; s < idle.stages.size(); ++s)
      for (std::size_t i = 0; i < idle.stages[s].ranks.size(); ++i)
        CHECK(used[static_cast<std::size_t>(compact.stages[s].ranks[i])] ==
              idle.stages[s].ranks[i]);
    gaps += used.back() + 1 > static_cast<int>(used.size());
  }
  CHECK(gaps > 0);
}

TEST_CASE("bf16 transfers are charged as a compression ratio of 2 where transfers are charged") {
  PartitionOptions pipeline_model;
  set_transfer_dtype(pipeline_model, DType::Float32);
  CHECK_FALSE(pipeline_model.activation_compression.has_value());
  set_transfer_dtype(pipeline_model, DType::BFloat16);
  CHECK(pipeline_model.activation_compression == 2.0);
  PartitionOptions compressed;
  compressed.activation_compression = 3.0;
  set_transfer_dtype(compressed, DType::BFloat16);
  CHECK(compressed.activation_compression == 6.0);
  PartitionOptions pipedream;
  pipedream.cost_model = CostModel::PipeDream;
  set_transfer_dtype(pipedream, DType::BFloat16);  // no ratio: PipeDream charges no transfers
  CHECK_FALSE(pipedream.activation_compression.has_value());
  pipedream.activation_compression = 1.5;
  set_transfer_dtype(pipedream, DType::BFloat16);
  CHECK(pipedream.activation_compression == 3.0);
}

TEST_CASE("a stage's working memory: the largest of its layers' passes, and the runtime's, once") {
  // StageWorkspace over prefix states against the largest by brute force, on random profiles:
  // the layers' temporaries, or what one layer's backward holds (its gradient pair and
  // temporaries) beyond the stage's input gradient, with the last layer as a stage ending there
  // runs it.
  std::mt19937 gen(7);
  for (int trial = 0; trial < 50; ++trial) {
    const int n = 1 + static_cast<int>(gen() % 40);
    Profile p = testing::uniform_profile(n, 0.001, 0.002, 100, 1000);
    p.runtime_bytes = static_cast<std::int64_t>(gen() % 3) * 1000;
    for (LayerProfile& l : p.layers) {
      l.workspace_bytes = gen() % 4 == 0 ? 0 : static_cast<std::int64_t>(gen() % 100000);
      l.gradient_bytes = trial % 2 == 0 ? 0 : static_cast<std::int64_t>(gen() % 100000);
    }
    for (int l = 0; l + 1 < n; ++l)
      if (gen() % 5 == 0) {
        StageEndCosts e;
        e.gradient_bytes = static_cast<std::int64_t>(gen() % 200000);
        p.layers[static_cast<std::size_t>(l)].at_stage_end = e;
      }
    const double input = static_cast<double>(gen() % 50000);
    const StageWorkspace chain(p, /*prefix_states=*/true);
    const StageWorkspace dag(p, /*prefix_states=*/false);
    std::int64_t all = 0;
    for (const LayerProfile& l : p.layers)
      all = std::max({all, l.workspace_bytes,
                      backward_peak_bytes(l) - static_cast<std::int64_t>(input),
                      backward_peak_bytes(as_last_of_stage(l)) - static_cast<std::int64_t>(input)});
    for (int s = -1; s < n; ++s)
      for (int e = s + 1; e < n; ++e) {
        std::int64_t largest = 0;
        for (int l = s + 1; l <= e; ++l) {
          const LayerProfile& lp = p.layers[static_cast<std::size_t>(l)];
          const LayerProfile run = l == e ? as_last_of_stage(lp) : lp;
          largest = std::max({largest, lp.workspace_bytes,
                              backward_peak_bytes(run) - static_cast<std::int64_t>(input)});
        }
        CAPTURE(n);
        CAPTURE(s);
        CAPTURE(e);
        CHECK(chain(s, e, input) == static_cast<double>(p.runtime_bytes + largest));
        CHECK(dag(s, e, input) == static_cast<double>(p.runtime_bytes + all));  // the safe side
      }
  }

  // The planner charges it once per stage, beside what the stage holds; a cap that only the
  // stages without the large workspace meet moves the cut away from the layer that needs it.
  Profile p = testing::uniform_profile(6, 0.001, 0.002, 100, 1000);
  const Topology roomy{{{2, 1e10}}, {}};
  const Plan before = evaluate_stages(p, roomy, parse_manual_stages("0:3,3:6"));
  p.runtime_bytes = 500;
  p.layers[1].workspace_bytes = 70000;
  p.layers[4].workspace_bytes = 20000;
  const Plan after = evaluate_stages(p, roomy, parse_manual_stages("0:3,3:6"));
  REQUIRE(after.stages.size() == 2);
  // Besides the layers' and the runtime's: 4 posted receives and an unfinished send of the
  // 100-byte message between them.
  CHECK(before.stages[0].workspace_bytes == 500);
  CHECK(before.stages[1].workspace_bytes == 500);
  CHECK(after.stages[0].workspace_bytes == 71000);
  CHECK(after.stages[1].workspace_bytes == 21000);
  for (std::size_t s = 0; s < 2; ++s)
    CHECK(after.stages[s].memory_bytes - before.stages[s].memory_bytes ==
          doctest::Approx(after.stages[s].workspace_bytes - before.stages[s].workspace_bytes));
  const Plan reread = plan_from_json(plan_to_json(after), "after");
  CHECK(reread.stages[0].workspace_bytes == 71000);
  // A planned search under a cap respects it with the working memory counted.
  PartitionOptions o;
  o.ignore_transfer = true;
  const double cap = after.stages[0].memory_bytes - 1;
  const Plan capped = partition(p, Topology{{{2, 1e10}}, cap}, o);
  for (const PlanStage& s : capped.stages) CHECK(s.memory_bytes <= cap);
}

TEST_CASE(
    "a ReLU that runs after its max pool: no plan cuts the pair, a hand-made one pays for it") {
  // conv, relu, pool, fc. Were the ReLU's costs the same wherever a stage ends, the best cut of
  // two workers would be after it (8.2 | 8.7 ms); at a stage's end it costs 1 ms instead of 0.2
  // (it runs before the pool, on the full tensor, and keeps that), so the cut goes after the
  // conv (8 | 8.9).
  Profile p = testing::uniform_profile(4, 0.004, 0.004, 1000, 0);
  p.layers[1].forward_s = p.layers[1].backward_s = 0.0001;
  p.layers[2].forward_s = p.layers[2].backward_s = 0.0006;
  p.layers[3].forward_s = p.layers[3].backward_s = 0.00375;
  p.layers[1].saved_bytes = 250;
  Topology t{{{2, 1e10}}, {}};
  PartitionOptions o;
  o.ignore_transfer = true;
  o.straight = true;
  const Plan free = partition(p, t, o);
  CHECK(free.stages[0].end == 2);
  CHECK(free.predicted.time_per_minibatch_s == doctest::Approx(0.0087));
  p.layers[1].at_stage_end = StageEndCosts{0.0005, 0.0005, 0.0005, 0, 1000};
  const Plan plan = partition(p, t, o);
  CHECK(plan.stages[0].end == 1);
  CHECK(plan.predicted.time_per_minibatch_s == doctest::Approx(0.0089));
  // Replicated, hierarchical and typed plans, and interleaved cuts, keep the pair too.
  for (const Plan& q :
       {partition(p, Topology{{{3, 1e10}}, {}}, o), partition(p, Topology{{{3, 1e10}}, {}}),
        partition(p, Topology{{{2, 1e10}, {2, 1e9}}, {}})})
    for (const PlanStage& s : q.stages) CHECK(s.end != 2);
  // Four unreplicated stages need three cuts; two are left.
  CHECK_THROWS_WITH_AS(partition(p, Topology{{{4, 1e10}}, {}}, o),
                       doctest::Contains("2 places where a stage may end"), ConfigError);
  Topology typed = t;
  typed.types = {WorkerType{"only", 2, std::nullopt, std::nullopt}};
  const Plan by_type = partition_typed(DeviceProfiles{{"only", p}}, typed, o);
  CHECK(by_type.stages[0].end == 1);
  Profile six = testing::uniform_profile(6);
  six.layers[2].at_stage_end = StageEndCosts{0.002, 0.004, 0.004, 0, 2000};
  PartitionOptions interleaved;
  interleaved.virtual_stages = 2;
  const Plan four = partition(six, t, interleaved);  // three of the four cuts left
  REQUIRE(four.num_stages() == 4);
  for (const PlanStage& s : four.stages) CHECK(s.end != 3);
  interleaved.virtual_stages = 3;
  CHECK_THROWS_WITH_AS(partition(six, t, interleaved),
                       doctest::Contains("has only 4 where a stage may end"), ConfigError);
  // A hand-made plan that ends a stage at the ReLU is charged what it will run, by the
  // partitioner and the simulator alike.
  const Plan cut = evaluate_stages(p, t, parse_manual_stages("0:2,2:4"), o);
  CHECK(cut.stages[0].compute_s == doctest::Approx(0.009));
  CHECK(cut.predicted.time_per_minibatch_s == doctest::Approx(0.009));
  const StageTiming ends = stage_timing(p, cut, 0, 1.0);
  CHECK(ends.forward_s == doctest::Approx(0.0045));
  CHECK(ends.backward_s == doctest::Approx(0.0045));
  CHECK(ends.activation_bytes == 1000 + 1000);  // the conv's output and the ReLU's full one
  const StageTiming inside = stage_timing(p, plan, 1, 1.0);
  CHECK(inside.forward_s == doctest::Approx(0.0001 + 0.0006 + 0.00375));
  // The memory model stashes the full tensor there too: 750 bytes more per minibatch in flight.
  Profile unordered = p;
  unordered.layers[1].at_stage_end.reset();
  const Plan cheap = evaluate_stages(unordered, t, parse_manual_stages("0:2,2:4"), o);
  CHECK(cut.stages[0].memory_bytes - cheap.stages[0].memory_bytes ==
        doctest::Approx(750.0 * cut.stages[0].in_flight));
  CHECK(cut.stages[0].in_flight == 2);
}

}  // namespace test_partition
