// Plans for flush schedules (PartitionOptions::schedule 1f1b-flush, zb-h1, gpipe): d copies of a
// straight pipeline, every d that divides the workers weighed. On random chains and topologies the
// plan is well formed, round-trips through plan.json with its microbatches, schedules, validates
// and simulates at the predicted rate (the planner walks the schedule's order) with no rank
// above its planned memory, its cut starts from the exact optimum of its depth, and under its
// schedule it is never slower than the plan made for 1f1b-stash; memory limits recompute stage by
// stage; bad requests are ConfigErrors.
#include <pipeline/core/error.hpp>
#include <pipeline/plan/partition.hpp>
#include <pipeline/plan/plan_json.hpp>
#include <pipeline/schedule/generator.hpp>
#include <pipeline/schedule/simulator.hpp>
#include <pipeline/schedule/validate.hpp>

#include "support/chain_cuts.hpp"
#include "support/memory_limit_plans.hpp"
#include "support/uniform_profile.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <random>
#include <string>

namespace test_flush_plan {

using namespace pipeline;

namespace {

// A chain of `layers` with drawn times (backwards split into halves), bytes and step times.
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
    l.backward_input_s = time(rng);
    l.backward_weight_s = time(rng);
    l.backward_s = l.backward_input_s + l.backward_weight_s;
    l.output_bytes = std::int64_t{bytes(rng)} * 100000;
    l.saved_bytes = std::int64_t{bytes(rng)} * 100000;
    l.split_kept_bytes = std::int64_t{bytes(rng)} * 20000;
    l.parameter_bytes = std::int64_t{bytes(rng)} * 40960;
    l.step_s.adamw = time(rng) / 10;
    p.layers.push_back(l);
  }
  p.loss_gradient_bytes = 200000;
  return p;
}

}  // namespace

