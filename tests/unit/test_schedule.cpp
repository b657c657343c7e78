#include <pipeline/schedule/generator.hpp>
#include <pipeline/schedule/schedule.hpp>
#include <pipeline/schedule/schedules/gpipe.hpp>
#include <pipeline/schedule/schedules/one_f_one_b.hpp>
#include <pipeline/schedule/schedules/two_buffered.hpp>
#include <pipeline/schedule/schedules/zero_bubble.hpp>
#include <pipeline/schedule/validate.hpp>

#include <doctest/doctest.h>

#include <algorithm>

namespace test_schedule {

using namespace pipeline;

namespace {

std::vector<Action> compute_only(const std::vector<Action>& actions) {
  std::vector<Action> out;
  for (auto& a : actions)
    if (is_compute(a.kind)) out.push_back(a);
  return out;
}

int count(const std::vector<Action>& actions, ActionKind kind) {
  return static_cast<int>(std::count_if(actions.begin(), actions.end(),
                                        [&](const Action& a) { return a.kind == kind; }));
}

}  // namespace

TEST_CASE("action tokens round-trip and bad tokens are named") {
  for (const char* t :
       {"0F3", "12B0", "2I5", "2W5", "0SA3@1", "1RA3@0", "1SG3@0", "0RG3@1", "0AR2", "3ST10"})
    CHECK(to_string(parse_action(t)) == t);
  Action a = parse_action("0SA3@1");
  CHECK(a.kind == ActionKind::SendActivation);
  CHECK(a.stage == 0);
  CHECK(a.microbatch == 3);
  CHECK(a.peer == 1);
  CHECK_THROWS_WITH_AS(parse_action("0X3"), doctest::Contains("unknown code 'X'"), ConfigError);
  CHECK_THROWS_WITH_AS(parse_action("0SA3"), doctest::Contains("peer rank"), ConfigError);
  CHECK_THROWS_WITH_AS(parse_action("F3"), doctest::Contains("stage number"), ConfigError);
  CHECK_THROWS_WITH_AS(parse_action("0F"), doctest::Contains("no microbatch"), ConfigError);
  CHECK_THROWS_WITH_AS(parse_action("0F3x"), doctest::Contains("trailing"), ConfigError);
  CHECK(parse_actions(" 0F0  0F1\t0B0 ").size() == 3);
  CHECK(to_string(parse_actions("0F0 0SA0@1")) == "0F0 0SA0@1");
}

TEST_CASE("1F1B-flush on 4 stages: warm-up, steady 1F1B and cool-down, with communication") {
  Schedule s = one_f_one_b_flush_schedule(ScheduleSpec::straight(4, 8));
  CHECK(to_string(compute_only(s.ranks[0])) ==
        "0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0F6 0B3 0F7 0B4 0B5 0B6 0B7");
  CHECK(to_string(compute_only(s.ranks[3])) ==
        "3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5 3F6 3B6 3F7 3B7");
  // Communication inserted right around the compute that needs it.
  CHECK(to_string(std::vector<Action>(s.ranks[1].begin(), s.ranks[1].begin() + 3)) ==
        "1RA0@0 1F0 1SA0@2");
  CHECK(s.ranks[0].back() == Action{ActionKind::Step, 0, 0, -1});
  CHECK(count(s.ranks[0], ActionKind::AllReduce) == 0);
  validate(s);
}

TEST_CASE("1F1B keeps at most p - s activations in flight at stage s, GPipe keeps m") {
  for (int p : {1, 2, 4, 7}) {
    for (int m : {1, 3, 8, 16}) {
      CAPTURE(p);
      CAPTURE(m);
      auto spec = ScheduleSpec::straight(p, m, 2);
      ValidationReport flush = validate(one_f_one_b_flush_schedule(spec));
      ValidationReport gpipe = validate(gpipe_schedule(spec));
      for (int s = 0; s < p; ++s) {
        CHECK(flush.ranks[s].peak_activations == std::min(p - s, m));
        CHECK(gpipe.ranks[s].peak_activations == m);
        CHECK(flush.ranks[s].peak_weight_versions == 1);
        CHECK(gpipe.ranks[s].peak_weight_versions == 1);
      }
    }
  }
}

TEST_CASE("ZB-H1: I's in 1F1B order, stage s defers s W's, every stage holds p microbatches") {
  const int p = 4, m = 8;
  Schedule s = zero_bubble_h1_schedule(ScheduleSpec::straight(p, m, 2));
  CHECK(s.name == "zb-h1");
  CHECK(s.policy == UpdatePolicy::Flush);
  ValidationReport rep = validate(s);
  for (int st = 0; st < p; ++st) {
    CAPTURE(st);
    CHECK(rep.ranks[st].peak_activations == p);
    const std::vector<Action> compute = compute_only(s.ranks[st]);
    CHECK(count(s.ranks[st], ActionKind::Backward) == 0);
    CHECK(count(s.ranks[st], ActionKind::BackwardInput) == 2 * m);
    CHECK(count(s.ranks[st], ActionKind::BackwardWeight) == 2 * m);
    // Forwards and I's alone are 1F1B's order: p - 1 - s warm-up forwards, then F I pairs.
    std::vector<Action> no_w;
    for (auto& a : compute)
      if (a.kind != ActionKind::BackwardWeight) no_w.push_back(a);
    for (int k = 0; k < p - 1 - st; ++k) CHECK(no_w[k] == forward(st, k));
    CHECK(no_w[p - 1 - st] == forward(st, p - 1 - st));
    CHECK(no_w[p - st] == Action{ActionKind::BackwardInput, st, 0, -1});
    // In the steady state the W's run `st` microbatches behind the I's.
    std::vector<int> pending;
    for (auto& a : compute) {
      if (a.kind == ActionKind::BackwardInput) pending.push_back(a.microbatch);
      if (a.kind == ActionKind::BackwardWeight) {
        CHECK(a.microbatch == pending.front());
        pending.erase(pending.begin());
        const bool draining = a.microbatch % m >= m - st;  // the minibatch's last W's
        if (!draining) CHECK(static_cast<int>(pending.size()) == st);
      }
    }
  }
  // The last W of a minibatch comes before its step.
  const auto& last = s.ranks[p - 1];
  auto step = std::find(last.begin(), last.end(), Action{ActionKind::Step, p - 1, 0, -1});
  CHECK(*(step - 1) == Action{ActionKind::BackwardWeight, p - 1, m - 1, -1});
}

TEST_CASE("2BW: 1F1B without flushes, a step per minibatch, two weight versions") {
  const int p = 4, m = 4, n = 5;
  Schedule s = two_buffered_schedule(ScheduleSpec::straight(p, m, n));
  CHECK(s.name == "2bw");
  CHECK(s.policy == UpdatePolicy::DoubleBuffered);
  ValidationReport rep = validate(s);
  for (int st = 0; st < p; ++st) {
    CAPTURE(st);
    const auto& acts = s.ranks[st];
    CHECK(count(acts, ActionKind::Step) == n);
    CHECK(rep.ranks[st].peak_activations == p - st);
    CHECK(rep.ranks[st].peak_weight_versions <= 2);
    // Step k comes right after the backward of minibatch k's last microbatch.
    std::vector<Action> no_steps;
    for (auto& a : acts)
      if (a.kind == ActionKind::Step) CHECK(no_steps.back() == backward(st, (a.microbatch + 1) * m - 1));
      else if (is_compute(a.kind)) no_steps.push_back(a);
  }
  // No flush: on the first stage the next minibatch's forwards run before the step.
  const auto& first = s.ranks[0];
  const auto step0 = std::find(first.begin(), first.end(), Action{ActionKind::Step, 0, 0, -1});
  CHECK(std::find(first.begin(), step0, forward(0, m)) != step0);
  CHECK(rep.ranks[0].peak_weight_versions == 2);
  // Too few microbatches for the warm-up: the first forward would need weights not made yet.
  CHECK_THROWS_WITH_AS(two_buffered_schedule(ScheduleSpec::straight(4, 2, 3)),
                       doctest::Contains("at least 3 microbatches"), ConfigError);
}

TEST_CASE("1F1B-stash keeps p - s weight versions at stage s (PipeDream's weight stashing)") {
  for (int p : {2, 4, 6}) {
    CAPTURE(p);
    auto spec = ScheduleSpec::straight(p, 1, 5 * p);
    Schedule s = one_f_one_b_stash_schedule(spec);
    CHECK(s.policy == UpdatePolicy::Stash);
    // A step after every backward.
    for (auto& r : s.ranks) CHECK(count(r, ActionKind::Step) == count(r, ActionKind::Backward));
    ValidationReport rep = validate(s);
    for (int st = 0; st < p; ++st) {
      CHECK(rep.ranks[st].peak_activations == p - st);
      CHECK(rep.ranks[st].peak_weight_versions == p - st);
    }
    // Vertical sync: stage s must also keep the versions between the one its oldest in-flight
    // minibatch uses (the input stage's, p - s steps older) and its newest, and, as the runtime's
    // store does, from the one its latest forward used on, which a later request may ask for
    // again until a newer one is asked for (during the warm-up they are): p + 1 at every stage,
    // as the executor holds (unit.test_recompute).
    spec.vertical_sync = true;
    ValidationReport vs = validate(one_f_one_b_stash_schedule(spec));
    for (int st = 0; st < p; ++st) {
      CHECK(vs.ranks[st].peak_activations == p - st);
      CHECK(vs.ranks[st].peak_weight_versions == p + 1);
    }
  }
}

TEST_CASE("1F1B-stash admits in_flight minibatches at the input stage") {
  auto spec = ScheduleSpec::straight(4, 1, 12);
  spec.in_flight = 2;
  ValidationReport rep = validate(one_f_one_b_stash_schedule(spec));
  CHECK(rep.ranks[0].peak_activations == 2);
  CHECK(rep.ranks[3].peak_activations == 1);
  CHECK_THROWS_AS(one_f_one_b_stash_schedule(ScheduleSpec::straight(4, 2, 4)), ConfigError);
}

TEST_CASE("replicated stages get minibatches round-robin and allreduce before each step") {
  // PipeDream's 2-1-1 configuration of 4 workers, and a few others.
  std::vector<std::vector<std::vector<int>>> configs = {{{0, 1}, {2}, {3}}, {{0}, {1, 2}, {3}},
                                                        {{0}, {1}, {2, 3}}, {{0, 1, 2}, {3}},
                                                        {{0, 1}, {2, 3}},   {{0, 1, 2, 3}}};
  for (auto& cfg : configs) {
    for (std::string name :
         {"gpipe", "1f1b-flush", "zb-h1", "2bw", "1f1b-stash", "1f1b-stash-vsync"}) {
      CAPTURE(name);
      ScheduleSpec spec;
      spec.stage_ranks = cfg;
      bool stash = name.find("stash") != std::string::npos;
      spec.microbatches = stash ? 1 : 6;
      spec.minibatches = stash ? 12 : 2;
      Schedule s = generate_schedule(name, spec);
      validate(s);
      for (int st = 0; st < s.num_stages(); ++st) {
        int r = s.replicas(st);
        for (int i = 0; i < r; ++i) {
          const auto& acts = s.ranks[cfg[st][i]];
          for (auto& a : acts)
            if (is_compute(a.kind)) CHECK(a.microbatch % r == i);
          CHECK(count(acts, ActionKind::AllReduce) == (r == 1 ? 0 : count(acts, ActionKind::Step)));
        }
      }
    }
  }
  ScheduleSpec uneven;
  uneven.stage_ranks = {{0, 1}, {2}};
  uneven.minibatches = 5;
  CHECK_THROWS_WITH_AS(one_f_one_b_stash_schedule(uneven), doctest::Contains("multiple of 2"),
                       ConfigError);
}

TEST_CASE("the registry names its generators and can be extended") {
  auto names = GeneratorRegistry::builtin().names();
  for (const char* n :
       {"gpipe", "1f1b-flush", "zb-h1", "2bw", "1f1b-stash", "1f1b-stash-vsync", "interleaved-1f1b"})
    CHECK(std::find(names.begin(), names.end(), n) != names.end());
  CHECK_THROWS_WITH_AS(generate_schedule("interleaved", ScheduleSpec::straight(2, 2)),
                       doctest::Contains("known schedules: 1f1b-flush"), ConfigError);
  GeneratorRegistry mine = GeneratorRegistry::builtin();
  mine.add("reverse-gpipe", [](const ScheduleSpec& spec) {
    Schedule s = gpipe_schedule(spec);
    s.name = "reverse-gpipe";
    return s;
  });
  CHECK(mine.generate("reverse-gpipe", ScheduleSpec::straight(3, 4)).name == "reverse-gpipe");
  CHECK_THROWS_AS(generate_schedule("gpipe", ScheduleSpec::straight(3, 0)), ConfigError);
  ScheduleSpec bad;
  bad.stage_ranks = {{0}, {0}};
  CHECK_THROWS_WITH_AS(gpipe_schedule(bad),
                       doctest::Contains("rank 0 is listed by stage 0 and stage 1"), ConfigError);
}

TEST_CASE("validation names the rank and the action") {
  Schedule s = one_f_one_b_flush_schedule(ScheduleSpec::straight(2, 2));
  SUBCASE("backward before its forward") {
    std::swap(s.ranks[1][1], s.ranks[1][2]);  // 1RA0@0 1F0 1B0 ... -> 1RA0@0 1B0 1F0
    CHECK_THROWS_WITH_AS(
        validate(s),
        doctest::Contains(
            "rank 1, action #1 `1B0`: backward of microbatch 0 on stage 1 before its forward"),
        ConfigError);
  }
  SUBCASE("missing receive") {
    auto& r1 = s.ranks[1];
    r1.erase(std::find(r1.begin(), r1.end(), parse_action("1RA1@0")));
    CHECK_THROWS_WITH_AS(validate(s),
                         doctest::Contains("`1F1`: forward of microbatch 1 on stage 1 before "
                                           "receiving its input (expected `1RA1@0`"),
                         ConfigError);
  }
  SUBCASE("wrong peer") {
    s.ranks[0][1].peer = 0;
    CHECK_THROWS_WITH_AS(validate(s),
                         doctest::Contains("rank 0, action #1 `0SA0@0`: the peer is rank 0"),
                         ConfigError);
  }
  SUBCASE("missing step") {
    s.ranks[0].pop_back();
    CHECK_THROWS_WITH_AS(validate(s), doctest::Contains("`0ST0` is missing"), ConfigError);
  }
  SUBCASE("deadlock") {
    // Rank 0 waits for the gradient of microbatch 0 before sending the activation of microbatch 1
    // that rank 1 needs first.
    s.ranks[1] = parse_actions("1RA1@0 1F1 1B1 1SG1@0 1RA0@0 1F0 1B0 1SG0@0 1ST0");
    s.ranks[0] = parse_actions("0F0 0SA0@1 0RG0@1 0B0 0F1 0SA1@1 0RG1@1 0B1 0ST0");
    CHECK_THROWS_WITH_AS(validate(s),
                         doctest::Contains("deadlock: rank 0 waits at action #2 `0RG0@1` for rank "
                                           "1; rank 1 waits at action #0 `1RA1@0` for rank 0"),
                         ConfigError);
  }
}

TEST_CASE("interleaved 1F1B: every rank's stages in groups of p microbatches, validated") {
  // p = 2 ranks, v = 2 stages each (stages 0, 2 on rank 0; 1, 3 on rank 1), m = 4.
  Schedule s = generate_schedule("interleaved-1f1b", ScheduleSpec::interleaved(2, 2, 4));
  CHECK(s.num_stages() == 4);
  CHECK(s.stage_ranks == std::vector<std::vector<int>>{{0}, {1}, {0}, {1}});
  // Rank 1: warm-up 2·0 + 1·2 = 2 forwards, then 1F1B; forwards take its stages in ascending
  // order, backwards in descending order (the last stage's backward comes first), p at a time.
  CHECK(to_string(compute_only(s.ranks[1])) ==
        "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3");
  // Rank 0: warm-up 2·1 + 1·2 = 4 forwards.
  CHECK(to_string(compute_only(s.ranks[0])) ==
        "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3");
  CHECK(count(s.ranks[0], ActionKind::Step) == 2);
  ValidationReport rep = validate(s);
  CHECK(rep.ranks[0].peak_activations == 5);
  CHECK(rep.ranks[1].peak_activations == 3);
  // A hand-edited copy where rank 1 starts a backward before the forward is rejected.
  Schedule bad = s;
  std::swap(bad.ranks[1][0], bad.ranks[1][6]);
  CHECK(!validation_error(bad).empty());

  CHECK_THROWS_WITH_AS(generate_schedule("interleaved-1f1b", ScheduleSpec::interleaved(2, 2, 3)),
                       doctest::Contains("multiple of 2; got 3"), ConfigError);
  // Which rank holds which place of the pipeline is the layout's to say.
  ScheduleSpec shuffled = ScheduleSpec::straight(3, 3);
  std::swap(shuffled.stage_ranks[1], shuffled.stage_ranks[2]);
  CHECK(validation_error(generate_schedule("interleaved-1f1b", shuffled)).empty());
  ScheduleSpec crossed = ScheduleSpec::interleaved(3, 2, 3);
  std::swap(crossed.stage_ranks[3], crossed.stage_ranks[4]);
  CHECK_THROWS_WITH_AS(generate_schedule("interleaved-1f1b", crossed),
                       doctest::Contains("stage k on the ranks of stage k mod 3"), ConfigError);
  ScheduleSpec uneven = ScheduleSpec::interleaved(2, 2, 4);
  uneven.stage_ranks.push_back({0});
  CHECK_THROWS_WITH_AS(generate_schedule("interleaved-1f1b", uneven),
                       doctest::Contains("5 stages on 2 ranks"), ConfigError);
}

TEST_CASE(
    "interleaved 1F1B over data-parallel pipelines: round-robin microbatches, allreduces before "
    "steps") {
  // p = 2 places, v = 2 stages each, r = 2 pipelines (ranks 0, 1 and 2, 3), m = 8: pipeline j
  // runs microbatches j, j + 2, ... in the order one pipeline runs its 4.
  const ScheduleSpec spec = ScheduleSpec::interleaved(2, 2, 8, 2, 2);
  CHECK(spec.stage_ranks == std::vector<std::vector<int>>{{0, 2}, {1, 3}, {0, 2}, {1, 3}});
  const Schedule s = generate_schedule("interleaved-1f1b", spec);
  CHECK(s.num_ranks() == 4);
  CHECK(to_string(compute_only(s.ranks[3])).substr(0, 39) ==
        "1F1 1F3 3F1 3B1 3F3 3B3 1F5 1B1 1F7 1B3");
  const auto& last = s.ranks[2];
  CHECK(to_string(std::vector<Action>(last.end() - 4, last.end())) == "0AR1 2AR1 0ST1 2ST1");
  CHECK(validation_error(s).empty());
  const ValidationReport rep = validate(s);
  CHECK(rep.ranks[0].peak_activations == 5);
  // Every microbatch runs once on each stage, on the pipeline round-robin gives it.
  for (int r = 0; r < 4; ++r)
    for (const Action& a : s.ranks[r])
      if (a.kind == ActionKind::Forward) CHECK(s.rank_of(a.stage, a.microbatch) == r);
  CHECK_THROWS_WITH_AS(
      generate_schedule("interleaved-1f1b", ScheduleSpec::interleaved(2, 2, 6, 1, 2)),
      doctest::Contains("multiple of 4; got 6"), ConfigError);
}

TEST_CASE("interleaved zero bubble: I in the backward's place, rank r's W's deferred by 2r") {
  // p = 2, v = 2, m = 4: rank 0 runs each W right after its I, rank 1 two I's later.
  const Schedule s = generate_schedule("interleaved-zb-h1", ScheduleSpec::interleaved(2, 2, 4));
  CHECK(to_string(compute_only(s.ranks[0])) ==
        "0F0 0F1 2F0 2F1 0F2 2I0 2W0 0F3 2I1 2W1 2F2 0I0 0W0 2F3 0I1 0W1 2I2 2W2 2I3 2W3 0I2 0W2 "
        "0I3 0W3");
  CHECK(to_string(compute_only(s.ranks[1])) ==
        "1F0 1F1 3F0 3I0 3F1 3I1 1F2 1I0 3W0 1F3 1I1 3W1 3F2 3I2 1W0 3F3 3I3 1W1 1I2 3W2 1I3 3W3 "
        "1W2 1W3");
  CHECK(validation_error(s).empty());
  // Over data-parallel pipelines too; a straight layout is refused as for interleaved 1F1B.
  CHECK(validation_error(
            generate_schedule("interleaved-zb-h1", ScheduleSpec::interleaved(3, 2, 12, 2, 2)))
            .empty());
  CHECK_THROWS_WITH_AS(generate_schedule("interleaved-zb-h1", ScheduleSpec::interleaved(2, 2, 3)),
                       doctest::Contains("multiple of 2; got 3"), ConfigError);
}

TEST_CASE("zb-v: a V of 2p stages, I before F before W, at most 2p stage activations a rank") {
  // p = 2: stages 0 and 3 on rank 0, 1 and 2 on rank 1; 4 microbatches. Rank 0 runs three
  // forwards before the first comes back (room for 4 activations, reserving none), then an I
  // whenever one is ready, a forward else, a W to fill; 25 ticks on unit times, the bound of
  // 6m + p - 1.
  const ScheduleSpec spec = ScheduleSpec::v_shape(2, 4);
  CHECK(spec.stage_ranks == std::vector<std::vector<int>>{{0}, {1}, {1}, {0}});
  const Schedule s = generate_schedule("zb-v", spec);
  CHECK(to_string(compute_only(s.ranks[0])) ==
        "0F0 0F1 0F2 3F0 3I0 3W0 3F1 0I0 3I1 0W0 3W1 0I1 0F3 3F2 3I2 0W1 3W2 0I2 0W2 3F3 3I3 3W3 "
        "0I3 0W3");
  // Stage 1's activation goes to stage 2 on the same rank.
  CHECK(to_string(std::vector<Action>(s.ranks[1].begin(), s.ranks[1].begin() + 5)) ==
        "1RA0@0 1F0 1SA0@1 2RA0@1 2F0");
  CHECK(validation_error(s).empty());
  // Every microbatch count, p = 2..6, on one pipeline or two: valid, and no rank holds more than
  // 2p stage activations (1F1B's peak on its first rank, as two half stages a microbatch).
  for (int p = 2; p <= 6; ++p)
    for (int m = 1; m <= 3 * p; ++m)
      for (int r : {1, 2}) {
        CAPTURE(p);
        CAPTURE(m);
        CAPTURE(r);
        const Schedule v = generate_schedule("zb-v", ScheduleSpec::v_shape(p, m * r, 2, r));
        REQUIRE(validation_error(v).empty());
        for (const auto& rank : validate(v).ranks) CHECK(rank.peak_activations <= 2 * p);
      }
  // Each layout runs under its own schedules.
  CHECK_THROWS_WITH_AS(generate_schedule("zb-v", ScheduleSpec::interleaved(2, 2, 4)),
                       doctest::Contains("zb-v runs a V-shape layout"), ConfigError);
  CHECK_THROWS_WITH_AS(generate_schedule("interleaved-1f1b", spec),
                       doctest::Contains("run them with zb-v"), ConfigError);
  CHECK_THROWS_WITH_AS(generate_schedule("zb-v", ScheduleSpec::v_shape(2, 1, 1, 2)),
                       doctest::Contains("at least 2 microbatches"), ConfigError);
}

}  // namespace test_schedule
