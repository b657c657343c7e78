// Schedules for any replica counts: every schedule kind validates and simulates on random plans
// (up to 32 workers, random replica vectors, depths, rank orders and in_flight), PipeDream's
// uneven configurations that used to deadlock (4-2-3-3-2-1-1, 9-1-2-1-1-1-1) run, and every plan
// the partitioner emits for PipeDream's published profiles schedules, validates and simulates.
#include <pipeline/core/rng.hpp>
#include <pipeline/plan/cost_model.hpp>
#include <pipeline/plan/partition.hpp>
#include <pipeline/profile/pipedream_graph.hpp>
#include <pipeline/schedule/generator.hpp>
#include <pipeline/schedule/simulator.hpp>
#include <pipeline/schedule/validate.hpp>

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <numeric>

#include "../support/pipedream_profiles.hpp"
#include "../support/uniform_profile.hpp"

namespace test_replicated_schedules {

using namespace pipeline;

namespace {

// Under AddressSanitizer (CI's asan step) the random sweeps run a third of their cases and leave
// out the slowest ones (replica counts whose least common multiple passes 60, the models planned
// over coarsened states): every code path is still reached, at a tenth of the speed.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

const std::vector<std::string> kKinds = {"gpipe",      "1f1b-flush",       "zb-h1",
                                         "1f1b-stash", "1f1b-stash-vsync", "2bw"};

bool is_stash(const std::string& kind) {
  return kind.rfind("1f1b-stash", 0) == 0;
}

int replica_lcm(const Plan& plan) {
  int l = 1;
  for (auto& s : plan.stages) l = std::lcm(l, s.replicas);
  return l;
}

// A plan of one layer per stage over a uniform profile (1 ms forward, 2 ms backward per layer).
struct Case {
  Profile profile;
  Plan plan;
  Topology topology;
};

Case random_case(Rng& rng) {
  Case c;
  const int workers = 1 + static_cast<int>(rng.below(32));
  std::vector<int> replicas;
  for (int left = workers; left > 0;) {
    const int r = 1 + static_cast<int>(rng.below(static_cast<std::uint64_t>(std::min(left, 8))));
    replicas.push_back(r);
    left -= r;
  }
  std::vector<int> order(static_cast<std::size_t>(workers));
  std::iota(order.begin(), order.end(), 0);
  if (rng.below(2) == 1)
    for (int i = workers - 1; i > 0; --i)
      std::swap(order[static_cast<std::size_t>(i)],
                order[rng.below(static_cast<std::uint64_t>(i) + 1)]);
  c.profile.model = "uniform";
  c.profile.batch_size = 32;
  int next = 0;
  for (std::size_t s = 0; s < replicas.size(); ++s) {
    LayerProfile l;
    l.name = fmt::format("layer{}", s);
    l.kind = "Linear";
    l.forward_s = 1e-3;
    l.backward_s = 2e-3;
    l.output_bytes = 1 << 16;
    l.parameter_bytes = 1 << 12;
    c.profile.layers.push_back(l);
    PlanStage st;
    st.begin = static_cast<int>(s);
    st.end = static_cast<int>(s) + 1;
    st.replicas = replicas[s];
    for (int i = 0; i < replicas[s]; ++i)
      st.ranks.push_back(order[static_cast<std::size_t>(next++)]);
    c.plan.stages.push_back(st);
  }
  c.plan.model = "uniform";
  c.plan.workers = workers;
  c.plan.in_flight = static_cast<int>(rng.below(9));
  c.topology = Topology{{{workers, 1e10}}, {}};
  return c;
}

// Generates, validates and simulates `kind` for the plan, and with `cores` > 0 also with the
// ranks sharing that many cores (no faster than on their own, the cores doing no more than their
// share); returns the error, empty when fine.
std::string check_kind(const Case& c, const std::string& kind, int microbatches, int cores = 0) {
  const int l = replica_lcm(c.plan);
  const int minibatches = is_stash(kind) ? l * 2 : kind == "2bw" ? 3 : 2;
  try {
    ScheduleSpec spec =
        ScheduleSpec::from_plan(c.plan, is_stash(kind) ? 1 : microbatches, minibatches);
    if (kind == "2bw")  // at least every stage's warm-up x replicas (two_buffered.hpp)
      for (int s = 0; s < spec.num_stages(); ++s)
        spec.microbatches =
            std::max(spec.microbatches, detail::one_f_one_b_warmup(spec, s) *
                                            static_cast<int>(c.plan.stages[s].replicas));
    Schedule s = generate_schedule(kind, spec);
    validate(s);
    Simulation sim = simulate(s, c.profile, c.plan, c.topology);
    if (!(sim.makespan_s > 0)) return "no time";
    if (cores <= 0) return "";
    SimulateOptions shared;
    shared.cores = cores;
    const Simulation on_cores = simulate(s, c.profile, c.plan, c.topology, shared);
    double work = 0;
    for (const auto& r : sim.ranks) work += r.busy_s;
    if (on_cores.makespan_s < sim.makespan_s * (1 - 1e-9))
      return fmt::format("faster on {} shared cores ({} s) than alone ({} s)", cores,
                         on_cores.makespan_s, sim.makespan_s);
    if (on_cores.makespan_s * cores < work * (1 - 1e-9))
      return fmt::format("{} cores did {} s of work in {} s", cores, work, on_cores.makespan_s);
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace

TEST_CASE("every schedule kind validates and simulates on random replicated plans") {
  Rng rng(17, "replicated-plans");
  int checked = 0;
  const int cases = kSanitized ? 50 : 150;
  for (int t = 0; t < cases; ++t) {
    const Case c = random_case(rng);
    // Stash needs a multiple of every replica count: minibatches = 2 x their lcm.
    if (replica_lcm(c.plan) > (kSanitized ? 60 : 420)) continue;
    const std::vector<int> config = c.plan.replica_counts();
    const int microbatches = 1 + static_cast<int>(rng.below(12));
    // A third of the plans also run on fewer cores than ranks.
    const int cores =
        c.plan.workers > 1 && rng.below(3) == 0
            ? 1 + static_cast<int>(rng.below(static_cast<std::uint64_t>(c.plan.workers - 1)))
            : 0;
    for (const std::string& kind : kKinds) {
      CAPTURE(kind);
      CAPTURE(fmt::format("{}", fmt::join(config, "-")));
      CAPTURE(c.plan.in_flight);
      CAPTURE(cores);
      CHECK(check_kind(c, kind, microbatches, cores) == "");
      ++checked;
    }
  }
  MESSAGE(checked, " schedules checked");
  CHECK(checked > (kSanitized ? 130 : 400));
}

TEST_CASE("flush schedules follow any dealing of microbatches to replicas; the others refuse one") {
  Rng rng(23, "dealt-plans");
  int checked = 0;
  for (int t = 0; t < 120; ++t) {
    const Case c = random_case(rng);
    const int microbatches = 1 + static_cast<int>(rng.below(12));
    const int minibatches = 1 + static_cast<int>(rng.below(3));
    ScheduleSpec spec = ScheduleSpec::from_plan(c.plan, microbatches, minibatches);
    // Any replica for each microbatch, including none of a minibatch for some replicas; a
    // stage of one replica left round-robin or dealt all to replica 0.
    spec.dealing.resize(spec.stage_ranks.size());
    for (std::size_t st = 0; st < spec.stage_ranks.size(); ++st) {
      const auto r = spec.stage_ranks[st].size();
      if (r == 1 && rng.below(2) == 0) continue;
      for (int u = 0; u < microbatches * minibatches; ++u)
        spec.dealing[st].push_back(static_cast<std::int32_t>(rng.below(r)));
    }
    const std::vector<int> config = c.plan.replica_counts();
    CAPTURE(fmt::format("{}", fmt::join(config, "-")));
    CAPTURE(microbatches);
    for (const std::string kind : {"gpipe", "1f1b-flush", "zb-h1"}) {
      CAPTURE(kind);
      std::string error;
      try {
        const Schedule s = generate_schedule(kind, spec);
        validate(s);
        for (std::size_t st = 0; st < spec.dealing.size(); ++st)
          for (std::size_t u = 0; u < spec.dealing[st].size(); ++u)
            REQUIRE(s.replica_of(static_cast<int>(st), static_cast<int>(u)) == spec.dealing[st][u]);
        const Simulation sim = simulate(s, c.profile, c.plan, c.topology);
        if (!(sim.makespan_s > 0)) error = "no time";
      } catch (const std::exception& e) {
        error = e.what();
      }
      CHECK(error == "");
      ++checked;
    }
    const bool replicated = std::any_of(config.begin(), config.end(), [](int r) { return r > 1; });
    bool dealt = false;
    for (auto& d : spec.dealing) dealt = dealt || !d.empty();
    if (!replicated || !dealt) continue;
    for (const std::string kind : {"1f1b-stash", "2bw"}) {
      CAPTURE(kind);
      CHECK_THROWS_WITH_AS(generate_schedule(kind, spec), doctest::Contains("round-robin"),
                           ConfigError);
    }
  }
  CHECK(checked >= 300);
}

TEST_CASE(
    "1f1b-flush and zb-h1 on replicated plans: searched warm-ups, never slower than PipeDream's") {
  // On a balanced pipeline (a stage of r replicas takes r times a single stage's time per
  // microbatch) with free links, the warm-ups the generator searches against PipeDream's.
  const auto with = [](const std::string& kind, const ScheduleSpec& spec,
                       const std::vector<int>* warmups) {
    return kind == "zb-h1" ? detail::zero_bubble_h1_with(spec, warmups)
                           : detail::one_f_one_b_flush_with(spec, warmups);
  };
  for (const std::string kind : {"1f1b-flush", "zb-h1"}) {
    CAPTURE(kind);
    Rng rng(31, "flush-warmups");
    int checked = 0, faster = 0;
    for (int t = 0; t < 120; ++t) {
      Case c = random_case(rng);
      if (std::all_of(c.plan.stages.begin(), c.plan.stages.end(),
                      [](const PlanStage& st) { return st.replicas == 1; }))
        continue;
      for (std::size_t st = 0; st < c.plan.stages.size(); ++st) {
        c.profile.layers[st].forward_s = 1e-3 * c.plan.stages[st].replicas;
        c.profile.layers[st].backward_s = 2e-3 * c.plan.stages[st].replicas;
      }
      const int microbatches = 1 + static_cast<int>(rng.below(24));
      const ScheduleSpec spec = ScheduleSpec::from_plan(c.plan, microbatches, 2);
      const std::vector<int> config = c.plan.replica_counts();
      CAPTURE(fmt::format("{}", fmt::join(config, "-")));
      CAPTURE(microbatches);
      const Schedule searched = generate_schedule(kind, spec);
      CHECK(validation_error(searched) == "");
      const double found = simulate(searched, c.profile, c.plan, {}).makespan_s;
      const double pipedream =
          simulate(with(kind, spec, nullptr), c.profile, c.plan, {}).makespan_s;
      CHECK(found <= pipedream * (1 + 1e-9));
      faster += found < pipedream * (1 - 1e-9);
      ++checked;
    }
    MESSAGE(kind, ": ", checked, " replicated plans, ", faster,
            " faster with the searched warm-ups");
    CHECK(checked > 60);
    CHECK(faster > 0);
  }
  // 1-2-1 with 16 microbatches: the input stage feeds the two replicas in turn and PipeDream's
  // depth of 3 leaves the round trips through them exposed; one more forward in flight hides it.
  const Plan plan121 = testing::make_plan({{1, 1}, {2, 2}, {1, 1}});
  const Profile balanced = testing::uniform_profile(4);
  const ScheduleSpec spec = ScheduleSpec::from_plan(plan121, 16, 2);
  const double found =
      simulate(generate_schedule("1f1b-flush", spec), balanced, plan121, {}).makespan_s;
  const double pipedream =
      simulate(detail::one_f_one_b_flush_with(spec, nullptr), balanced, plan121, {}).makespan_s;
  CHECK(found < 0.85 * pipedream);
  CHECK(detail::replicated_flush_warmups(spec, false)[0] > detail::one_f_one_b_warmup(spec, 0));
}

TEST_CASE("PipeDream's uneven replica counts run, faster than without warm-up") {
  const std::string dir = testing::pipedream_profiles_dir();
  if (dir.empty()) {
    MESSAGE("shared/reference/pipedream-profiles not found; skipping");
    return;
  }
  struct Expect {
    const char* model;
    std::vector<TopologyLevel> levels;
    const char* config;
  };
  for (const Expect& e : {Expect{"alexnet", {{16, 1e9}}, "4-2-3-3-2-1-1"},
                          Expect{"vgg16", {{16, 1e9}}, "9-1-2-1-1-1-1"}}) {
    CAPTURE(std::string(e.model));
    const Profile profile = read_pipedream_graph(dir + "/" + e.model + "/graph.txt");
    const Topology topology{e.levels, {}};
    PartitionOptions o;
    o.cost_model = CostModel::PipeDream;
    o.ignore_transfer = true;
    const Plan plan = partition(profile, topology, o);
    CHECK(plan.config == e.config);
    const ScheduleSpec spec = ScheduleSpec::from_plan(plan, 1, replica_lcm(plan) * 8);
    const Schedule s = generate_schedule("1f1b-stash", spec);
    CHECK(validation_error(s) == "");
    // The depths found beat running without any warm-up (the fallback that always runs).
    const Topology fast{{{topology.workers(), 1e13}}, {}};
    const double found = simulate(s, profile, plan, fast).samples_per_s;
    const double none =
        simulate(detail::stash_schedule_with(spec, {std::vector<int>(plan.stages.size(), 0), {}}),
                 profile, plan, fast)
            .samples_per_s;
    MESSAGE(std::string(e.model), " ", std::string(e.config), ": ", found,
            " samples/s with the depths found, ", none, " without warm-up, ",
            plan.predicted.samples_per_s, " predicted");
    CHECK(found > 1.5 * none);
  }
}

TEST_CASE("every plan of PipeDream's profiles schedules, validates and simulates") {
  const std::string dir = testing::pipedream_profiles_dir();
  if (dir.empty()) {
    MESSAGE("shared/reference/pipedream-profiles not found; skipping");
    return;
  }
  int plans = 0, schedules = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const auto graph = entry.path() / "graph.txt";
    if (!std::filesystem::exists(graph)) continue;
    const std::string model = entry.path().filename().string();
    // The NASNets and Inception-v3 are planned over coarsened states (seconds each): one topology.
    const bool heavy = model.rfind("nasnet", 0) == 0 || model == "inception_v3";
    if (heavy && kSanitized) continue;
    const Profile profile = read_pipedream_graph(graph.string());
    std::vector<std::vector<TopologyLevel>> topologies = {{{16, 1e9}}};
    if (!heavy && !kSanitized)
      for (auto t : std::vector<std::vector<TopologyLevel>>{
               {{4, 1e10}}, {{8, 1.25e9}}, {{32, 1e9}}, {{4, 1e10}, {4, 1.25e9}}})
        topologies.push_back(t);
    for (const auto& levels : topologies)
      for (CostModel model_kind : {CostModel::PipeDream, CostModel::Pipeline}) {
        const Topology topology{levels, {}};
        PartitionOptions o;
        o.cost_model = model_kind;
        const Plan plan = partition(profile, topology, o);
        ++plans;
        for (const std::string& kind :
             {std::string("1f1b-stash"), std::string("1f1b-flush"), std::string("gpipe")}) {
          CAPTURE(model);
          CAPTURE(plan.config);
          CAPTURE(kind);
          const int minibatches = is_stash(kind) ? replica_lcm(plan) * 4 : 1;
          const Schedule s = generate_schedule(
              kind, ScheduleSpec::from_plan(plan, is_stash(kind) ? 1 : 2 * plan.num_stages(),
                                            minibatches));
          CHECK(validation_error(s) == "");
          CHECK(simulate(s, profile, plan, topology).makespan_s > 0);
          ++schedules;
        }
      }
  }
  MESSAGE(plans, " plans, ", schedules, " schedules");
  CHECK(plans >= (kSanitized ? 20 : 40));
}

TEST_CASE("1f1b-stash on balanced replicated plans runs at the planner's period") {
  // A balanced plan (every stage 3 ms per minibatch over its replicas, free links) has the
  // planner's period of 3 ms per minibatch. Round-robin dealing staggers a stage's replicas by
  // one period, so replicas that wait for each allreduce right after their backward idle until
  // the last one's (a 1-2-3 plan: 4 ms); replicas that wait after their next backward, with the
  // depths of stash_in_flights, do not. Simulated with the runtime's overlapped allreduce.
  SimulateOptions overlapped;
  overlapped.overlap_allreduce = true;
  for (const auto& stages :
       std::vector<std::vector<std::pair<int, int>>>{{{1, 1}, {2, 2}, {1, 1}},
                                                     {{1, 1}, {2, 2}, {2, 2}, {1, 1}},
                                                     {{2, 2}, {1, 1}},
                                                     {{1, 1}, {2, 2}},
                                                     {{1, 1}, {3, 3}, {2, 2}},
                                                     {{1, 1}, {2, 2}, {3, 3}},
                                                     {{2, 2}, {3, 3}, {1, 1}},
                                                     // A rank hearing from 12 replicas (its
                                                     // inbox indexed, not scanned), and 12
                                                     // hearing from one.
                                                     {{12, 12}, {1, 1}},
                                                     {{1, 1}, {12, 12}}}) {
    Plan plan = testing::make_plan(stages);
    int layers = 0;
    std::vector<int> config;
    for (auto [n, r] : stages) {
      layers += n;
      config.push_back(r);
    }
    const std::vector<int> flights = stash_in_flights(plan.workers, config);
    plan.in_flight = flights.front();
    CAPTURE(fmt::format("{}", fmt::join(config, "-")));
    const Profile balanced = testing::uniform_profile(layers);
    const ScheduleSpec spec = ScheduleSpec::from_plan(plan, 1, replica_lcm(plan) * 24);
    const Schedule s = generate_schedule("1f1b-stash", spec);
    CHECK(validation_error(s) == "");
    const Simulation sim = simulate(s, balanced, plan, {}, overlapped);
    detail::StashShape shape = detail::replicated_stash_shape(spec);
    const std::vector<int> delaying = shape.delaying;
    shape.delaying.assign(shape.delaying.size(), 0);
    const double undelayed =
        simulate(detail::stash_schedule_with(spec, shape), balanced, plan, {}, overlapped)
            .time_per_minibatch_s;
    MESSAGE(fmt::format("{}: {:.3f} ms per minibatch (delaying {}), {:.3f} without delays",
                        fmt::join(config, "-"), sim.time_per_minibatch_s * 1e3,
                        fmt::join(delaying, ","), undelayed * 1e3));
    CHECK(sim.time_per_minibatch_s < 3e-3 * 1.01);
    // Every replica holds at most the minibatches its stage's in-flight count allows.
    for (const RankSimulation& r : sim.ranks)
      CHECK(r.peak_activations <= flights[static_cast<std::size_t>(r.stage)]);
  }
  // Without the delays the 1-2-3 plan is a third slower.
  const Plan plan123 = testing::make_plan({{1, 1}, {2, 2}, {3, 3}});
  const ScheduleSpec spec = ScheduleSpec::from_plan(plan123, 1, 6 * 24);
  detail::StashShape shape = detail::replicated_stash_shape(spec);
  CHECK(shape.delaying[1] + shape.delaying[2] > 0);
  shape.delaying.assign(3, 0);
  CHECK(simulate(detail::stash_schedule_with(spec, shape), testing::uniform_profile(6), plan123, {},
                 overlapped)
            .time_per_minibatch_s > 1.2 * 3e-3);
  // A plan that takes no delays gets none.
  ScheduleSpec no_delay = spec;
  no_delay.stage_may_delay = {1, 0, 0};
  const detail::StashShape kept = detail::replicated_stash_shape(no_delay);
  CHECK(kept.delaying == std::vector<int>{0, 0, 0});
}

TEST_CASE("1f1b-stash on random balanced replicated plans: near the planner's period") {
  Rng rng(41, "balanced-replicated");
  SimulateOptions overlapped;
  overlapped.overlap_allreduce = true;
  double sum = 0;
  int plans = 0, at_rate = 0;
  while (plans < 40) {
    const int workers = 2 + static_cast<int>(rng.below(11));
    std::vector<std::pair<int, int>> stages;
    std::vector<int> config;
    for (int left = workers; left > 0;) {
      const int r = 1 + static_cast<int>(rng.below(static_cast<std::uint64_t>(std::min(left, 4))));
      stages.push_back({r, r});
      config.push_back(r);
      left -= r;
    }
    if (stages.size() < 2 ||
        std::all_of(config.begin(), config.end(), [](int r) { return r == 1; }))
      continue;
    Plan plan = testing::make_plan(stages);
    if (replica_lcm(plan) > 12) continue;
    plan.in_flight = stash_in_flights(plan.workers, config).front();
    const ScheduleSpec spec = ScheduleSpec::from_plan(
        plan, 1, replica_lcm(plan) * ((8 * workers + 11) / replica_lcm(plan)));
    const double ratio =
        simulate(generate_schedule("1f1b-stash", spec),
                 testing::uniform_profile(plan.stages.back().end), plan, {}, overlapped)
            .time_per_minibatch_s /
        3e-3;
    CAPTURE(fmt::format("{}", fmt::join(config, "-")));
    CHECK(ratio < 1.35);
    sum += ratio;
    at_rate += ratio < 1.02;
    ++plans;
  }
  MESSAGE(plans, " plans: mean period ", sum / plans, " of the planner's, ", at_rate,
          " at its rate");
  CHECK(sum / plans < 1.03);
  CHECK(at_rate >= 26);
}

TEST_CASE("a replica's round-robin microbatches are every r-th from any first one") {
  ScheduleSpec spec;
  spec.stage_ranks = {{0, 1, 2, 3, 4, 5, 6}};
  for (int first = 0; first < 20; ++first)
    for (int count : {0, 1, 6, 7, 8, 30})
      for (int replica = 0; replica < 7; ++replica) {
        std::vector<int> want;
        for (int u = first; u < first + count; ++u)
          if (u % 7 == replica) want.push_back(u);
        CHECK(detail::replica_microbatches(spec, 0, replica, first, count) == want);
      }
}

TEST_CASE("a stash run's steady state: whole rounds of every stage, none past the limit") {
  // PipeDream's 4-2-3-3-2-1-1: rounds of 12, at least 8 minibatches per worker (128).
  CHECK(steady_state_minibatches({4, 2, 3, 3, 2, 1, 1}, kMaxSimulatedMinibatches) == 132);
  CHECK(steady_state_minibatches({1, 1}, kMaxSimulatedMinibatches) == 16);
  // The partitioner's plan for 4096 workers of the mlp: rounds of 79,546,350 minibatches.
  CHECK(steady_state_minibatches({2938, 1083, 75}, kMaxSimulatedMinibatches) == 0);
  CHECK(steady_state_minibatches({2938, 1083, 75}, 100'000'000) == 79'546'350);
  CHECK(steady_state_minibatches({2147483647, 2147483646, 2147483645}, kMaxSimulatedMinibatches) ==
        0);  // no overflow on the way
}

TEST_CASE("a replicated plan's steady state: 8 times the minibatches its replicas hold") {
  // Stages of `replicas` on consecutive ranks, each replica holding `in_flight` minibatches.
  auto plan_of = [](std::vector<std::pair<int, int>> stages) {
    Plan plan;
    for (const auto& stage : stages) {
      PlanStage s;
      s.replicas = stage.first;
      s.in_flight = stage.second;
      for (int r = 0; r < s.replicas; ++r) s.ranks.push_back(plan.workers++);
      plan.stages.push_back(s);
    }
    return plan;
  };
  const Plan replicated = plan_of({{3, 4}, {1, 1}});
  // 3 x 4 + 1 held: 104, rounded up to whole rounds of 3.
  CHECK(steady_state_minibatches(replicated, kMaxSimulatedMinibatches) == 105);
  // Past the limit: 8 per worker in whole rounds, as for the replica counts alone.
  CHECK(steady_state_minibatches(replicated, 100) == 33);
  // Without replicas 8 per worker (their pattern repeats every minibatch), or 8 times the
  // deepest stage's count where slow links made it more than the workers: its warm-up must end
  // before the window that times the period opens.
  CHECK(steady_state_minibatches(plan_of({{1, 2}, {1, 1}}), kMaxSimulatedMinibatches) == 16);
  CHECK(steady_state_minibatches(plan_of({{1, 7}, {1, 1}}), kMaxSimulatedMinibatches) == 56);
  CHECK(steady_state_minibatches(plan_of({{1, 7}, {1, 1}}), 50) == 16);
}

}  // namespace test_replicated_schedules