TEST_CASE("partition --schedule flush: random chains plan, simulate as predicted, fit, and win") {
  std::mt19937 rng(20261206);
  const char* schedules[] = {"1f1b-flush", "zb-h1", "gpipe"};
  int pipelined = 0, replicated = 0, moved = 0;
  for (int iter = 0; iter < 200; ++iter) {
    CAPTURE(iter);
    const int w = std::uniform_int_distribution<int>(2, 8)(rng);
    const Profile p = random_chain(rng, std::uniform_int_distribution<int>(w, w + 6)(rng));
    // Every other cluster's network is as good as free (transfers and allreduces take
    // nanoseconds), where the plan's rate is compared with the simulator's.
    const bool free = iter % 2 == 0;
    Topology t;
    t.levels = iter % 3 == 2 && w % 2 == 0
                   ? std::vector<TopologyLevel>{{2, free ? 1e15 : 1e10}, {w / 2, free ? 1e15 : 1e9}}
                   : std::vector<TopologyLevel>{
                         {w, free ? 1e15 : std::uniform_real_distribution<double>(1e8, 1e10)(rng)}};
    PartitionOptions o;
    o.schedule = schedules[iter % 3];
    o.microbatches = std::uniform_int_distribution<int>(1, 4 * w)(rng);
    o.ignore_transfer = free;
    o.straight = iter % 7 == 6;
    o.optimizer = "adamw";
    o.optimizer_state_factor = 2;
    CAPTURE(o.schedule);
    CAPTURE(o.microbatches);
    const Plan plan = partition(p, t, o);
    CHECK(plan.schedule == o.schedule);
    CHECK(plan.microbatches == o.microbatches);
    CHECK_FALSE(plan.interleaved());
    // d copies of a straight pipeline: every stage d replicas on adjacent ranks, covering the
    // layers in order.
    const int d = plan.stages.front().replicas, depth = plan.num_stages();
    REQUIRE(d * depth == w);
    if (o.straight) CHECK(d == 1);
    pipelined += depth > 1;
    replicated += d > 1;
    int next = 0;
    for (int k = 0; k < depth; ++k) {
      const PlanStage& s = plan.stages[k];
      CHECK(s.begin == next);
      CHECK(s.end > s.begin);
      CHECK(s.replicas == d);
      for (int r = 0; r < d; ++r) CHECK(s.ranks[r] == k * d + r);
      next = s.end;
    }
    CHECK(next == p.size());
    // The dynamic program's cut starts from the least slowest stage of its depth (exact), and
    // cut points move from there only where the walked schedule runs faster.
    if (free) {
      double slowest = 0;
      for (const PlanStage& s : plan.stages) slowest = std::max(slowest, s.compute_s * d);
      const double least = testing::least_slowest_stage(p, depth);
      CHECK(slowest >= least * (1 - 1e-12));
      moved += slowest > least * (1 + 1e-12);
    }
    // plan.json keeps the microbatches, and the plan runs as predicted, within its memory.
    const Plan read = parse_plan(plan_to_json(plan).dump(), "flush");
    CHECK(read.microbatches == plan.microbatches);
    const Schedule s =
        generate_schedule(read.schedule, ScheduleSpec::from_plan(read, read.microbatches, 1));
    validate(s);
    // (The replicas' allreduces overlap their closing backwards, as the runtime's buckets do.)
    SimulateOptions overlapped;
    overlapped.overlap_allreduce = true;
    const Simulation sim = simulate(s, p, read, t, overlapped);
    for (int r = 0; r < w; ++r) {
      CAPTURE(r);
      const auto planned =
          static_cast<double>(plan.predicted.peak_memory_bytes[static_cast<std::size_t>(r)]);
      const auto simulated =
          static_cast<double>(sim.ranks[static_cast<std::size_t>(r)].peak_memory_bytes);
      CHECK(simulated <= planned);
      // Above it by no more than the stage's working memory and backward gradient (which the
      // plan charges whole, the simulator pass by pass); under ZB-H1 the output gradients kept
      // from an I to its W are charged for the microbatches between the two, not all it holds.
      const PlanStage& stage = plan.stages[static_cast<std::size_t>(r / d)];
      const double input_gradient =
          stage.begin > 0 ? static_cast<double>(
                                p.layers[static_cast<std::size_t>(stage.begin) - 1].output_bytes)
                          : 0.0;
      // (With fewer microbatches than replicas, a replica may get none and hold nothing.)
      if (o.schedule == "zb-h1" && o.microbatches >= d)
        CHECK(planned - simulated <= stage.workspace_bytes + input_gradient);
    }
    // The figure is the walk of the schedule's own order, slow links and allreduces included
    // (where the plan ignores transfers, the simulator's take nanoseconds).
    CHECK(sim.samples_per_s ==
          doctest::Approx(plan.predicted.samples_per_s).epsilon(free ? 1e-5 : 1e-9));
    if (free) {
      // Under the same schedule and microbatches, the plan made for 1f1b-stash is no faster.
      PartitionOptions stash = o;
      stash.schedule = "1f1b-stash";
      stash.microbatches = 0;
      const Plan other = partition(p, t, stash);
      const Simulation theirs =
          simulate(generate_schedule(o.schedule, ScheduleSpec::from_plan(other, o.microbatches, 1)),
                   p, other, t);
      CHECK(sim.samples_per_s >= theirs.samples_per_s * 0.97);
    }
  }
  CHECK(pipelined > 20);
  CHECK(replicated > 20);
  MESSAGE(moved << " plans on free networks moved their cut past the least slowest stage");
}

TEST_CASE("partition --schedule gpipe: messages slower than the stages pace both phases") {
  // Two stages of 0.4 ms forward and 0.8 ms backward per microbatch; a message takes 1.05 ms. 1F1B
  // sends activations while gradients come back; GPipe's phases cannot, so each is paced by the
  // cut: 2.1 ms per microbatch, not 1F1B's 1.2 ms.
  const Profile p = testing::uniform_profile(4, 0.0002, 0.0004, 1 << 16, 1000);
  const Topology t{{{2, 1.25e8}}, {}};
  for (const char* schedule : {"gpipe", "1f1b-flush"}) {
    CAPTURE(schedule);
    PartitionOptions o;
    o.schedule = schedule;
    o.microbatches = 16;
    o.straight = true;
    const Plan plan = partition(p, t, o);
    REQUIRE(plan.config == "1-1");
    const Simulation sim = simulate(
        generate_schedule(schedule, ScheduleSpec::from_plan(plan, o.microbatches, 1)), p, plan, t);
    MESSAGE(fmt::format("{}: predicted {:.3f} ms, simulated {:.3f} ms per microbatch", schedule,
                        1e3 * plan.predicted.time_per_minibatch_s,
                        1e3 * sim.time_per_minibatch_s / o.microbatches));
    CHECK(sim.time_per_minibatch_s / o.microbatches ==
          doctest::Approx(plan.predicted.time_per_minibatch_s).epsilon(1e-9));
  }
}

