// Planning over mixed clusters and for a deadline or budget: the typed partitioner against
// exhaustive enumeration, against partition() on one type, the placement of heavy layers on the
// fast type, cost planning's choices against the enumeration, the frontier, errors, the
// simulator's per-type timing, and topology / plan.json round trips with and without the new
// fields.
#include <pipeline/core/error.hpp>
#include <pipeline/plan/cost_model.hpp>
#include <pipeline/plan/cost_plan.hpp>
#include <pipeline/plan/partition.hpp>
#include <pipeline/plan/plan_json.hpp>
#include <pipeline/plan/topology_io.hpp>
#include <pipeline/plan/typed_partition.hpp>
#include <pipeline/schedule/generator.hpp>
#include <pipeline/schedule/simulator.hpp>

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace test_mixed_planning {

using namespace pipeline;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

Profile chain(const std::vector<double>& compute_ms, std::mt19937& rng, int batch = 32) {
  std::uniform_real_distribution<double> bytes(1e3, 1e6), params(0, 2e6);
  Profile p;
  p.model = "random-chain";
  p.batch_size = batch;
  for (std::size_t i = 0; i < compute_ms.size(); ++i) {
    LayerProfile l;
    l.name = fmt::format("l{}", i);
    l.kind = "Linear";
    l.forward_s = compute_ms[i] / 3 * 1e-3;
    l.backward_s = 2 * compute_ms[i] / 3 * 1e-3;
    l.output_bytes = static_cast<std::int64_t>(bytes(rng));
    l.parameter_bytes = static_cast<std::int64_t>(params(rng));
    p.layers.push_back(l);
  }
  return p;
}

// The same layers with other times (another worker type).
Profile retimed(Profile p, std::mt19937& rng) {
  std::uniform_real_distribution<double> ms(0.2, 6);
  for (auto& l : p.layers) {
    const double c = ms(rng) * 1e-3;
    l.forward_s = c / 3;
    l.backward_s = 2 * c / 3;
  }
  return p;
}

struct Instance {
  DeviceProfiles profiles;
  Topology topology;
  PartitionOptions options;
  std::vector<std::string> names;
};

Instance random_instance(std::mt19937& rng, bool priced) {
  std::uniform_int_distribution<int> layers(2, 6), types(1, 3), count(1, 3), coin(0, 3);
  std::uniform_real_distribution<double> ms(0.2, 6), bw(1e8, 1e10), price(0.5, 5);
  Instance x;
  std::vector<double> c(static_cast<std::size_t>(layers(rng)));
  for (double& v : c) v = ms(rng);
  const Profile base = chain(c, rng);
  const int T = types(rng);
  int total = 0;
  for (int t = 0; t < T; ++t) {
    WorkerType w;
    w.name = fmt::format("type{}", t);
    w.count = count(rng);
    total += w.count;
    if (priced) w.price_per_worker_hour = price(rng);
    x.profiles[w.name] = t == 0 ? base : retimed(base, rng);
    x.names.push_back(w.name);
    x.topology.types.push_back(w);
  }
  x.topology.levels.push_back({total, bw(rng)});
  // Memory tight enough, some of the time, that stashing (or anything) stops fitting somewhere.
  if (coin(rng) == 0)
    x.topology.memory_bytes_per_worker = std::uniform_real_distribution<double>(4e6, 2e7)(rng);
  if (coin(rng) == 0)
    x.topology.types[0].memory_bytes_per_worker =
        std::uniform_real_distribution<double>(4e6, 2e7)(rng);
  const int r = coin(rng);
  x.options.recompute = r == 0 ? Recompute::All : r == 1 ? Recompute::None : Recompute::Auto;
  x.options.straight = coin(rng) == 0;
  x.options.ignore_transfer = coin(rng) == 0;
  if (coin(rng) == 0) x.options.activation_compression = 2.0;
  x.options.optimizer_state_factor = coin(rng) == 0 ? 2.0 : 1.0;
  return x;
}

struct BruteStage {
  int begin, end, type, replicas;
};

// The cost model written out from its formulas (cost_model.hpp), independently of the solver.
double evaluate(const Instance& x, const std::vector<BruteStage>& stages) {
  const double B = x.topology.levels.front().bandwidth_bytes_per_s;
  const double R = x.options.activation_compression.value_or(1.0);
  const double osf = x.options.optimizer_state_factor;
  int after = 0;
  for (const auto& s : stages) after += s.replicas;
  double worst = 0;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const BruteStage& s = stages[i];
    const WorkerType& w = x.topology.types[static_cast<std::size_t>(s.type)];
    const Profile& p = x.profiles.at(w.name);
    const std::optional<double> memory =
        w.memory_bytes_per_worker ? w.memory_bytes_per_worker : x.topology.memory_bytes_per_worker;
    double C = 0, F = 0, P = 0, A = 0;
    for (int l = s.begin; l < s.end; ++l) {
      const LayerProfile& lp = p.layers[static_cast<std::size_t>(l)];
      C += lp.forward_s + lp.backward_s;
      F += lp.forward_s;
      P += static_cast<double>(lp.parameter_bytes);
      A += static_cast<double>(stash_bytes(lp));
    }
    const double in =
        i > 0 ? static_cast<double>(p.layers[static_cast<std::size_t>(s.begin - 1)].output_bytes)
              : 0.0;
    const double out =
        static_cast<double>(p.layers[static_cast<std::size_t>(s.end - 1)].output_bytes);
    const int r = s.replicas;
    const int flight = (after - 1) / r + 1;
    after -= r;
    // Four posted receives and one unfinished send hold a buffer of the larger message each (none
    // after the last stage).
    const double posted = 5 * std::max(in, i + 1 < stages.size() ? out : 0.0) / R;
    const double weights = P * (2 + osf + (flight - 1)) + posted;
    const double stash = weights + (A + in) * flight + in;
    const double again = weights + in * flight + A + in;
    double extra = 0;
    const Recompute rc = x.options.recompute;
    if (rc == Recompute::All) {
      if (memory && again > *memory) return kInf;
      extra = F;
    } else if (memory && stash > *memory) {
      if (rc == Recompute::None || again > *memory) return kInf;
      extra = F;
    }
    const double sync = 4.0 * (r - 1) * P / (B * r);
    double t = (C + extra + sync) / r;
    // A stage's replicas receive its input and send its output over their own links.
    if (!x.options.ignore_transfer) {
      if (i > 0) t = std::max(t, 2 * in / (B * r * R));
      if (i + 1 < stages.size()) t = std::max(t, 2 * out / (B * r * R));
    }
    worst = std::max(worst, t);
  }
  return worst;
}

