// Availability traces: parsing, and the replay of a run re-planned at each change against a
// static plan (schedule/availability.hpp).
#include <pipeline/core/error.hpp>
#include <pipeline/plan/partition.hpp>
#include <pipeline/schedule/availability.hpp>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <string>

#include "support/uniform_profile.hpp"

namespace test_availability {

using namespace pipeline;
using pipeline::testing::uniform_profile;

namespace {

Topology one_level(int workers, double price = 2.0) {
  Topology t;
  t.levels.push_back({workers, 1e10});
  t.price_per_worker_hour = price;
  return t;
}

// Seconds per sample of the partitioner's plan on k workers.
double seconds_per_sample(const Profile& p, int k) {
  const Plan plan = partition(p, one_level(k));
  return plan.predicted.time_per_minibatch_s / p.batch_size;
}

std::string error_of(std::string_view csv) {
  try {
    parse_availability_csv(csv, "trace.csv");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("availability CSV: header optional, comments and blank lines skipped") {
  const auto a = parse_availability_csv("time_s,workers\n0,4\n# night\n\n3600, 2\n7200,0\n");
  REQUIRE(a.size() == 3);
  CHECK(a[0].time_s == 0);
  CHECK(a[0].workers == 4);
  CHECK(a[1].time_s == 3600);
  CHECK(a[1].workers == 2);
  CHECK(a[1].line == 5);
  CHECK(a[2].workers == 0);
  const auto b = parse_availability_csv("0,1\r\n1.5,3\r\n");
  REQUIRE(b.size() == 2);
  CHECK(b[1].time_s == 1.5);
}

TEST_CASE("availability CSV: bad rows are errors naming the line") {
  CHECK(error_of("0,4\n10,two\n").find("trace.csv line 2: workers 'two'") != std::string::npos);
  CHECK(error_of("0,4\nten,2\n").find("trace.csv line 2: time 'ten'") != std::string::npos);
  CHECK(error_of("0,4\n\n10\n").find("trace.csv line 3") != std::string::npos);
  CHECK(error_of("0,4\n10,-1\n").find("line 2: workers '-1'") != std::string::npos);
  CHECK(error_of("0,4\n10,2\n10,3\n").find("line 3: time 10 s is not after") != std::string::npos);
  CHECK(error_of("5,4\n").find("line 1: the first row must be at time 0") != std::string::npos);
  CHECK(error_of("0,4.5\n").find("line 1: workers '4.5'") != std::string::npos);
  CHECK(error_of("# nothing\n").find("has no rows") != std::string::npos);
  CHECK(error_of("time_s,workers\ntime_s,workers\n").find("line 2") != std::string::npos);
}

TEST_CASE("topology_for_workers: whole groups of the inner levels") {
  Topology t;
  t.levels = {{4, 1e11}, {8, 1e9}};
  CHECK(topology_for_workers(t, 32).workers() == 32);
  CHECK(topology_for_workers(t, 13).workers() == 12);
  CHECK(topology_for_workers(t, 13).levels.size() == 2);
  CHECK(topology_for_workers(t, 3).workers() == 3);
  CHECK(topology_for_workers(t, 3).levels.size() == 1);
  CHECK(topology_for_workers(one_level(4), 7).workers() == 7);
}

TEST_CASE("availability: a constant trace equals the static plan") {
  const Profile p = uniform_profile(8);
  AvailabilityOptions o;
  o.samples = 1e6;
  for (const auto& trace : {std::vector<AvailabilityChange>{{0, 4, 1}},
                            std::vector<AvailabilityChange>{{0, 4, 1}, {500, 4, 2}}}) {
    const AvailabilityReplay r = replay_availability(p, one_level(4), trace, o);
    CHECK(r.static_workers == 4);
    REQUIRE(r.fixed.feasible);
    CHECK(r.elastic.time_s == doctest::Approx(r.fixed.time_s));
    CHECK(r.elastic.cost == doctest::Approx(r.fixed.cost));
    CHECK(r.elastic.restarts == 0);
    CHECK(r.fixed.time_s == doctest::Approx(1e6 * seconds_per_sample(p, 4)));
    CHECK(r.fixed.cost == doctest::Approx(r.fixed.time_s / 3600 * 4 * 2.0));
  }
}

TEST_CASE("availability: more workers later is faster than the static plan") {
  const Profile p = uniform_profile(8);
  AvailabilityOptions o;
  o.samples = 1e6;
  o.restart_s = 60;
  const std::vector<AvailabilityChange> trace = {{0, 2, 1}, {100, 8, 2}};
  const AvailabilityReplay r = replay_availability(p, one_level(8), trace, o);
  CHECK(r.static_workers == 2);
  REQUIRE(r.fixed.feasible);
  CHECK(r.elastic.restarts == 1);
  REQUIRE(r.elastic.segments.size() == 2);
  CHECK(r.elastic.segments[1].replanned);
  CHECK(r.elastic.segments[1].workers == 8);
  CHECK(r.elastic.segments[1].restart_s == 60);
  CHECK(r.elastic.time_s < r.fixed.time_s);
  const double first = 100 / seconds_per_sample(p, 2);
  CHECK(r.elastic.time_s ==
        doctest::Approx(160 + (1e6 - first) * seconds_per_sample(p, 8)).epsilon(1e-9));
  // A change too late to pay for its restart is not taken.
  const double end = r.fixed.time_s;
  const AvailabilityReplay late =
      replay_availability(p, one_level(8), {{0, 2, 1}, {end - 1, 8, 2}}, o);
  CHECK(late.elastic.restarts == 0);
  CHECK(late.elastic.time_s == doctest::Approx(r.fixed.time_s));
}

TEST_CASE("availability: with allow_idle a plan trains on fewer workers where that is faster") {
  // Large activations and weights over a slow link: every cut and every allreduce costs more
  // than a worker adds, so one worker trains fastest, and the replay runs (and pays for) that one
  // of the 4 there.
  const Profile p = uniform_profile(4, 1e-3, 2e-3, /*out_bytes=*/100'000'000, 50'000'000);
  Topology slow = one_level(4);
  slow.levels.front().bandwidth_bytes_per_s = 1e8;
  AvailabilityOptions o;
  o.samples = 1e5;
  o.partition.allow_idle = true;
  const AvailabilityReplay r = replay_availability(p, slow, {{0, 4, 1}}, o);
  REQUIRE(r.elastic.segments.size() == 1);
  CHECK(r.elastic.segments[0].available == 4);
  CHECK(r.elastic.segments[0].workers == 1);
  CHECK(r.elastic.cost == doctest::Approx(r.elastic.time_s / 3600 * 1 * 2.0));
  PartitionOptions every;  // without allow_idle: the plan on all 4, slower
  const Plan on_four = partition(p, slow, every);
  CHECK(r.elastic.segments[0].time_per_minibatch_s < on_four.predicted.time_per_minibatch_s);
  // A drop to 2 workers does not stop the plan that trains on 1.
  const AvailabilityReplay drop = replay_availability(p, slow, {{0, 4, 1}, {10, 2, 2}}, o);
  CHECK(drop.elastic.restarts == 0);
}

TEST_CASE("availability: a drop below the plan's workers re-plans and pays the restart") {
  const Profile p = uniform_profile(8);
  AvailabilityOptions o;
  o.samples = 1e6;
  o.restart_s = 30;
  const std::vector<AvailabilityChange> trace = {{0, 4, 1}, {100, 2, 2}};
  const AvailabilityReplay r = replay_availability(p, one_level(4), trace, o);
  REQUIRE(r.elastic.segments.size() == 2);
  CHECK(r.elastic.segments[0].workers == 4);
  CHECK(r.elastic.segments[0].restart_s == 0);  // the start is no restart
  CHECK(r.elastic.segments[1].replanned);
  CHECK(r.elastic.segments[1].workers == 2);
  CHECK(r.elastic.segments[1].restart_s == 30);
  CHECK(r.elastic.restarts == 1);
  const double first = 100 / seconds_per_sample(p, 4);
  CHECK(r.elastic.segments[0].samples == doctest::Approx(first));
  CHECK(r.elastic.time_s ==
        doctest::Approx(130 + (1e6 - first) * seconds_per_sample(p, 2)).epsilon(1e-9));
  // The restart is paid for: cost counts the workers while they restart.
  CHECK(r.elastic.segments[1].cost == doctest::Approx((r.elastic.time_s - 100) / 3600 * 2 * 2.0));
  // The static plan runs on the 2 workers that are always there, without restart.
  CHECK(r.static_workers == 2);
  CHECK(r.fixed.time_s == doctest::Approx(1e6 * seconds_per_sample(p, 2)));
}

TEST_CASE("availability: no workers for a while, a restart cut short, and the static plan") {
  const Profile p = uniform_profile(8);
  AvailabilityOptions o;
  o.samples = 1e6;
  o.restart_s = 60;
  // 4 workers, none from 100 s, 2 from 200 s, 1 from 220 s (the restart begun at 200 s starts
  // over), 4 again from 1000 s on.
  const std::vector<AvailabilityChange> trace = {
      {0, 4, 1}, {100, 0, 2}, {200, 2, 3}, {220, 1, 4}, {1000, 4, 5}};
  const AvailabilityReplay r = replay_availability(p, one_level(4), trace, o);
  // 533k samples by 100 s, the rest on 1 worker from 280 s: done before 1000 s.
  REQUIRE(r.elastic.segments.size() == 4);
  CHECK(r.elastic.segments[1].workers == 0);
  CHECK(r.elastic.segments[1].cost == 0);
  CHECK(r.elastic.segments[2].restart_s == 20);
  CHECK(r.elastic.segments[2].samples == 0);
  CHECK(r.elastic.segments[3].restart_s == 60);
  CHECK(r.elastic.segments[3].replanned);
  CHECK(r.elastic.restarts == 2);  // waiting for workers is no restart; starting again is
  // 0 workers in the trace before the static run would end: no static plan.
  CHECK_FALSE(r.fixed.feasible);
  CHECK(r.static_workers == 0);
  // A trace that ends with nobody never finishes.
  CHECK_THROWS_WITH_AS(replay_availability(p, one_level(4), {{0, 4, 1}, {10, 0, 2}}, o),
                       doctest::Contains("line 2"), ConfigError);
  // Waiting for the first workers: the first start pays no restart.
  const AvailabilityReplay late_start =
      replay_availability(p, one_level(4), {{0, 0, 1}, {50, 4, 2}}, o);
  REQUIRE(late_start.elastic.segments.size() == 2);
  CHECK(late_start.elastic.segments[0].workers == 0);
  CHECK(late_start.elastic.segments[1].restart_s == 0);
  CHECK(late_start.elastic.restarts == 0);
  CHECK(late_start.elastic.time_s == doctest::Approx(50 + 1e6 * seconds_per_sample(p, 4)));
  CHECK_FALSE(late_start.fixed.feasible);
  // Workers lost after the static run would have ended do not count against it.
  const AvailabilityReplay after =
      replay_availability(p, one_level(4), {{0, 4, 1}, {1e9, 1, 2}}, o);
  CHECK(after.static_workers == 4);
}

}  // namespace test_availability