TEST_CASE("partition --schedule flush: memory limits recompute stage by stage, or refuse") {
  std::mt19937 rng(7);
  Profile p = random_chain(rng, 8);
  for (LayerProfile& l : p.layers) l.saved_bytes = 4000000;
  p.layers[0].saved_bytes = 40000000;  // the first stage holds most, and the most microbatches
  PartitionOptions o;
  o.schedule = "1f1b-flush";
  o.microbatches = 8;
  o.straight = true;
  const testing::LimitedPlans plans =
      testing::plan_under_halfway_limit(p, Topology{{{4, 1e10}}, {}}, o);
  const Plan& fits = plans.fits;
  CHECK(fits.stages[0].recompute);
  int recomputed = 0;
  for (const PlanStage& s : fits.stages) recomputed += s.recompute;
  CHECK(recomputed < fits.num_stages());
  CHECK(fits.predicted.samples_per_s >= plans.recomputing.predicted.samples_per_s);
  Topology t = plans.limited;
  t.memory_bytes_per_worker = 1000;
  o.recompute = Recompute::Auto;
  CHECK_THROWS_WITH_AS(partition(p, t, o), doctest::Contains("no plan for 1f1b-flush of 4 workers"),
                       ConfigError);
}

TEST_CASE("partition --schedule: what it plans for, and clear errors otherwise") {
  std::mt19937 rng(11);
  const Profile p = random_chain(rng, 6);
  const Topology t{{{2, 1e10}}, {}};
  PartitionOptions o;
  o.schedule = "2bw";
  CHECK_THROWS_WITH_AS(partition(p, t, o),
                       doctest::Contains("1f1b-stash, 1f1b-flush, zb-h1 or gpipe"), ConfigError);
  o.schedule = "zb-v";
  CHECK_THROWS_WITH_AS(partition(p, t, o), doctest::Contains("--stage-placement v"), ConfigError);
  o.schedule = "1f1b-flush";
  o.virtual_stages = 2;
  CHECK_THROWS_WITH_AS(partition(p, t, o), doctest::Contains("--virtual-stages"), ConfigError);
  o.virtual_stages = 1;
  o.cost_model = CostModel::PipeDream;
  CHECK_THROWS_WITH_AS(partition(p, t, o), doctest::Contains("pipeline cost model"), ConfigError);
  o.cost_model = CostModel::Pipeline;
  CHECK_THROWS_WITH_AS(evaluate_stages(p, t, parse_manual_stages("0:3,3:6"), o),
                       doctest::Contains("pipeline-simulate --schedule 1f1b-flush"), ConfigError);
  // The default: 4 microbatches per worker.
  CHECK(partition(p, t, o).microbatches == 8);
  // A plan for 1f1b-stash records none.
  CHECK(partition(p, t, {}).microbatches == 0);
}

}  // namespace test_flush_plan

namespace test_flush_plan {

TEST_CASE(
    "default microbatches: 4 per rank dividing the batch, as the trainers and simulator take "
    "them") {
  CHECK(default_flush_microbatches(4, false, 64) == 16);
  CHECK(default_flush_microbatches(6, false, 64) == 16);  // 24 does not divide 64
  CHECK(default_flush_microbatches(6, false, 0) == 24);   // no batch: any count
  CHECK(default_flush_microbatches(4, false, 8) == 8);    // no more than the samples
  // Interleaved: a multiple of the ranks, dividing the batch where one does.
  CHECK(default_flush_microbatches(3, true, 36) == 12);
  CHECK(default_flush_microbatches(3, true, 18) == 9);   // 3 per rank
  CHECK(default_flush_microbatches(3, true, 64) == 12);  // none divides: unequal microbatches
  CHECK(default_flush_microbatches(3, true, 7) == 6);    // as many as the samples allow
  CHECK(default_flush_microbatches(3, true, 2) == 2);
  CHECK_THROWS_AS(default_flush_microbatches(0, false, 64), ConfigError);

  Plan plan = testing::make_plan({{2, 1}, {2, 2}});
  plan.batch_size = 64;
  CHECK(default_microbatches(plan, "1f1b-stash", 64) == 1);
  CHECK(default_microbatches(plan, "1f1b-flush", 64) == 8);  // 3 ranks: 12, lowered to divide 64
  plan.microbatches = 8;
  CHECK(default_microbatches(plan, "gpipe", 64) == 8);  // the plan's
}

}  // namespace test_flush_plan