// Every plan of the instance: the best time for each usage vector (as a map over the vectors).
void enumerate(const Instance& x, int begin, std::vector<int>& left,
               std::vector<BruteStage>& stages, std::map<std::vector<int>, double>& best) {
  const int L = x.profiles.begin()->second.size();
  if (begin == L) {
    std::vector<int> used;
    for (std::size_t t = 0; t < left.size(); ++t)
      used.push_back(x.topology.types[t].count - left[t]);
    const double v = evaluate(x, stages);
    auto it = best.find(used);
    if (it == best.end())
      best[used] = v;
    else
      it->second = std::min(it->second, v);
    return;
  }
  for (int end = begin + 1; end <= L; ++end)
    for (std::size_t t = 0; t < left.size(); ++t)
      for (int r = 1; r <= (x.options.straight ? std::min(1, left[t]) : left[t]); ++r) {
        left[t] -= r;
        stages.push_back({begin, end, static_cast<int>(t), r});
        enumerate(x, end, left, stages, best);
        stages.pop_back();
        left[t] += r;
      }
}

std::map<std::vector<int>, double> brute_force(const Instance& x) {
  std::vector<int> left;
  for (const auto& w : x.topology.types) left.push_back(w.count);
  std::vector<BruteStage> stages;
  std::map<std::vector<int>, double> best;
  enumerate(x, 0, left, stages, best);
  return best;
}

