// Dealing microbatches to replicas by speed (schedule/dealing.hpp) and the runtime's speed
// estimates (runtime/speed_rebalancer.hpp): the greedy is optimal against enumeration, equal
// speeds give round-robin, the validator checks a schedule's dealing, and the rebalancer's
// exchange gives every rank the same estimates.
#include <pipeline/comm/comms/local.hpp>
#include <pipeline/core/rng.hpp>
#include <pipeline/runtime/speed_rebalancer.hpp>
#include <pipeline/schedule/dealing.hpp>
#include <pipeline/schedule/generator.hpp>
#include <pipeline/schedule/validate.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <vector>

namespace test_dealing {

using namespace pipeline;

namespace {

// The slowest replica's time for `counts` microbatches.
double makespan(const std::vector<int>& counts, const std::vector<double>& t) {
  double m = 0;
  for (std::size_t i = 0; i < t.size(); ++i) m = std::max(m, counts[i] * t[i]);
  return m;
}

// The best makespan over every way of splitting `count` microbatches among the replicas, each
// getting at least `min_each`.
double best_makespan(const std::vector<double>& t, int count, int min_each) {
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> counts(t.size(), 0);
  auto rec = [&](auto&& self, std::size_t i, int left) -> void {
    if (i + 1 == t.size()) {
      if (left < min_each) return;
      counts[i] = left;
      best = std::min(best, makespan(counts, t));
      return;
    }
    for (int c = min_each; c <= left; ++c) {
      counts[i] = c;
      self(self, i + 1, left - c);
    }
  };
  rec(rec, 0, count);
  return best;
}

std::vector<int> counts_of(const std::vector<std::int32_t>& dealt, std::size_t replicas) {
  std::vector<int> c(replicas, 0);
  for (auto r : dealt) ++c[static_cast<std::size_t>(r)];
  return c;
}

}  // namespace

TEST_CASE("deal_by_speed: optimal against enumeration on random speeds") {
  Rng rng(5, "deal-by-speed");
  for (int trial = 0; trial < 300; ++trial) {
    const std::size_t r = 1 + rng.below(4);
    std::vector<double> t;
    for (std::size_t i = 0; i < r; ++i)
      t.push_back(0.5 + static_cast<double>(rng.below(1000)) / 200);
    const int count = static_cast<int>(rng.below(13));
    const int min_each = static_cast<int>(rng.below(2));
    CAPTURE(count);
    CAPTURE(min_each);
    const auto dealt = deal_by_speed(t, count, min_each);
    REQUIRE(dealt.size() == static_cast<std::size_t>(count));
    const auto counts = counts_of(dealt, r);
    const int floor_each = min_each * static_cast<int>(r) <= count ? min_each : 0;
    for (int c : counts) CHECK(c >= floor_each);
    CHECK(makespan(counts, t) == doctest::Approx(best_makespan(t, count, floor_each)));
  }
}

TEST_CASE("deal_by_speed: equal speeds deal round-robin; a 3x slower replica gets a quarter") {
  const std::vector<double> equal = {2.0, 2.0, 2.0};
  const auto rr = deal_by_speed(equal, 7);
  for (std::size_t u = 0; u < rr.size(); ++u) CHECK(rr[u] == static_cast<std::int32_t>(u % 3));
  const std::vector<double> slow = {1.0, 3.0};
  CHECK(counts_of(deal_by_speed(slow, 8), 2) == std::vector<int>{6, 2});
  // Two microbatches: the fast replica does both (2 units) rather than wait 3 for the slow one.
  CHECK(counts_of(deal_by_speed(slow, 2), 2) == std::vector<int>{2, 0});
  // ... unless each replica must keep one (so that it is measured again).
  CHECK(counts_of(deal_by_speed(slow, 2, 1), 2) == std::vector<int>{1, 1});
  CHECK_THROWS_AS(deal_by_speed(std::vector<double>{1.0, 0.0}, 4), ConfigError);
  CHECK_THROWS_AS(deal_by_speed(std::vector<double>{}, 4), ConfigError);
}

TEST_CASE("dealing_by_speed: per stage and minibatch; equal speeds stay round-robin") {
  ScheduleSpec spec;
  spec.stage_ranks = {{0, 1}, {2}, {3, 4, 5}};
  spec.microbatches = 6;
  spec.minibatches = 3;
  const std::vector<double> equal(6, 1e-3);
  for (auto& d : dealing_by_speed(spec, equal)) CHECK(d.empty());
  // Rank 1 three times slower: stage 0 deals 5:1 (makespan 5 units; 4:2 would take 6). Rank 5
  // twice as slow as its peers: stage 2 deals 3:2:1 (3 units; 2:2:2 would take 4). Rank 2, a
  // stage of its own, is left round-robin however slow.
  const std::vector<double> t = {1e-3, 3e-3, 5e-3, 1e-3, 1e-3, 2e-3};
  const auto dealing = dealing_by_speed(spec, t);
  REQUIRE(dealing.size() == 3);
  CHECK(dealing[1].empty());
  for (int st : {0, 2}) {
    REQUIRE(dealing[st].size() == 18);
    spec.dealing = dealing;
    const Schedule s = generate_schedule("1f1b-flush", spec);
    validate(s);
    for (int j = 0; j < 3; ++j) CHECK(dealt_counts(s, st, j) == dealt_counts(s, st, 0));
  }
  spec.dealing = dealing;
  const Schedule s = generate_schedule("1f1b-flush", spec);
  CHECK(dealt_counts(s, 0) == std::vector<int>{5, 1});
  CHECK(dealt_counts(s, 2) == std::vector<int>{3, 2, 1});
}

// A dealing other than round-robin keeps PipeDream's depths where round-robin runs the deeper
// ones its search finds: on replicas of near speeds round-robin can be the faster, and is kept
// (the straggler README plan, 1-1-4, rank 3 1.3x slower: dealt 5:3:4:4 ran 4% slower); a 3x
// straggler is dealt around. Never slower than round-robin on the timing it is chosen by.
TEST_CASE("schedule_by_speed: dealt by speed, or round-robin where that is no slower") {
  ScheduleSpec spec;
  spec.stage_ranks = {{0}, {1}, {2, 3, 4, 5}};
  spec.microbatches = 16;
  spec.minibatches = 1;
  for (const double slow : {1.0, 1.05, 1.3, 2.0, 3.0}) {
    CAPTURE(slow);
    std::vector<double> seconds(6, 1e-3);
    seconds[3] = slow * 1e-3;
    std::vector<double> slowdown(6, 1.0);
    slowdown[3] = slow;
    const Schedule chosen = schedule_by_speed("1f1b-flush", spec, seconds);
    validate(chosen);
    const Schedule even = generate_schedule("1f1b-flush", spec);
    ScheduleSpec dealt = spec;
    dealt.dealing = dealing_by_speed(spec, seconds);
    const Schedule by_speed = generate_schedule("1f1b-flush", dealt);
    const double chosen_s = detail::probe_makespan_slowed(spec, chosen, slowdown);
    CHECK(chosen_s <= detail::probe_makespan_slowed(spec, even, slowdown) * (1 + 1e-12));
    CHECK(chosen_s <= detail::probe_makespan_slowed(spec, by_speed, slowdown) * (1 + 1e-12));
    if (slow == 1.0) CHECK(dealt_counts(chosen, 2) == std::vector<int>{4, 4, 4, 4});
    if (slow == 3.0) CHECK(dealt_counts(chosen, 2)[1] < 4);
  }
  // The caller's timing decides where given: one that prefers round-robin gets it.
  std::vector<double> seconds(6, 1e-3);
  seconds[3] = 3e-3;
  const Schedule kept = schedule_by_speed("1f1b-flush", spec, seconds, [](const Schedule& s) {
    return dealt_counts(s, 2) == std::vector<int>{4, 4, 4, 4} ? 1.0 : 2.0;
  });
  CHECK(dealt_counts(kept, 2) == std::vector<int>{4, 4, 4, 4});
}

TEST_CASE("the validator checks a schedule's dealing") {
  ScheduleSpec spec;
  spec.stage_ranks = {{0, 1}, {2}};
  spec.microbatches = 4;
  spec.minibatches = 2;
  spec.dealing = {{0, 0, 0, 1, 0, 0, 0, 1}};
  Schedule s = generate_schedule("gpipe", spec);
  CHECK_NOTHROW(validate(s));
  CHECK(s.rank_of(0, 3) == 1);
  CHECK(s.rank_of(0, 2) == 0);
  // The same actions under another dealing: a microbatch on the wrong rank.
  Schedule moved = s;
  moved.dealing[0][3] = 0;
  CHECK_THROWS_WITH_AS(validate(moved), doctest::Contains("microbatch 3"), ConfigError);
  Schedule short_dealing = s;
  short_dealing.dealing[0].pop_back();
  CHECK_THROWS_WITH_AS(validate(short_dealing), doctest::Contains("the run has 8"), ConfigError);
  Schedule bad_replica = s;
  bad_replica.dealing[0][0] = 2;
  CHECK_THROWS_WITH_AS(validate(bad_replica), doctest::Contains("replicas 0..1"), ConfigError);
  Schedule stash = s;
  stash.policy = UpdatePolicy::Stash;
  CHECK_THROWS_WITH_AS(validate(stash), doctest::Contains("only flush schedules"), ConfigError);
  // The spec is checked before any schedule is built.
  ScheduleSpec wrong = spec;
  wrong.dealing = {{0, 1}};
  CHECK_THROWS_WITH_AS(generate_schedule("1f1b-flush", wrong), doctest::Contains("the run has 8"),
                       ConfigError);
}

TEST_CASE(
    "check_dealable: flush schedules of one stage per rank only, each refusal naming the fix") {
  Plan plan;
  plan.workers = 3;
  plan.stages = {PlanStage{.begin = 0, .end = 1, .replicas = 2, .ranks = {0, 1}},
                 PlanStage{.begin = 1, .end = 2, .replicas = 1, .ranks = {2}}};
  for (const char* name : {"gpipe", "1f1b-flush", "zb-h1"})
    CHECK_NOTHROW(check_dealable(plan, name));
  for (const char* name : {"1f1b-stash", "2bw"})
    CHECK_THROWS_WITH_AS(check_dealable(plan, name), doctest::Contains("add --schedule 1f1b-flush"),
                         ConfigError);
  Plan interleaved = plan;
  interleaved.virtual_stages = 2;
  CHECK_THROWS_WITH_AS(check_dealable(interleaved, "1f1b-flush"),
                       doctest::Contains("plan without --virtual-stages"), ConfigError);
}

TEST_CASE("SpeedRebalancer: every rank gets every rank's smoothed seconds per microbatch") {
  const int n = 3;
  std::mutex mutex;
  std::vector<std::vector<double>> seen(n);
  run_local(n, [&](Communicator& comm) {
    SpeedRebalancer rebalancer(comm, 0.5);
    CHECK(rebalancer.seconds_per_microbatch().empty());
    TrainResult r;
    // Rank k: (k + 1) ms per microbatch over 10 forwards; rank 2 ran none in the first segment.
    r.forwards = comm.rank() == 2 ? 0 : 10;
    r.compute_seconds = comm.rank() == 2 ? 0 : 10 * (comm.rank() + 1) * 1e-3;
    rebalancer.observe(r);
    const auto first = rebalancer.seconds_per_microbatch();
    CHECK(first[0] == doctest::Approx(1e-3));
    CHECK(first[1] == doctest::Approx(2e-3));
    CHECK(first[2] == doctest::Approx(1e-3));  // not measured: counted as the fastest
    // Second segment: rank 0 slows to 3 ms; the estimate moves halfway.
    r.forwards = 10;
    r.compute_seconds = 10 * (comm.rank() == 0 ? 3e-3 : (comm.rank() + 1) * 1e-3);
    rebalancer.observe(r);
    std::lock_guard<std::mutex> lock(mutex);
    seen[static_cast<std::size_t>(comm.rank())] = rebalancer.seconds_per_microbatch();
  });
  for (int k = 1; k < n; ++k) CHECK(seen[k] == seen[0]);
  CHECK(seen[0][0] == doctest::Approx(2e-3));
  CHECK(seen[0][1] == doctest::Approx(2e-3));
  CHECK(seen[0][2] == doctest::Approx(2e-3));
  run_local(1,
            [](Communicator& comm) { CHECK_THROWS_AS(SpeedRebalancer(comm, 0.0), ConfigError); });
}

}  // namespace test_dealing
