// Interleaved plans (v > 1 virtual stages per rank): plan.json's "pipeline.plan/2" round trip
// and the old format still read; ScheduleSpec::from_plan gives interleaved-1f1b's spec; the
// partitioner's v·p-stage plan on random profiles is valid, covers the layers, equals exhaustive
// enumeration of the cuts, and schedules, validates and simulates; bad requests are ConfigErrors.
#include <pipeline/core/error.hpp>
#include <pipeline/plan/partition.hpp>
#include <pipeline/plan/plan_json.hpp>
#include <pipeline/plan/zb_v_order.hpp>
#include <pipeline/schedule/generator.hpp>
#include <pipeline/schedule/simulator.hpp>
#include <pipeline/schedule/validate.hpp>

#include "support/chain_cuts.hpp"
#include "support/memory_limit_plans.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>

namespace test_interleaved_plan {

using namespace pipeline;

namespace {

// The time per microbatch of `plan`'s own schedule over one minibatch of its microbatches, as
// pipeline-partition simulates it (replicas' allreduces overlapping their closing backwards).
double simulated_per_microbatch(const Plan& plan, const Profile& p, const Topology& t) {
  SimulateOptions options;
  options.overlap_allreduce = true;
  const Simulation sim =
      simulate(generate_schedule(plan.schedule, ScheduleSpec::from_plan(plan, plan.microbatches)),
               p, plan, t, options);
  return sim.time_per_minibatch_s / plan.microbatches;
}

const char* kOldPlan = R"({"format": "pipeline.plan/1", "model": "mlp", "workers": 2,
  "schedule": "1f1b-stash", "in_flight": 2, "config": "1-1",
  "stages": [{"layers": [0, 3], "replicas": 1, "ranks": [0]},
             {"layers": [3, 6], "replicas": 1, "ranks": [1]}]})";

const char* kInterleavedPlan = R"({"format": "pipeline.plan/2", "model": "mlp", "workers": 2,
  "virtual_stages": 2, "schedule": "interleaved-1f1b", "in_flight": 1, "config": "1-1-1-1",
  "stages": [{"layers": [0, 2], "replicas": 1, "ranks": [0]},
             {"layers": [2, 3], "replicas": 1, "ranks": [1]},
             {"layers": [3, 5], "replicas": 1, "ranks": [0]},
             {"layers": [5, 6], "replicas": 1, "ranks": [1]}],
  "predicted": {"time_per_minibatch_s": 0.02, "peak_memory_bytes": [100, 200]}})";