// A plan's stages as the enumeration writes them.
std::vector<BruteStage> stages_of(const Instance& x, const Plan& plan) {
  std::vector<BruteStage> out;
  for (const PlanStage& s : plan.stages) {
    int type = -1;
    for (std::size_t t = 0; t < x.names.size(); ++t)
      if (x.names[t] == s.device) type = static_cast<int>(t);
    REQUIRE(type >= 0);
    out.push_back({s.begin, s.end, type, s.replicas});
  }
  return out;
}

bool close(double a, double b) {
  if (!std::isfinite(a) || !std::isfinite(b)) return a == b;
  return std::abs(a - b) <= 1e-9 * std::max(std::abs(a), std::abs(b));
}

}  // namespace

TEST_CASE("typed partitioner: exact against enumeration on random small instances") {
  std::mt19937 rng(14);
  int finite = 0, compared = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const Instance x = random_instance(rng, false);
    CAPTURE(trial);
    TypedPartitioner solver(x.profiles, x.topology, x.options);
    const auto best = brute_force(x);
    for (std::size_t v = 1; v < solver.num_usages(); ++v) {
      const std::vector<int> u = solver.usage(v);
      CHECK(solver.usage_index(u) == v);
      const auto it = best.find(u);
      const double expected = it == best.end() ? kInf : it->second;
      const double got = solver.best_time(v);
      CAPTURE(v);
      CHECK(close(got, expected));
      ++compared;
      if (!std::isfinite(got)) continue;
      ++finite;
      // The plan itself: its stages, re-evaluated by the enumeration's model, reach the optimum
      // and use exactly these workers, ranks consecutive.
      const Plan plan = solver.plan(v);
      CHECK(close(evaluate(x, stages_of(x, plan)), got));
      CHECK(plan.predicted.time_per_minibatch_s == got);
      std::vector<int> used(u.size(), 0);
      int rank = 0;
      for (const PlanStage& s : plan.stages) {
        for (int r : s.ranks) CHECK(r == rank++);
        for (std::size_t t = 0; t < x.names.size(); ++t)
          if (x.names[t] == s.device) used[t] += s.replicas;
      }
      CHECK(used == u);
      CHECK(plan.workers == rank);
      if (x.options.straight)
        for (const PlanStage& s : plan.stages) CHECK(s.replicas == 1);
    }
  }
  CHECK(finite > 1000);  // the instances are not all infeasible
  CHECK(compared > finite);
}

TEST_CASE("typed partitioner: one type equals partition() on one level") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 60; ++trial) {
    CAPTURE(trial);
    std::uniform_real_distribution<double> ms(0.2, 6);
    std::vector<double> c(static_cast<std::size_t>(std::uniform_int_distribution<int>(2, 9)(rng)));
    for (double& v : c) v = ms(rng);
    const Profile p = chain(c, rng);
    const int n = std::uniform_int_distribution<int>(1, 7)(rng);
    const double bw = std::uniform_real_distribution<double>(1e8, 1e10)(rng);
    Topology flat{{{n, bw}}};
    if (trial % 3 == 0)
      flat.memory_bytes_per_worker = std::uniform_real_distribution<double>(5e6, 3e7)(rng);
    PartitionOptions o;
    o.recompute = trial % 2 ? Recompute::Auto : Recompute::None;
    Topology typed = flat;
    typed.types = {WorkerType{"only", n, std::nullopt, std::nullopt}};
    TypedPartitioner solver(DeviceProfiles{{"only", p}}, typed, o);
    const double got = solver.best_time(solver.usage_index({n}));
    const std::optional<Plan> plan = try_partition(p, flat, o);
    CHECK(close(got, plan ? plan->predicted.time_per_minibatch_s : kInf));
    if (!plan) continue;
    const Plan typed_plan = solver.plan(solver.usage_index({n}));
    CHECK(typed_plan.config.size() > 0);
    // Where both chose the same stages, they hold the same minibatches and delay alike.
    bool same = typed_plan.num_stages() == plan->num_stages();
    for (int s = 0; same && s < plan->num_stages(); ++s)
      same = typed_plan.stages[s].begin == plan->stages[s].begin &&
             typed_plan.stages[s].end == plan->stages[s].end &&
             typed_plan.stages[s].replicas == plan->stages[s].replicas;
    if (!same) continue;
    CHECK(typed_plan.in_flight == plan->in_flight);
    for (int s = 0; s < plan->num_stages(); ++s) {
      CHECK(typed_plan.stages[s].in_flight == plan->stages[s].in_flight);
      CHECK(typed_plan.stages[s].delay_allreduce == plan->stages[s].delay_allreduce);
    }
  }
}

