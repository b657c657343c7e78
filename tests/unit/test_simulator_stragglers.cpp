// Slow ranks and jitter in the simulator (SimulateOptions::rank_slowdown, jitter_cv).
#include <pipeline/schedule/dealing.hpp>
#include <pipeline/schedule/generator.hpp>
#include <pipeline/schedule/simulator.hpp>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include "support/uniform_profile.hpp"

namespace test_simulator_stragglers {

using namespace pipeline;
using pipeline::testing::uniform_profile;
using pipeline::testing::make_plan;

namespace {

Simulation run(const Plan& plan, const Profile& prof, const SimulateOptions& o,
               const std::string& schedule = "1f1b-stash", int microbatches = 1,
               int minibatches = 64) {
  return simulate(
      generate_schedule(schedule, ScheduleSpec::from_plan(plan, microbatches, minibatches)), prof,
      plan, {}, o);
}

}  // namespace

TEST_CASE("slowing every rank by f scales the time by f") {
  const Profile prof = uniform_profile(4);
  const Plan plan = make_plan({{2, 1}, {2, 1}});
  const Simulation base = run(plan, prof, {}, "gpipe", 4, 2);
  SimulateOptions o;
  o.rank_slowdown = {2.5, 2.5};
  const Simulation slow = run(plan, prof, o, "gpipe", 4, 2);
  CHECK(slow.makespan_s == doctest::Approx(2.5 * base.makespan_s));
  CHECK(slow.bubble_fraction == doctest::Approx(base.bubble_fraction));
}

TEST_CASE("one replica of a 2-replica stage slowed 3x: the stage waits for it at every allreduce") {
  const Profile prof = uniform_profile(4);
  // One stage on two replicas, and a pipeline 2-1 whose replicated stage is the bottleneck.
  for (const Plan& plan : {make_plan({{4, 2}}), make_plan({{3, 2}, {1, 1}})}) {
    const Simulation base = run(plan, prof, {});
    SimulateOptions o;
    o.rank_slowdown = {1.0, 3.0};
    const Simulation slow = run(plan, prof, o);
    CAPTURE(plan.num_stages());
    CHECK(slow.time_per_minibatch_s ==
          doctest::Approx(3 * base.time_per_minibatch_s).epsilon(0.02));
    CHECK(slow.ranks[0].bubble_fraction > 0.6);  // the fast replica idles two thirds
  }
  // Slowing the unreplicated last stage of 2-1, whose time is a third of the first's, by 1.5x
  // changes nothing: it is not the bottleneck.
  SimulateOptions o;
  o.rank_slowdown = {1.0, 1.0, 1.5};
  const Plan plan = make_plan({{3, 2}, {1, 1}});
  CHECK(run(plan, prof, o).time_per_minibatch_s ==
        doctest::Approx(run(plan, prof, {}).time_per_minibatch_s).epsilon(0.02));
}

TEST_CASE("re-dealing a slowed replica's microbatches: the stage runs at the pair's joint speed") {
  const Profile prof = uniform_profile(4);
  const Plan plan = make_plan({{4, 2}});
  const int micro = 8;
  auto run_dealt = [&](const std::vector<double>& slowdown, bool rebalance) {
    ScheduleSpec spec = ScheduleSpec::from_plan(plan, micro, 4);
    if (rebalance) spec.dealing = dealing_by_speed(spec, slowdown);
    SimulateOptions o;
    o.rank_slowdown = slowdown;
    return simulate(generate_schedule("1f1b-flush", spec), prof, plan, {}, o);
  };
  const Simulation base = run_dealt({1.0, 1.0}, false);
  const Simulation slow = run_dealt({1.0, 3.0}, false);
  const Simulation dealt = run_dealt({1.0, 3.0}, true);
  // Round-robin: 4 microbatches each, the slow one takes 12 units; dealt 6:2, both take 6.
  CHECK(slow.time_per_minibatch_s == doctest::Approx(3 * base.time_per_minibatch_s));
  CHECK(dealt.time_per_minibatch_s == doctest::Approx(1.5 * base.time_per_minibatch_s));
  // Nominal speeds leave the dealing round-robin: nothing changes.
  CHECK(run_dealt({1.0, 1.0}, true).time_per_minibatch_s ==
        doctest::Approx(base.time_per_minibatch_s));
}

TEST_CASE("jitter: reproducible from its seed, mean 1, and never faster than the bottleneck") {
  const Profile prof = uniform_profile(1);
  const Plan single = make_plan({{1, 1}});
  SimulateOptions o;
  o.jitter_cv = 0.2;
  o.jitter_seed = 7;
  const Simulation a = run(single, prof, o, "1f1b-stash", 1, 2000);
  const Simulation b = run(single, prof, o, "1f1b-stash", 1, 2000);
  CHECK(a.makespan_s == b.makespan_s);
  o.jitter_seed = 8;
  const Simulation c = run(single, prof, o, "1f1b-stash", 1, 2000);
  CHECK(a.makespan_s != c.makespan_s);
  // One rank: the makespan is the sum of 4000 factors of mean 1 (sd 0.2 / sqrt(4000) = 0.3%).
  const Simulation nominal = run(single, prof, {}, "1f1b-stash", 1, 2000);
  CHECK(a.makespan_s == doctest::Approx(nominal.makespan_s).epsilon(0.02));
  o.jitter_cv = 0;
  CHECK(run(single, prof, o, "1f1b-stash", 1, 2000).makespan_s == nominal.makespan_s);
  // A pipeline waits for the slowest stage of each step: jitter slows it down.
  const Plan four = make_plan({{1, 1}, {1, 1}, {1, 1}, {1, 1}});
  const Profile prof4 = uniform_profile(4);
  o.jitter_cv = 0.3;
  CHECK(run(four, prof4, o, "1f1b-stash", 1, 400).time_per_minibatch_s >
        1.02 * run(four, prof4, {}, "1f1b-stash", 1, 400).time_per_minibatch_s);
}

TEST_CASE("slowdown and jitter are checked") {
  const Profile prof = uniform_profile(2);
  const Plan plan = make_plan({{1, 1}, {1, 1}});
  SimulateOptions o;
  o.rank_slowdown = {1.0, 0.0};
  CHECK_THROWS_WITH_AS(run(plan, prof, o), doctest::Contains("slowdown of rank 1"), ConfigError);
  o.rank_slowdown = {};
  o.jitter_cv = -0.1;
  CHECK_THROWS_WITH_AS(run(plan, prof, o), doctest::Contains("jitter"), ConfigError);
}

}  // namespace test_simulator_stragglers