// The message of the ConfigError that parsing `edit`ed `text` throws; empty when it parses.
std::string error_of(const char* text, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(text);
  edit(j);
  try {
    parse_plan(j.dump(), "plan.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

Profile random_chain(std::mt19937& rng, int layers) {
  Profile p;
  p.model = "random";
  p.batch_size = 16;
  std::uniform_real_distribution<double> time(0.0005, 0.01);
  std::uniform_int_distribution<int> bytes(1, 64);
  for (int i = 0; i < layers; ++i) {
    LayerProfile l;
    l.name = fmt::format("l{}", i);
    l.kind = "Linear";
    l.forward_s = time(rng);
    l.backward_s = 2 * time(rng);
    l.output_bytes = std::int64_t{bytes(rng)} * 100000;
    l.parameter_bytes = std::int64_t{bytes(rng)} * 4096;
    p.layers.push_back(l);
  }
  return p;
}

// Independent statement of the objective: every way of cutting the chain into `stages`
// non-empty ranges, stage k on rank k mod p (or in a V: stage k >= p on rank 2p - 1 - k); a stage
// costs max(compute, transfer in, transfer out) with transfers 2a/B at the bandwidth of the level
// joining the two ranks, none between stages on one rank.
double brute_force(const Profile& p, const Topology& t, int stages, bool transfer,
                   bool v_shape = false) {
  const int w = t.workers();
  auto rank_of = [&](int k) { return v_shape && k >= w ? 2 * w - 1 - k : k % w; };
  auto level_bandwidth = [&](int a, int b) {
    int size = 1;
    for (std::size_t l = 0; l < t.levels.size(); ++l) {
      size *= t.levels[l].count;
      if (a / size == b / size) return t.levels[l].bandwidth_bytes_per_s;
    }
    return t.levels.back().bandwidth_bytes_per_s;
  };
  auto cut = [&](int k, int layer_end) {  // the cut after stage k, before layer layer_end
    if (!transfer || rank_of(k) == rank_of(k + 1)) return 0.0;
    return 2.0 *
           static_cast<double>(p.layers[static_cast<std::size_t>(layer_end) - 1].output_bytes) /
           level_bandwidth(rank_of(k), rank_of(k + 1));
  };
  return testing::least_slowest_stage(p, stages, [&](int k, int begin, int end) {
    double c = 0;
    if (k > 0) c = std::max(c, cut(k - 1, begin));
    if (k + 1 < stages) c = std::max(c, cut(k, end));
    return c;
  });
}

}  // namespace

TEST_CASE("plan.json: an interleaved plan round-trips as pipeline.plan/2, old plans still load") {
  const Plan old = parse_plan(kOldPlan, "old.json");
  CHECK(old.virtual_stages == 1);
  CHECK_FALSE(old.interleaved());
  // A plain plan is still written as version 1, without the new field.
  const nlohmann::json old_out = plan_to_json(old);
  CHECK(old_out.at("format") == "pipeline.plan/1");
  CHECK_FALSE(old_out.contains("virtual_stages"));

  const Plan p = parse_plan(kInterleavedPlan, "plan.json");
  CHECK(p.virtual_stages == 2);
  CHECK(p.interleaved());
  REQUIRE(p.num_stages() == 4);
  CHECK(p.stages[2].begin == 3);
  CHECK(p.stages[2].ranks == std::vector<int>{0});
  const nlohmann::json out = plan_to_json(p);
  CHECK(out.at("format") == "pipeline.plan/2");
  CHECK(out.at("virtual_stages") == 2);
  const Plan q = parse_plan(out.dump(), "again");
  CHECK(q.virtual_stages == 2);
  REQUIRE(q.num_stages() == 4);
  for (int k = 0; k < 4; ++k) {
    CHECK(q.stages[k].begin == p.stages[k].begin);
    CHECK(q.stages[k].end == p.stages[k].end);
    CHECK(q.stages[k].ranks == p.stages[k].ranks);
  }
  CHECK(q.predicted.peak_memory_bytes == p.predicted.peak_memory_bytes);
  CHECK(q.schedule == "interleaved-1f1b");
}

TEST_CASE("plan.json: what an interleaved plan must say, and what a version-1 plan must not") {
  CHECK(error_of(kInterleavedPlan, [](auto&) {}).empty());
  // Version 1 keeps one stage per rank: the field needs version 2.
  CHECK_MESSAGE(
      error_of(kOldPlan, [](auto& j) { j["virtual_stages"] = 2; }).find("pipeline.plan/2") !=
          std::string::npos,
      "version 1 with virtual stages");
  CHECK(error_of(kOldPlan, [](auto& j) { j["virtual_stages"] = 1; }).empty());
  CHECK(error_of(kInterleavedPlan, [](auto& j) {
          j["format"] = "pipeline.plan/1";
        }).find("pipeline.plan/2") != std::string::npos);
  CHECK(error_of(kInterleavedPlan, [](auto& j) {
          j.erase("virtual_stages");
        }).find("virtual_stages") != std::string::npos);
  CHECK(error_of(kInterleavedPlan, [](auto& j) {
          j["virtual_stages"] = 1;
        }).find("virtual_stages") != std::string::npos);
  CHECK(error_of(kInterleavedPlan, [](auto& j) {
          j["virtual_stages"] = 1.5;
        }).find("virtual_stages") != std::string::npos);
  // Stage k on the ranks of stage k mod p, every stage with the same replicas, and exactly v·p
  // stages per pipeline.
  CHECK(error_of(kInterleavedPlan, [](auto& j) {
          j["stages"][2]["ranks"] = {1};
        }).find("stage k on the ranks of stage k mod 2") != std::string::npos);
  CHECK(!error_of(kInterleavedPlan, [](auto& j) {
           j["stages"][1]["replicas"] = 2;
           j["stages"][1]["ranks"] = {1, 0};
         }).empty());
  // Two pipelines of 2 ranks (ranks 0, 1 and 2, 3): every stage replicated on both.
  const auto two_pipelines = [](auto& j) {
    j["workers"] = 4;
    for (int k = 0; k < 4; ++k) {
      j["stages"][k]["replicas"] = 2;
      j["stages"][k]["ranks"] = {k % 2, 2 + k % 2};
    }
  };
  CHECK(error_of(kInterleavedPlan, two_pipelines).empty());
  CHECK(error_of(kInterleavedPlan, [&](auto& j) {
          two_pipelines(j);
          j["stages"][3]["ranks"] = {1, 2};
        }).find("stage 3 runs on ranks [1, 2]") != std::string::npos);
  CHECK(error_of(kInterleavedPlan, [&](auto& j) {
          two_pipelines(j);
          j["stages"][1]["ranks"] = {1, 2};
          j["stages"][3]["ranks"] = {1, 2};
        }).find("must be a multiple of the replicas") != std::string::npos);
  CHECK(error_of(kInterleavedPlan, [](auto& j) {
          j["virtual_stages"] = 3;
        }).find("needs 6 stages") != std::string::npos);
  // A larger group of microbatches (interleaved 1F1B's, a multiple of the ranks of a pipeline)
  // round-trips; others are refused, as is a group in a plan of one stage per rank.
  CHECK(error_of(kInterleavedPlan, [](auto& j) { j["microbatch_group"] = 4; }).empty());
  {
    nlohmann::json j = nlohmann::json::parse(kInterleavedPlan);
    j["microbatch_group"] = 4;
    const Plan grouped = parse_plan(j.dump(), "grouped");
    CHECK(grouped.microbatch_group == 4);
    CHECK(parse_plan(plan_to_json(grouped).dump(), "again").microbatch_group == 4);
    CHECK(ScheduleSpec::from_plan(grouped, 8).microbatch_group == 4);
    CHECK_FALSE(plan_to_json(parse_plan(kInterleavedPlan, "plain")).contains("microbatch_group"));
  }
  CHECK(error_of(kInterleavedPlan, [](auto& j) {
          j["microbatch_group"] = 3;
        }).find("groups of a multiple of the 2 ranks") != std::string::npos);
  CHECK(error_of(kInterleavedPlan, [](auto& j) { j["microbatch_group"] = 0; }).find("at least 1") !=
        std::string::npos);
  CHECK(error_of(kOldPlan, [](auto& j) {
          j["microbatch_group"] = 2;
        }).find("for interleaved plans") != std::string::npos);
  CHECK(!error_of(kInterleavedPlan, [](auto& j) { j["stages"][2]["layers"] = {4, 5}; }).empty());
  CHECK(!error_of(kInterleavedPlan, [](auto& j) { j["stages"][2]["layer_ids"] = {3, 4}; }).empty());
}

TEST_CASE("ScheduleSpec::from_plan: an interleaved plan gives interleaved-1f1b's spec") {
  const Plan p = parse_plan(kInterleavedPlan, "plan.json");
  const ScheduleSpec spec = ScheduleSpec::from_plan(p, 4, 2);
  const ScheduleSpec expect = ScheduleSpec::interleaved(2, 2, 4, 2);
  CHECK(spec.stage_ranks == expect.stage_ranks);
  CHECK(spec.microbatches == 4);
  CHECK(spec.minibatches == 2);
  const Schedule s = generate_schedule(p.schedule, spec);
  CHECK(s.num_ranks() == 2);
  CHECK(s.num_stages() == 4);
  validate(s);
  // Plans written by hand may leave ranks out: stage k then runs on rank k mod p.
  Plan bare = p;
  for (auto& st : bare.stages) st.ranks.clear();
  CHECK(ScheduleSpec::from_plan(bare, 4).stage_ranks == expect.stage_ranks);
  // A schedule for one stage per rank refuses the layout.
  CHECK_THROWS_AS(generate_schedule("1f1b-flush", spec), ConfigError);
}

TEST_CASE(
    "partition --virtual-stages: random chains, the optimum of every cut, and a plan that runs") {
  std::mt19937 rng(20261124);
  int checked = 0;
  for (int iter = 0; iter < 300; ++iter) {
    CAPTURE(iter);
    const int w = std::uniform_int_distribution<int>(2, 3)(rng);
    const int v = std::uniform_int_distribution<int>(2, 3)(rng);
    const int n = std::uniform_int_distribution<int>(v * w, std::min(11, v * w + 4))(rng);
    const Profile p = random_chain(rng, n);
    Topology t;
    if (iter % 3 == 2 && w == 2)
      t.levels = {{1, 1e9}, {2, 2e8}};
    else
      t.levels = {{w, std::uniform_real_distribution<double>(1e8, 1e10)(rng)}};
    PartitionOptions o;
    o.virtual_stages = v;
    o.ignore_transfer = iter % 4 == 3;
    const Plan plan = partition(p, t, o);
    CHECK(plan.virtual_stages == v);
    CHECK(plan.interleaved());
    CHECK(plan.schedule == "interleaved-1f1b");
    CHECK(plan.workers == w);
    REQUIRE(plan.num_stages() == v * w);
    // Contiguous, non-empty, covering every layer once; stage k on rank k mod p.
    int next = 0;
    double slowest = 0;
    std::vector<double> rank_compute(static_cast<std::size_t>(w), 0.0);
    for (int k = 0; k < plan.num_stages(); ++k) {
      const PlanStage& s = plan.stages[k];
      CHECK(s.begin == next);
      CHECK(s.end > s.begin);
      CHECK(s.layer_ids.empty());
      CHECK(s.replicas == 1);
      CHECK(s.ranks == std::vector<int>{k % w});
      next = s.end;
      slowest = std::max(slowest, std::max(s.compute_s, s.transfer_s));
      rank_compute[static_cast<std::size_t>(k % w)] += s.compute_s;
    }
    CHECK(next == n);
    // The dynamic program's cut has the least slowest stage; the plan starts from it and moves
    // cut points while that shortens its schedule.
    CHECK(slowest >= brute_force(p, t, v * w, !o.ignore_transfer) * (1 - 1e-12));
    // Its figure is its schedule's, and no cut point moved by a layer shortens it.
    CHECK(plan.predicted.time_per_minibatch_s ==
          doctest::Approx(simulated_per_microbatch(plan, p, o.ignore_transfer ? Topology{} : t))
              .epsilon(1e-9));
    for (int k = 1; k < plan.num_stages(); ++k)
      for (int step : {-1, 1}) {
        std::vector<ManualStage> moved;
        for (const PlanStage& s : plan.stages) moved.push_back({s.begin, s.end, 1});
        moved[static_cast<std::size_t>(k) - 1].end += step;
        moved[static_cast<std::size_t>(k)].begin += step;
        if (moved[static_cast<std::size_t>(k) - 1].end <=
                moved[static_cast<std::size_t>(k) - 1].begin ||
            moved[static_cast<std::size_t>(k)].end <= moved[static_cast<std::size_t>(k)].begin)
          continue;
        CAPTURE(k);
        CAPTURE(step);
        CHECK(evaluate_stages(p, t, moved, o).predicted.time_per_minibatch_s >=
              plan.predicted.time_per_minibatch_s * (1 - 1e-9));
      }
    // The headline is the slowest rank's sum over its stages.
    CHECK(plan.predicted.time_per_minibatch_s >=
          *std::max_element(rank_compute.begin(), rank_compute.end()) - 1e-15);
    CHECK(plan.predicted.peak_memory_bytes.size() == static_cast<std::size_t>(w));
    // plan.json keeps it, and it schedules, validates and simulates.
    const Plan again = parse_plan(plan_to_json(plan).dump(), "partitioned");
    CHECK(again.virtual_stages == v);
    const Schedule sched =
        generate_schedule(again.schedule, ScheduleSpec::from_plan(again, 2 * w, 2));
    validate(sched);
    const Simulation sim = simulate(sched, p, again, t);
    CHECK(sim.makespan_s > 0);
    // Every microbatch passes through every stage: 2 minibatches of 2p microbatches, the ideal
    // time per minibatch is the slowest rank's compute.
    CHECK(sim.time_per_minibatch_s >=
          2 * w * *std::max_element(rank_compute.begin(), rank_compute.end()) * (1 - 1e-12));
    ++checked;
  }
  CHECK(checked == 300);
}

TEST_CASE(
    "partition --virtual-stages: data-parallel pipelines where one is slower, on random chains") {
  // Eight layers, the first 10 ms and the others 1 ms, on 4 workers with 2 stages each: one
  // pipeline of 4 ranks must give the 10 ms layer a stage of its own (rank 0: 10 + 1 ms), two
  // pipelines of 2 halve it (each rank about 6 ms), with an allreduce of a few bytes.
  Profile p;
  p.model = "skewed";
  p.batch_size = 8;
  for (int i = 0; i < 8; ++i) {
    const double ms = i == 0 ? 0.010 : 0.001;
    p.layers.push_back(
        {fmt::format("l{}", i), "X", ms / 3, 2 * ms / 3, 0, 0, 0, 0, 100, 1000, 0, {}, false});
  }
  const Topology t{{{4, 1e10}}, {}};
  PartitionOptions o;
  o.virtual_stages = 2;
  const Plan plan = partition(p, t, o);
  REQUIRE(plan.num_stages() == 4);
  CHECK(plan.config == "2-2-2-2");
  for (int k = 0; k < 4; ++k) CHECK(plan.stages[k].ranks == std::vector<int>{k % 2, 2 + k % 2});
  PartitionOptions straight = o;
  straight.straight = true;
  const Plan one = partition(p, t, straight);
  REQUIRE(one.num_stages() == 8);
  // 16 microbatches (4 per worker) at rank 0's 11 ms, the 1 ms of its other stage filling the
  // fill and drain, as its schedule runs them.
  CHECK(one.microbatches == 16);
  CHECK(one.predicted.time_per_minibatch_s == doctest::Approx(0.011));
  CHECK(one.predicted.time_per_minibatch_s == doctest::Approx(simulated_per_microbatch(one, p, t)));
  CHECK(plan.predicted.time_per_minibatch_s < 0.6 * one.predicted.time_per_minibatch_s);
  // The same cut by hand, and the plan through plan.json, a schedule and the simulator.
  const Plan manual = evaluate_stages(p, t, parse_manual_stages("0:1x2,1:4x2,4:6x2,6:8x2"), o);
  CHECK(manual.stages[2].ranks == std::vector<int>{0, 2});
  CHECK(manual.predicted.time_per_minibatch_s ==
        doctest::Approx(plan.predicted.time_per_minibatch_s).epsilon(0.2));
  const Plan again = parse_plan(plan_to_json(plan).dump(), "partitioned");
  const Schedule sched = generate_schedule(again.schedule, ScheduleSpec::from_plan(again, 8, 2));
  validate(sched);
  CHECK(simulate(sched, p, again, t).time_per_minibatch_s > 0);

  // Random chains on 4 and 6 workers: every degree's plan is an interleaved layout that
  // schedules, validates and simulates, and never predicted slower than the single pipeline.
  std::mt19937 rng(20261206);
  int replicated = 0;
  for (int iter = 0; iter < 60; ++iter) {
    CAPTURE(iter);
    const int w = iter % 2 == 0 ? 4 : 6;
    const int v = std::uniform_int_distribution<int>(2, 3)(rng);
    const int n = std::uniform_int_distribution<int>(2 * v, v * w + 4)(rng);
    const Profile q = random_chain(rng, n);
    Topology topo;
    topo.levels = iter % 3 == 0 ? std::vector<TopologyLevel>{{2, 1e10}, {w / 2, 1e9}}
                                : std::vector<TopologyLevel>{{w, 1e10}};
    PartitionOptions opt;
    opt.virtual_stages = v;
    const Plan best = partition(q, topo, opt);
    const int r = best.stages.front().replicas, places = w / r;
    replicated += r > 1;
    REQUIRE(best.num_stages() == v * places);
    for (int k = 0; k < best.num_stages(); ++k) {
      std::vector<int> ranks;
      for (int j = 0; j < r; ++j) ranks.push_back(j * places + k % places);
      CHECK(best.stages[k].ranks == ranks);
    }
    CHECK(best.predicted.peak_memory_bytes.size() == static_cast<std::size_t>(w));
    if (v * w <= n) {
      PartitionOptions single = opt;
      single.straight = true;
      CHECK(best.predicted.time_per_minibatch_s <=
            partition(q, topo, single).predicted.time_per_minibatch_s * (1 + 1e-12));
    }
    const Plan read = parse_plan(plan_to_json(best).dump(), "random");
    const Schedule s = generate_schedule(read.schedule, ScheduleSpec::from_plan(read, 2 * w, 2));
    validate(s);
    CHECK(simulate(s, q, read, topo).makespan_s > 0);
  }
  CHECK(replicated > 0);
}

TEST_CASE(
    "partition --virtual-stages: a minibatch's time, fill and drain included, is what it runs") {
  // Random chains on links fast enough that compute paces them, looped and V plans, one or more
  // pipelines, random microbatch counts: the schedule the plan names, simulated as the CLI does,
  // within 25% of the plan's time per minibatch and 5% in the median (the steady state alone,
  // which the plan said before, was 12% fast in the median and up to 60% fast).
  std::mt19937 rng(20261206);
  for (const StagePlacement placement : {StagePlacement::Looped, StagePlacement::V}) {
    CAPTURE(to_string(placement));
    std::vector<double> ratios;
    for (int iter = 0; iter < 80; ++iter) {
      CAPTURE(iter);
      const int w = std::uniform_int_distribution<int>(2, 4)(rng);
      const int v =
          placement == StagePlacement::V ? 2 : std::uniform_int_distribution<int>(2, 3)(rng);
      const Profile p =
          random_chain(rng, std::uniform_int_distribution<int>(v * w, v * w + 6)(rng));
      Topology t;
      t.levels = {{w, std::uniform_real_distribution<double>(1e10, 1e11)(rng)}};
      PartitionOptions o;
      o.virtual_stages = v;
      o.placement = placement;
      o.straight = iter % 2 == 0;
      o.microbatches = w * std::uniform_int_distribution<int>(1, 4)(rng);
      const Plan plan = parse_plan(plan_to_json(partition(p, t, o)).dump(), "random");
      REQUIRE(plan.microbatches == o.microbatches);
      SimulateOptions so;
      so.overlap_allreduce = true;
      const Simulation sim = simulate(
          generate_schedule(plan.schedule, ScheduleSpec::from_plan(plan, plan.microbatches, 1)), p,
          plan, t, so);
      const double ratio = sim.samples_per_s / plan.predicted.samples_per_s;
      CHECK(ratio >= 0.75);
      CHECK(ratio <= 1.25);
      ratios.push_back(ratio);
    }
    std::sort(ratios.begin(), ratios.end());
    const double median = ratios[ratios.size() / 2];
    CHECK(median >= 0.95);
    CHECK(median <= 1.05);
  }
}

TEST_CASE("V placement: plan.json, the partitioner's optimum on random chains, zb-v runs it") {
  // plan.json: stage k >= p on the ranks of stage 2p - 1 - k reads as a V, whose schedule is zb-v.
  nlohmann::json j = nlohmann::json::parse(kInterleavedPlan);
  j["schedule"] = "zb-v";
  j["stages"][2]["ranks"] = {1};
  j["stages"][3]["ranks"] = {0};
  const Plan v = parse_plan(j.dump(), "v.json");
  CHECK(placement_of(v) == StagePlacement::V);
  CHECK(interleaved_schedule_for(v) == "zb-v");
  CHECK(placement_of(parse_plan(kInterleavedPlan, "looped.json")) == StagePlacement::Looped);
  CHECK(ScheduleSpec::from_plan(v, 4).stage_ranks == ScheduleSpec::v_shape(2, 4).stage_ranks);
  CHECK(parse_plan(plan_to_json(v).dump(), "again.json").stages[3].ranks == std::vector<int>{0});
  // Neither looped nor a V.
  CHECK(error_of(kInterleavedPlan, [](nlohmann::json& p) {
          p["stages"][3]["ranks"] = {0};
        }).find("(a V)") != std::string::npos);

  std::mt19937 rng(20261207);
  int replicated = 0;
  for (int iter = 0; iter < 120; ++iter) {
    CAPTURE(iter);
    const int w = std::uniform_int_distribution<int>(2, 4)(rng);
    const int n = std::uniform_int_distribution<int>(2 * w, 2 * w + 5)(rng);
    const Profile p = random_chain(rng, n);
    Topology t;
    t.levels = iter % 3 == 2 && w % 2 == 0
                   ? std::vector<TopologyLevel>{{2, 1e9}, {w / 2, 2e8}}
                   : std::vector<TopologyLevel>{
                         {w, std::uniform_real_distribution<double>(1e8, 1e10)(rng)}};
    PartitionOptions o;
    o.virtual_stages = 2;
    o.placement = StagePlacement::V;
    o.ignore_transfer = iter % 4 == 3;
    o.straight = iter % 2 == 0;
    const Plan plan = partition(p, t, o);
    CHECK(plan.schedule == "zb-v");
    CHECK(placement_of(plan) == StagePlacement::V);
    const int r = plan.stages.front().replicas, places = w / r;
    replicated += r > 1;
    REQUIRE(plan.num_stages() == 2 * places);
    for (int k = 0; k < plan.num_stages(); ++k) {
      std::vector<int> ranks;
      for (int i = 0; i < r; ++i)
        ranks.push_back(i * places + (k < places ? k : 2 * places - 1 - k));
      CHECK(plan.stages[k].ranks == ranks);
    }
    // The dynamic program's cut has the least slowest stage; the plan starts from it and moves
    // cut points while that shortens its schedule, whose walk is its figure.
    if (o.straight) {
      double slowest = 0;
      for (const PlanStage& s : plan.stages)
        slowest = std::max(slowest, std::max(s.compute_s, s.transfer_s));
      CHECK(slowest >=
            brute_force(p, t, 2 * w, !o.ignore_transfer, /*v_shape=*/true) * (1 - 1e-12));
    }
    // (Without transfers the allreduces of replicated stages still take their time, which a
    // free topology would not.)
    if (!o.ignore_transfer || r == 1)
      CHECK(plan.predicted.time_per_minibatch_s ==
            doctest::Approx(simulated_per_microbatch(plan, p, o.ignore_transfer ? Topology{} : t))
                .epsilon(1e-9));
    const Plan read = parse_plan(plan_to_json(plan).dump(), "random");
    const Schedule s = generate_schedule(read.schedule, ScheduleSpec::from_plan(read, 2 * w, 2));
    validate(s);
    CHECK(simulate(s, p, read, t).makespan_s > 0);
  }
  CHECK(replicated > 0);

  // By hand: stages in a V over 2 workers; a V of 3 stages per worker is refused.
  Profile flat = random_chain(rng, 8);
  PartitionOptions o;
  o.virtual_stages = 2;
  o.placement = StagePlacement::V;
  const Topology two{{{2, 1e10}}, {}};
  const Plan manual = evaluate_stages(flat, two, parse_manual_stages("0:1,1:4,4:6,6:8"), o);
  CHECK(manual.schedule == "zb-v");
  CHECK(manual.stages[2].ranks == std::vector<int>{1});
  CHECK(manual.stages[3].ranks == std::vector<int>{0});
  o.virtual_stages = 3;
  CHECK_THROWS_WITH_AS(partition(flat, two, o), doctest::Contains("a V placement has 2 stages"),
                       ConfigError);
}

TEST_CASE("interleaved_passes walked: interleaved 1F1B's time, as its schedule runs") {
  // Equal stages (1 ms forward, 2 ms backward) and free messages: each rank's m·v passes of 3 ms
  // and Narayanan et al.'s bubble of (p - 1) stage times, in groups of p or 2p.
  const int p = 4, v = 2, m = 8;
  StagePassTimes equal;
  equal.forward_s.assign(p * v, 0.001);
  equal.backward_s.assign(p * v, 0.002);
  equal.message_s.assign(p * v, 0.0);
  const std::vector<int> places = looped_stage_places(p, v);
  CHECK(places == std::vector<int>{0, 1, 2, 3, 0, 1, 2, 3});
  const auto walk_of = [&](int group, const StagePassTimes& times) {
    return walk_passes(interleaved_passes(InterleavedOrder{p, v, m, group}), places, m, times);
  };
  const PassWalk walk = walk_of(0, equal);
  CHECK(walk.makespan_s == doctest::Approx((m * v + p - 1) * 0.003));
  // Rank 0 ends last, with the first stage's last backward; the last rank's stages end first.
  CHECK(walk.rank_end_s[0] == doctest::Approx(walk.makespan_s));
  CHECK(walk.closing_end_s[0] == doctest::Approx(walk.makespan_s));
  CHECK(walk.rank_end_s[p - 1] < walk.makespan_s);
  CHECK(walk.closing_end_s[p - 1] <= walk.closing_end_s[p - 2]);
  // Messages of 2 ms, longer than a pass: groups of 2p hide more of them than groups of p.
  StagePassTimes slow = equal;
  std::fill(slow.message_s.begin() + 1, slow.message_s.end(), 0.002);
  const double pairs = walk_of(0, slow).makespan_s;
  const double grouped = walk_of(2 * p, slow).makespan_s;
  CHECK(pairs > walk.makespan_s);
  CHECK(grouped < pairs);
}

TEST_CASE("zb-v's order and its walk: messages between ranks, as the simulator times them") {
  // p = 2, one microbatch, unit F, I and W, messages of half a tick into stages 1 and 3 (stage 2
  // is on stage 1's rank: its message is not charged). Its way: F0 0-1, F1 1.5-2.5, F2 2.5-3.5,
  // F3 4-5, I3 5-6, I2 6.5-7.5, I1 7.5-8.5, I0 9-10; rank 0 runs W3 while it waits for I0's
  // gradient, then W0 10-11.
  const StagePassTimes times = v_times_in_thirds(2, {3, 3, 3, 3}, {0, 0.5, 0.5, 0.5});
  const PassOrder order = zero_bubble_v_order(2, 1, times);
  const auto codes = [](const std::vector<StagePass>& passes) {
    std::string out;
    for (const StagePass& a : passes)
      out += fmt::format("{}{}{} ", a.stage, "FBIW"[static_cast<int>(a.kind)], a.microbatch);
    return out;
  };
  CHECK(codes(order[0]) == "0F0 3F0 3I0 3W0 0I0 0W0 ");
  CHECK(codes(order[1]) == "1F0 2F0 2I0 1I0 2W0 1W0 ");
  const std::vector<int> ranks = v_stage_ranks(2);
  CHECK(ranks == std::vector<int>{0, 1, 1, 0});
  const PassWalk walk = walk_passes(order, ranks, 1, times);
  CHECK(walk.makespan_s == doctest::Approx(11));
  CHECK(walk.rank_end_s == std::vector<double>{11, 10.5});
  CHECK(walk.closing_end_s == std::vector<double>{11, 10.5, 9.5, 7});
  // Two minibatches: each rank runs its order again, the second from where its first ended.
  CHECK(walk_passes(order, ranks, 1, times, 2).makespan_s == doctest::Approx(22));
  // Over slow links (messages of 2 ticks against passes of 1), the order built on the messages
  // walks faster than the one built without them, on random stage times too.
  std::mt19937 rng(20261207);
  for (int p = 2; p <= 4; ++p)
    for (int m : {p, 2 * p, 3 * p}) {
      CAPTURE(p);
      CAPTURE(m);
      std::vector<double> seconds, messages;
      for (int k = 0; k < 2 * p; ++k) {
        seconds.push_back(std::uniform_real_distribution<double>(2, 4)(rng));
        messages.push_back(2);
      }
      const StagePassTimes slow = v_times_in_thirds(p, seconds, messages);
      const StagePassTimes free = v_times_in_thirds(p, seconds, {});
      const std::vector<int> v = v_stage_ranks(p);
      const double informed =
          walk_passes(zero_bubble_v_order(p, m, slow), v, m, slow, 2).makespan_s;
      const double blind = walk_passes(zero_bubble_v_order(p, m, free), v, m, slow, 2).makespan_s;
      CHECK(informed <= blind);
      if (m == 2 * p) CHECK(informed < blind * 0.95);
    }
}

TEST_CASE("partition --virtual-stages: each rank's memory is what its schedule holds at most") {
  // Random chains with bytes on every count the simulator reads, looped and V plans, one or more
  // pipelines, stashing or recomputing: under interleaved-1f1b with any microbatch count, and
  // under zb-v with the plan's, no rank's simulated peak exceeds the plan's, and exceeds it by
  // less than one pass's working memory and input gradient (a rank runs one pass at a time: the
  // plan charges the largest of its stages' working memory, input gradient and rebuilt
  // activations once, each where the stage has it; it charged them per stage, 26-28% over the
  // measured peak of a recomputing transformer-lm).
  std::mt19937 rng(20261208);
  std::uniform_int_distribution<int> bytes(1, 64);
  int pipelines = 0;
  for (int iter = 0; iter < 150; ++iter) {
    CAPTURE(iter);
    const int w = std::uniform_int_distribution<int>(2, 4)(rng);
    const bool v_shape = iter % 2 == 1;
    const int v = v_shape ? 2 : std::uniform_int_distribution<int>(2, 3)(rng);
    Profile p = random_chain(rng, std::uniform_int_distribution<int>(v * w, v * w + 6)(rng));
    for (LayerProfile& l : p.layers) {
      l.saved_bytes = std::int64_t{bytes(rng)} * 50000;
      l.split_kept_bytes = std::int64_t{bytes(rng)} * 20000;
      l.workspace_bytes = std::int64_t{bytes(rng)} * 10000;
    }
    p.loss_gradient_bytes = std::int64_t{bytes(rng)} * 30000;
    PartitionOptions o;
    o.virtual_stages = v;
    o.placement = v_shape ? StagePlacement::V : StagePlacement::Looped;
    o.straight = iter % 3 == 0;
    o.recompute = iter % 5 == 4 ? Recompute::All : Recompute::None;
    o.optimizer_state_factor = 2;
    o.optimizer = "adamw";
    const Topology t{{{w, 1e10}}, {}};
    const Plan plan = partition(p, t, o);
    const int r = plan.stages.front().replicas, places = w / r;
    pipelines += r > 1;
    // The plan's memory is that of its own microbatch count and group, which its schedule runs
    // (a flush plan's, as the other flush plans'; a run of another count is not the plan's).
    const Schedule s =
        generate_schedule(plan.schedule, ScheduleSpec::from_plan(plan, plan.microbatches, 1));
    const Simulation sim = simulate(s, p, plan, t);
    for (int rank = 0; rank < w; ++rank) {
      CAPTURE(rank);
      const auto peak =
          static_cast<double>(sim.ranks[static_cast<std::size_t>(rank)].peak_memory_bytes);
      const auto planned =
          static_cast<double>(plan.predicted.peak_memory_bytes[static_cast<std::size_t>(rank)]);
      CHECK(peak <= planned);
      // Above the simulator's by at most one pass's working memory and the gradient of its
      // backward (its input's size): the rank runs one pass at a time.
      double per_pass = 0;
      for (const PlanStage& st : plan.stages)
        if (st.ranks.front() == rank % places)
          per_pass = std::max(
              per_pass,
              st.workspace_bytes +
                  (st.begin > 0 ? static_cast<double>(
                                      p.layers[static_cast<std::size_t>(st.begin) - 1].output_bytes)
                                : 0.0));
      CHECK(planned - peak <= per_pass);
      MESSAGE(fmt::format("{} {} {:.3f}", iter, rank, planned / peak));
    }
  }
  CHECK(pipelines > 0);

  // A memory limit between what stashing and recomputing need: refused, naming --recompute auto,
  // which then recomputes the stages of the rank that needs it, or every stage where that is
  // faster, the plan fitting either way.
  for (const bool heavy_first : {false, true}) {
    CAPTURE(heavy_first);
    // Equal layers; with heavy_first, the first keeps far more than the others, so only rank 0
    // needs to recompute.
    Profile p = random_chain(rng, 8);
    for (LayerProfile& l : p.layers) {
      l.forward_s = 0.001;
      l.backward_s = 0.002;
      l.output_bytes = 100000;
      l.saved_bytes = heavy_first && &l == &p.layers[0] ? 40000000 : 4000000;
    }
    PartitionOptions o;
    o.virtual_stages = 2;
    o.straight = true;
    const testing::LimitedPlans plans =
        testing::plan_under_halfway_limit(p, Topology{{{2, 1e10}}, {}}, o);
    const Plan &fits = plans.fits, &recomputing = plans.recomputing;
    const Topology& t = plans.limited;
    o.recompute = Recompute::Auto;
    CHECK(fits.predicted.time_per_minibatch_s <=
          recomputing.predicted.time_per_minibatch_s * (1 + 1e-12));
    int recomputed = 0;
    for (const PlanStage& st : fits.stages) recomputed += st.recompute;
    CHECK(recomputed > 0);
    if (heavy_first) {
      // Rank 0's first stage alone; the plan is faster than every stage recomputing.
      CHECK(recomputed == 1);
      CHECK(fits.stages[0].recompute);
      CHECK(fits.predicted.time_per_minibatch_s < recomputing.predicted.time_per_minibatch_s);
    }
    // The manual plan of the same cuts recomputes the same stages.
    std::vector<ManualStage> manual;
    for (const PlanStage& st : fits.stages) manual.push_back({st.begin, st.end, 1});
    const Plan again = evaluate_stages(p, t, manual, o);
    for (std::size_t k = 0; k < manual.size(); ++k)
      CHECK(again.stages[k].recompute == fits.stages[k].recompute);
  }
}

namespace {

// Eight equal layers (1 ms forward, 2 ms backward, 1000 parameter bytes) whose outputs hold
// `output_bytes`.
Profile flat_chain(std::int64_t output_bytes) {
  Profile p;
  p.model = "flat";
  p.batch_size = 1;
  for (int i = 0; i < 8; ++i)
    p.layers.push_back(
        {fmt::format("l{}", i), "X", 0.001, 0.002, 0, 0, 0, 0, output_bytes, 1000, 0, {}, false});
  return p;
}

}  // namespace

TEST_CASE("partition --virtual-stages over slow links: groups of microbatches that hide messages") {
  // Eight equal layers (1 ms forward, 2 ms backward) on 2 workers at 1 MB/s: four stages of 6 ms,
  // each message 3 ms (2a/B). A microbatch's way round the ranks is 4·6 + 2·3·3 = 42 ms against a
  // rank's 12 ms per microbatch, so groups of p = 2 leave the ranks waiting on the messages; the
  // plan takes groups of 4, which its walk of the order finds faster, charges their memory, and
  // its schedule runs faster than in groups of 2, at the plan's figure.
  const Profile p = flat_chain(1500);
  const Topology t{{{2, 1e6}}, {}};
  PartitionOptions o;
  o.virtual_stages = 2;
  o.microbatches = 16;
  const Plan plan = partition(p, t, o);
  REQUIRE(plan.config == "1-1-1-1");
  CHECK(plan.microbatch_group == 4);
  const auto simulated = [&](const Plan& q) {
    return simulate(generate_schedule(q.schedule, ScheduleSpec::from_plan(q, 16)), p, q, t);
  };
  Plan in_pairs = plan;
  in_pairs.microbatch_group = 0;
  const Simulation grouped = simulated(plan), paired = simulated(in_pairs);
  CHECK(grouped.time_per_minibatch_s < paired.time_per_minibatch_s);
  const double ratio = grouped.samples_per_s / plan.predicted.samples_per_s;
  MESSAGE(fmt::format("groups of 4: simulated {:.3f}x the plan's figure; groups of 2: {:.3f}x",
                      ratio, paired.samples_per_s / plan.predicted.samples_per_s));
  CHECK(ratio == doctest::Approx(1.0).epsilon(1e-9));
  for (int r = 0; r < 2; ++r)
    CHECK(grouped.ranks[static_cast<std::size_t>(r)].peak_memory_bytes <=
          plan.predicted.peak_memory_bytes[static_cast<std::size_t>(r)]);
  // Memory for groups of 2 but not of 4: the plan keeps to groups of 2.
  Topology roomy = t, tight = t;
  roomy.memory_bytes_per_worker = static_cast<double>(*std::max_element(
      plan.predicted.peak_memory_bytes.begin(), plan.predicted.peak_memory_bytes.end()));
  CHECK(partition(p, roomy, o).microbatch_group == 4);
  tight.memory_bytes_per_worker = *roomy.memory_bytes_per_worker - 1;
  const Plan smaller = partition(p, tight, o);
  CHECK(smaller.microbatch_group < 4);
  CHECK(smaller.predicted.time_per_minibatch_s >= plan.predicted.time_per_minibatch_s);
}

TEST_CASE(
    "partition --virtual-stages: manual stages, and clear errors for what cannot be planned") {
  const Profile p = flat_chain(100);
  Topology t{{{2, 1e10}}, {}};
  PartitionOptions o;
  o.virtual_stages = 2;
  // Eight equal layers over four stages: two each; each rank holds two stages of 6 ms. A
  // minibatch of 8 microbatches (4 per worker) takes 8 of a rank's 12 ms, and the fill and drain:
  // the 24 ms way less those 12, over the 2 virtual stages.
  const Plan plan = partition(p, t, o);
  for (int k = 0; k < 4; ++k) CHECK(plan.stages[k].end - plan.stages[k].begin == 2);
  CHECK(plan.microbatches == 8);
  CHECK(plan.predicted.time_per_minibatch_s == doctest::Approx((8 * 0.012 + 0.006) / 8));
  const Plan manual = evaluate_stages(p, t, parse_manual_stages("0:1,1:4,4:6,6:8"), o);
  CHECK(manual.virtual_stages == 2);
  CHECK(manual.stages[1].ranks == std::vector<int>{1});
  // Rank 1: 3 + 2 layers, 15 ms per microbatch, and the 3 ms of rank 0's first pass before its
  // first.
  CHECK(manual.predicted.time_per_minibatch_s == doctest::Approx((8 * 0.015 + 0.003) / 8));
  CHECK(manual.predicted.time_per_minibatch_s ==
        doctest::Approx(simulated_per_microbatch(manual, p, t)));
  // --microbatches: the plan records them; interleaved 1F1B takes them in groups of the ranks.
  PartitionOptions sixteen = o;
  sixteen.microbatches = 16;
  const Plan longer = partition(p, t, sixteen);
  CHECK(longer.microbatches == 16);
  CHECK(longer.predicted.time_per_minibatch_s == doctest::Approx((16 * 0.012 + 0.006) / 16));
  CHECK(parse_plan(plan_to_json(longer).dump(), "longer").microbatches == 16);
  sixteen.microbatches = 7;
  CHECK_THROWS_WITH_AS(partition(p, t, sixteen), doctest::Contains("multiple of the 2 workers"),
                       ConfigError);
  sixteen.placement = StagePlacement::V;  // zb-v deals any count
  CHECK(partition(p, t, sixteen).microbatches == 7);

  auto fails = [&](PartitionOptions opt, const Topology& topo, const char* what) {
    CHECK_THROWS_WITH_AS(partition(p, topo, opt), doctest::Contains(what), ConfigError);
  };
  PartitionOptions bad = o;
  bad.virtual_stages = 0;
  fails(bad, t, "at least 1");
  bad.virtual_stages = 5;
  fails(bad, t, "only 8 layers");
  bad = o;
  bad.cost_model = CostModel::PipeDream;
  fails(bad, t, "pipeline cost model");
  bad = o;
  bad.allow_idle = true;
  fails(bad, t, "--allow-idle");
  fails(o, Topology{{{1, 1e10}}, {}}, "at least 2 workers");
  fails(o, Topology{{{2, 1e10}}, 1000.0}, "more than the 1000 available");
  CHECK_THROWS_WITH_AS(evaluate_stages(p, t, parse_manual_stages("0:2x2,2:4,4:6,6:8"), o),
                       doctest::Contains("have the same replicas, one per pipeline"), ConfigError);
  CHECK_THROWS_WITH_AS(evaluate_stages(p, t, parse_manual_stages("0:2x2,2:4x2,4:6x2,6:8x2"), o),
                       doctest::Contains("pipelines of at least 2"), ConfigError);
  CHECK_THROWS_WITH_AS(evaluate_stages(p, t, parse_manual_stages("0:4,4:8"), o),
                       doctest::Contains("has 4 stages, got 2"), ConfigError);
  // One layer slower than the rest fixes the optimum; within it the cut is the most even one
  // (stages of 1, 10, 5 and 5 ms), not the earliest (1, 10, 1, 9 ms: ranks of 2 and 19 ms), and
  // then cut points move to even out the ranks, each the sum of its stages: 1, 10, 9 and 1 ms
  // make ranks of 10 and 11 ms, where 1, 10, 5, 5 made 6 and 15. In a V (ranks: stages 0 + 3 and
  // 1 + 2) the same sums come from 1, 10, 1 and 9 ms.
  Profile skewed = p;
  skewed.layers.resize(6);
  const double ms[] = {1, 10, 1, 4, 4, 1};
  for (int i = 0; i < 6; ++i) {
    skewed.layers[i].forward_s = ms[i] / 3000;
    skewed.layers[i].backward_s = 2 * ms[i] / 3000;
  }
  const Plan even = partition(skewed, t, o);
  CHECK(even.stages[2].begin == 2);
  CHECK(even.stages[3].begin == 5);
  // Each rank alternates a long and a short stage, so each waits on the other's long one: the
  // minibatch takes more than 8 of the slower rank's 11 ms, as its schedule runs it.
  CHECK(even.predicted.time_per_minibatch_s > 0.011 * 1.1);
  CHECK(even.predicted.time_per_minibatch_s ==
        doctest::Approx(simulated_per_microbatch(even, skewed, t)));
  PartitionOptions v_shape = o;
  v_shape.placement = StagePlacement::V;
  const Plan v = partition(skewed, t, v_shape);
  CHECK(v.stages[2].begin == 2);
  CHECK(v.stages[3].begin == 3);
  // The figure is zb-v's order walked: 8 microbatches of the slower rank's 11 ms, and 5 ms of
  // fill and drain, as the schedule runs it.
  CHECK(v.predicted.time_per_minibatch_s == doctest::Approx((8 * 0.011 + 0.005) / 8));
  CHECK(v.predicted.time_per_minibatch_s ==
        doctest::Approx(simulated_per_microbatch(v, skewed, t)).epsilon(1e-9));
  // Equal layers and free communication: the partitioned plan's interleaved bubble is exactly
  // (p - 1) / (v·m + p - 1), against 1F1B's (p - 1) / (m + p - 1) on the straight plan.
  Topology four{{{4, 1e10}}, {}};
  PartitionOptions free = o;
  free.ignore_transfer = true;
  free.straight = true;
  const Plan interleaved = partition(p, four, free);
  const Simulation il =
      simulate(generate_schedule("interleaved-1f1b", ScheduleSpec::from_plan(interleaved, 8)), p,
               interleaved, Topology{});
  CHECK(il.bubble_fraction == doctest::Approx(3.0 / 19));
  PartitionOptions plain;
  plain.straight = true;
  plain.ignore_transfer = true;
  const Plan straight = partition(p, four, plain);
  REQUIRE(straight.num_stages() == 4);
  const Simulation flat = simulate(
      generate_schedule("1f1b-flush", ScheduleSpec::from_plan(straight, 8)), p, straight, {});
  CHECK(flat.bubble_fraction == doctest::Approx(3.0 / 11));
  // --recompute all: every stage keeps only its input and runs its forward twice (4 ms per
  // layer: two stages of two layers per rank, 16 ms); plan.json keeps the choice.
  PartitionOptions all = o;
  all.recompute = Recompute::All;
  const Plan recomputed = parse_plan(plan_to_json(partition(p, t, all)).dump(), "recomputed");
  CHECK(recomputed.predicted.time_per_minibatch_s == doctest::Approx((8 * 0.016 + 0.008) / 8));
  for (const PlanStage& s : recomputed.stages) CHECK(s.recompute);
  // A rank holds several microbatches of each stage: recomputing keeps only their inputs.
  CHECK(recomputed.stages[1].memory_bytes < plan.stages[1].memory_bytes);
  // One virtual stage is the ordinary planner, and the interleaved generators refuse its
  // layout, naming the fix.
  PartitionOptions one;
  one.virtual_stages = 1;
  CHECK_FALSE(partition(p, t, one).interleaved());
  const Plan straight_plan = partition(p, t, one);
  for (const char* name : {"interleaved-1f1b", "interleaved-zb-h1", "zb-v"})
    CHECK_THROWS_WITH_AS(
        check_schedule_for_plan(straight_plan, name),
        doctest::Contains(fmt::format("this plan gives each worker one stage ({} stages over 2 "
                                      "workers): run it under its own schedule (1f1b-stash), or "
                                      "make an interleaved one with pipeline-partition "
                                      "--virtual-stages 2",
                                      straight_plan.num_stages())
                              .c_str()),
        ConfigError);
  CHECK_NOTHROW(check_schedule_for_plan(straight_plan, "1f1b-flush"));
  CHECK_NOTHROW(check_schedule_for_plan(plan, "interleaved-zb-h1"));
  CHECK_THROWS_WITH_AS(check_schedule_for_plan(plan, "zb-v"),
                       doctest::Contains("run it with --schedule interleaved-1f1b (its default)"),
                       ConfigError);
}

}  // namespace test_interleaved_plan