TEST_CASE("typed partitioner: one type equals partition() on a DAG's antichain states") {
  // Two diamonds in a row: 0 -> {1, 2} -> 3 -> {4, 5} -> 6, so stages may split a branch pair.
  std::mt19937 rng(11);
  for (int trial = 0; trial < 30; ++trial) {
    CAPTURE(trial);
    std::uniform_real_distribution<double> ms(0.2, 6);
    std::vector<double> c(7);
    for (double& v : c) v = ms(rng);
    Profile p = chain(c, rng);
    p.layers[2].inputs = {0};
    p.layers[3].inputs = {1, 2};
    p.layers[5].inputs = {3};
    p.layers[6].inputs = {4, 5};
    REQUIRE_FALSE(p.is_chain());
    const int n = std::uniform_int_distribution<int>(1, 5)(rng);
    Topology flat{{{n, std::uniform_real_distribution<double>(1e8, 1e10)(rng)}}};
    if (trial % 2)
      flat.memory_bytes_per_worker = std::uniform_real_distribution<double>(5e6, 3e7)(rng);
    Topology typed = flat;
    typed.types = {WorkerType{"only", n, std::nullopt, std::nullopt}};
    TypedPartitioner solver(DeviceProfiles{{"only", p}}, typed);
    const double got = solver.best_time(solver.usage_index({n}));
    const std::optional<Plan> plan = try_partition(p, flat);
    CHECK(close(got, plan ? plan->predicted.time_per_minibatch_s : kInf));
  }
}

TEST_CASE("typed partitioner: the heavy layers go to the fast type") {
  // Two heavy layers (8 ms each on the slow type) and four light ones (1 ms); the fast type is
  // ten times as fast. One fast worker taking both heavy layers (1.6 ms) while three slow ones
  // share the light layers beats every plan that leaves a heavy layer on slow workers (>= 8/3 ms).
  std::mt19937 rng(1);
  Profile slow = chain({8, 8, 1, 1, 1, 1}, rng);
  for (auto& l : slow.layers) {
    l.parameter_bytes = 0;
    l.output_bytes = 1;
  }
  Profile fast = slow;
  for (auto& l : fast.layers) {
    l.forward_s /= 10;
    l.backward_s /= 10;
  }
  Topology t{{{4, 1e12}}};
  t.types = {WorkerType{"fast", 1, std::nullopt, 2.0}, WorkerType{"slow", 3, std::nullopt, 1.0}};
  const Plan plan = partition_typed({{"fast", fast}, {"slow", slow}}, t);
  CHECK(plan.predicted.time_per_minibatch_s == doctest::Approx(1.6e-3).epsilon(1e-6));
  for (const PlanStage& s : plan.stages) {
    if (s.begin < 2)
      CHECK(s.device == "fast");
    else
      CHECK(s.device == "slow");
  }
  // And the other way round: when the slow type is the only one with enough workers to spread
  // the light layers, a plan without the fast type is slower.
  TypedPartitioner solver({{"fast", fast}, {"slow", slow}}, t);
  CHECK(solver.best_time(solver.usage_index({0, 3})) > 2 * plan.predicted.time_per_minibatch_s);
  // plan.json keeps the devices; a plan without them is written without the field.
  const Plan back = plan_from_json(plan_to_json(plan), "typed");
  for (std::size_t i = 0; i < plan.stages.size(); ++i)
    CHECK(back.stages[i].device == plan.stages[i].device);
}

TEST_CASE("typed partitioner and partition(): requests they refuse") {
  std::mt19937 rng(2);
  const Profile p = chain({1, 2, 3}, rng);
  Topology t{{{3, 1e10}}};
  t.types = {WorkerType{"a", 1, std::nullopt, std::nullopt},
             WorkerType{"b", 2, std::nullopt, std::nullopt}};
  CHECK_THROWS_WITH_AS(partition(p, t), doctest::Contains("worker types"), ConfigError);
  CHECK_THROWS_WITH_AS(partition_typed({{"a", p}}, t), doctest::Contains("'b' has no profile"),
                       ConfigError);
  PartitionOptions pd;
  pd.cost_model = CostModel::PipeDream;
  CHECK_THROWS_AS(partition_typed({{"a", p}, {"b", p}}, t, pd), ConfigError);
  Profile other = p;
  other.layers.pop_back();
  CHECK_THROWS_WITH_AS(partition_typed({{"a", p}, {"b", other}}, t),
                       doctest::Contains("same model"), ConfigError);
  // The same layers under other options, or in another dtype: the plan could follow only one.
  Profile wider = p, narrow = p;
  wider.model = narrow.model = "fashion-cnn";
  wider.architecture = {{"width", 2}};
  narrow.architecture = {{"width", 1}};
  CHECK_THROWS_WITH_AS(partition_typed({{"a", narrow}, {"b", wider}}, t),
                       doctest::Contains("of fashion-cnn with --width 2 but the profile of 'a' "
                                         "with --width 1"),
                       ConfigError);
  Profile bf16 = p;
  bf16.dtype = "bfloat16";
  CHECK_THROWS_WITH_AS(partition_typed({{"a", p}, {"b", bf16}}, t),
                       doctest::Contains("timed in bfloat16 but the profile of 'a' in float32"),
                       ConfigError);
  // Memory nothing fits in: the error names the types.
  Topology tiny = t;
  tiny.memory_bytes_per_worker = 10;
  CHECK_THROWS_WITH_AS(partition_typed({{"a", p}, {"b", p}}, tiny),
                       doctest::Contains("no plan fits"), ConfigError);
}

TEST_CASE("simulator: each stage timed from its device type's profile") {
  std::mt19937 rng(3);
  Profile slow = chain({3, 6}, rng);
  Profile fast = slow;
  for (auto& l : fast.layers) {
    l.forward_s /= 3;
    l.backward_s /= 3;
  }
  Plan plan;
  plan.workers = 2;
  plan.schedule = "1f1b-flush";
  plan.stages = {PlanStage{0, 1, 1, {0}}, PlanStage{1, 2, 1, {1}}};
  plan.stages[0].device = "fast";
  plan.stages[1].device = "slow";
  const DeviceProfiles profiles{{"fast", fast}, {"slow", slow}};
  const Schedule schedule = generate_schedule("1f1b-flush", ScheduleSpec::from_plan(plan, 1, 1));
  SimulateOptions o;
  o.device_profiles = &profiles;
  // One microbatch through free links: F0 F1 B1 B0 one after another.
  const Simulation typed = simulate(schedule, slow, plan, Topology{}, o);
  const auto& f = fast.layers[0];
  const auto& s = slow.layers[1];
  CHECK(typed.makespan_s ==
        doctest::Approx(f.forward_s + s.forward_s + s.backward_s + f.backward_s));
  const Simulation untyped = simulate(schedule, slow, plan, Topology{});
  CHECK(untyped.makespan_s > typed.makespan_s);
  const DeviceProfiles missing{{"slow", slow}};
  o.device_profiles = &missing;
  CHECK_THROWS_WITH_AS(simulate(schedule, slow, plan, Topology{}, o), doctest::Contains("'fast'"),
                       ConfigError);
}

TEST_CASE("durations: parse and format") {
  CHECK(parse_duration("90s") == 90);
  CHECK(parse_duration("45m") == 45 * 60);
  CHECK(parse_duration("6h") == 6 * 3600);
  CHECK(parse_duration("2d") == 2 * 86400);
  CHECK(parse_duration("1.5h") == 5400);
  CHECK(parse_duration("120") == 120);
  for (const char* bad : {"", "h", "-1h", "0s", "6 hours", "1e400s", "nan", "6x"})
    CHECK_THROWS_AS(parse_duration(bad), ConfigError);
  CHECK(format_duration(42) == "42s");
  CHECK(format_duration(450) == "7.5m");
  CHECK(format_duration(7.4 * 3600) == "7.4h");
  CHECK(format_duration(3 * 86400) == "3d");
  CHECK(format_duration(7.41 * 3600, true) == "7.41h");
  CHECK(format_duration(7.4123 * 3600, true) == "7.42h");  // never below the value
  CHECK(parse_duration(format_duration(26651.2, true)) >= 26651.2);
}

TEST_CASE("cost planning on worker types: deadline, budget and frontier against the enumeration") {
  std::mt19937 rng(99);
  const double samples = 1e6;
  int checked = 0;
  for (int trial = 0; trial < 80; ++trial) {
    CAPTURE(trial);
    const Instance x = random_instance(rng, true);
    std::vector<CostedPlan> candidates;
    try {
      candidates = cost_candidates(x.profiles, x.topology, x.options, samples);
    } catch (const ConfigError&) {
      CHECK(brute_force(x).empty() == false);  // only when nothing fits at all
      continue;
    }
    // The enumeration's (time, cost) of every usage.
    const auto best = brute_force(x);
    struct Point {
      double time, cost;
    };
    std::vector<Point> all;
    for (const auto& [u, t] : best) {
      if (!std::isfinite(t)) continue;
      double price = 0;
      for (std::size_t i = 0; i < u.size(); ++i)
        price += u[i] * *x.topology.types[i].price_per_worker_hour;
      const double time = t * samples / 32;
      all.push_back({time, time / 3600 * price});
    }
    REQUIRE(all.size() == candidates.size());
    double fastest = kInf, cheapest = kInf;
    for (const Point& p : all) {
      fastest = std::min(fastest, p.time);
      cheapest = std::min(cheapest, p.cost);
    }
    const double eps = 1e-9;
    // Deadline: halfway between the fastest and the slowest.
    double slowest = 0;
    for (const Point& p : all) slowest = std::max(slowest, p.time);
    const double deadline = 0.5 * (fastest + slowest);
    const CostedPlan& d = cheapest_within_deadline(candidates, deadline, samples);
    CHECK(d.time_s <= deadline);
    for (const Point& p : all)
      if (p.time <= deadline) CHECK(d.cost <= p.cost * (1 + eps));
    CHECK_THROWS_WITH_AS(cheapest_within_deadline(candidates, fastest * 0.9, samples),
                         doctest::Contains("raise --deadline to"), ConfigError);
    // Budget: halfway between the cheapest and the dearest.
    double dearest = 0;
    for (const Point& p : all) dearest = std::max(dearest, p.cost);
    const double budget = 0.5 * (cheapest + dearest);
    const CostedPlan& b = fastest_within_budget(candidates, budget, samples);
    CHECK(b.cost <= budget);
    for (const Point& p : all)
      if (p.cost <= budget) CHECK(b.time_s <= p.time * (1 + eps));
    if (cheapest > 0)
      CHECK_THROWS_WITH_AS(fastest_within_budget(candidates, cheapest * 0.9, samples),
                           doctest::Contains("raise --budget to"), ConfigError);
    // Frontier: non-dominated, ascending in time, strictly descending in cost, with both ends.
    const auto front = pareto_frontier(candidates);
    REQUIRE(!front.empty());
    CHECK(front.front().time_s == doctest::Approx(fastest).epsilon(eps));
    CHECK(front.back().cost == doctest::Approx(cheapest).epsilon(eps));
    for (std::size_t i = 0; i < front.size(); ++i) {
      if (i) {
        CHECK(front[i].time_s > front[i - 1].time_s);
        CHECK(front[i].cost < front[i - 1].cost);
      }
      for (const Point& p : all)
        CHECK_FALSE((p.time <= front[i].time_s * (1 - eps) && p.cost <= front[i].cost * (1 - eps)));
    }
    // Every candidate is on the frontier or dominated by a point of it.
    for (const CostedPlan& c : candidates) {
      bool covered = false;
      for (const CostedPlan& f : front)
        covered = covered || (f.time_s <= c.time_s && f.cost <= c.cost);
      CHECK(covered);
    }
    ++checked;
  }
  CHECK(checked > 40);
}

TEST_CASE("cost planning on one kind of worker: sub-clusters of whole groups") {
  std::mt19937 rng(5);
  const Profile p = chain({2, 3, 1, 4, 2}, rng);
  Topology one{{{5, 1e10}}};
  one.price_per_worker_hour = 2.0;
  const auto candidates = cost_candidates({{"", p}}, one, {}, 1e5);
  REQUIRE(candidates.size() == 5);
  for (int n = 1; n <= 5; ++n) {
    const CostedPlan& c = candidates[static_cast<std::size_t>(n - 1)];
    CHECK(c.plan.workers == n);
    const Plan direct = partition(p, Topology{{{n, 1e10}}});
    CHECK(c.plan.predicted.time_per_minibatch_s == direct.predicted.time_per_minibatch_s);
    CHECK(c.time_s == doctest::Approx(direct.predicted.time_per_minibatch_s * 1e5 / 32));
    CHECK(c.cost == doctest::Approx(c.time_s / 3600 * 2.0 * n));
  }
  Topology two{{{2, 1e10}, {3, 1e9}}};
  two.price_per_worker_hour = 1.0;
  std::vector<int> workers;
  for (const CostedPlan& c : cost_candidates({{"", p}}, two, {}, 1e5))
    workers.push_back(c.plan.workers);
  CHECK(workers == std::vector<int>{1, 2, 4, 6});
  Topology unpriced{{{4, 1e10}}};
  CHECK_THROWS_WITH_AS(cost_candidates({{"", p}}, unpriced, {}, 1e5), doctest::Contains("no price"),
                       ConfigError);
  Profile unbatched = p;
  unbatched.batch_size = 0;
  CHECK_THROWS_WITH_AS(cost_candidates({{"", unbatched}}, one, {}, 1e5),
                       doctest::Contains("batch size"), ConfigError);
  // The frontier JSON and SVG name every point.
  const auto front = pareto_frontier(candidates);
  const nlohmann::json j = frontier_to_json(front, one, 1e5);
  CHECK(j.at("points").size() == front.size());
  const std::string svg = frontier_svg(front, candidates, one, 1e5);
  CHECK(svg.rfind("<svg", 0) == 0);
  CHECK(svg.find("</svg>") != std::string::npos);
}

TEST_CASE("topology and plan.json round trips with and without types, prices and devices") {
  // An old topology: no types, no price; written back without them.
  const Topology old = parse_topology(
      R"({"levels": [{"count": 4, "bandwidth": "25Gbit/s"}], "memory_per_worker": "16GiB"})",
      "old");
  CHECK_FALSE(old.typed());
  CHECK_FALSE(old.price_per_worker_hour.has_value());
  const nlohmann::json oj = topology_to_json(old);
  CHECK_FALSE(oj.contains("types"));
  CHECK_FALSE(oj.contains("price_per_worker_hour"));
  const Topology t = parse_topology(R"({"levels": [{"count": 24, "bandwidth": "25Gbit/s"}],
      "price_per_worker_hour": 2,
      "types": [{"name": "h100", "count": 8, "memory_per_worker": "80GiB", "price_per_worker_hour": 4.5},
                {"name": "a100", "count": 16}]})",
                                    "typed");
  REQUIRE(t.types.size() == 2);
  CHECK(t.types[0].name == "h100");
  CHECK(*type_memory(t, 0) == doctest::Approx(80.0 * 1073741824));
  CHECK_FALSE(type_memory(t, 1).has_value());
  CHECK(*type_price(t, 0) == 4.5);
  CHECK(*type_price(t, 1) == 2.0);
  const Topology back = topology_from_json(topology_to_json(t), "back");
  CHECK(topology_to_json(back) == topology_to_json(t));
  for (
      const char* bad :
      {R"({"levels": [{"count": 24, "bandwidth": 1e9}], "types": [{"name": "a", "count": 8}]})",  // 8 != 24
       R"({"levels": [{"count": 2, "bandwidth": 1e9}, {"count": 2, "bandwidth": 1e9}], "types": [{"name": "a", "count": 4}]})",
       R"({"levels": [{"count": 2, "bandwidth": 1e9}], "types": [{"name": "a", "count": 1}, {"name": "a", "count": 1}]})",
       R"({"levels": [{"count": 1, "bandwidth": 1e9}], "types": [{"name": "a b", "count": 1}]})",
       R"({"levels": [{"count": 1, "bandwidth": 1e9}], "types": [{"name": "a", "count": 0}]})",
       R"({"levels": [{"count": 1, "bandwidth": 1e9}], "types": [{"name": "a", "count": 1, "price_per_worker_hour": -1}]})",
       R"({"levels": [{"count": 1, "bandwidth": 1e9}], "types": []})",
       R"({"levels": [{"count": 1, "bandwidth": 1e9}], "price_per_worker_hour": "cheap"})"})
    CHECK_THROWS_AS(parse_topology(bad, "bad"), ConfigError);
  CHECK_THROWS_WITH_AS(parse_topology("", "empty.json"),
                       doctest::Contains("the file is empty; expected a topology JSON object"),
                       ConfigError);
  const WorkerType w = parse_worker_type("h100:8:4.5:80GiB");
  CHECK(w.name == "h100");
  CHECK(w.count == 8);
  CHECK(*w.price_per_worker_hour == 4.5);
  CHECK(*w.memory_bytes_per_worker == doctest::Approx(80.0 * 1073741824));
  CHECK_FALSE(parse_worker_type("cpu:4").price_per_worker_hour.has_value());
  for (const char* bad : {"h100", "h100:0", "h100:8:x", ":8", "h100:8:1:2:3", "h100:8:1:lots"})
    CHECK_THROWS_AS(parse_worker_type(bad), ConfigError);

  // plan.json: "device" is written only when set, and read back; old plans load unchanged.
  const std::string old_plan =
      R"({"format": "pipeline.plan/1", "model": "m", "workers": 2, "stages": [
      {"layers": [0, 2], "replicas": 1, "ranks": [0]}, {"layers": [2, 4], "replicas": 1, "ranks": [1]}]})";
  const Plan p = parse_plan(old_plan, "old");
  CHECK(p.stages[0].device.empty());
  CHECK(plan_to_json(p).dump().find("device") == std::string::npos);
  Plan typed = p;
  typed.stages[0].device = "h100";
  typed.stages[1].device = "a100";
  const nlohmann::json tj = plan_to_json(typed);
  CHECK(tj.at("format") == "pipeline.plan/1");
  CHECK(tj.at("stages")[0].at("device") == "h100");
  const Plan tb = plan_from_json(tj, "typed");
  CHECK(tb.stages[1].device == "a100");
  nlohmann::json bad = tj;
  bad["stages"][0]["device"] = 3;
  CHECK_THROWS_AS(plan_from_json(bad, "bad"), ConfigError);
  bad["stages"][0]["device"] = "";
  CHECK_THROWS_AS(plan_from_json(bad, "bad"), ConfigError);
}

}  // namespace test_mixed_planning

namespace test_mixed_planning {

TEST_CASE("cost planning's refusals name the plan's workers by type") {
  CostedPlan c;
  c.plan.workers = 4;
  c.plan.config = "3-1";
  c.plan.stages = {
      PlanStage{.begin = 0, .end = 1, .replicas = 3, .ranks = {0, 1, 2}, .device = "a100"},
      PlanStage{.begin = 1, .end = 2, .replicas = 1, .ranks = {3}, .device = "h100"}};
  c.time_s = 100;
  c.cost = 10;
  const std::vector<CostedPlan> one{c};
  CHECK_THROWS_WITH_AS(cheapest_within_deadline(one, 50, 1e6),
                       doctest::Contains("(3 a100 + 1 h100, config 3-1"), ConfigError);
  CHECK_THROWS_WITH_AS(fastest_within_budget(one, 5, 1e6),
                       doctest::Contains("(3 a100 + 1 h100 for"), ConfigError);
  std::vector<CostedPlan> untyped = one;
  for (PlanStage& st : untyped.front().plan.stages) st.device.clear();
  CHECK_THROWS_WITH_AS(cheapest_within_deadline(untyped, 50, 1e6),
                       doctest::Contains("(4 workers, config 3-1"), ConfigError);
}

}  // namespace test_mixed_planning
