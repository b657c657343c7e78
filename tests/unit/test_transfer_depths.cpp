// In-flight counts that hide transfers: over slow links a 1F1B-stash pipeline must keep more
// minibatches in flight than PipeDream's count (which assumes free messages) or it waits on its
// own round trips. The partitioner charges the deeper counts where they fit
// (stash_in_flights with transfers), the generator runs them (planned_warmups, and the stash
// shape search timed on the plan's own stage times and messages), and the trainers ask for the
// schedule the simulator timed (take_plan_hints).
#include <pipeline/plan/cost_model.hpp>
#include <pipeline/plan/partition.hpp>
#include <pipeline/runtime/pipeline_setup.hpp>
#include <pipeline/runtime/stage_executor.hpp>
#include <pipeline/schedule/generator.hpp>
#include <pipeline/schedule/simulator.hpp>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "support/uniform_profile.hpp"

namespace test_transfer_depths {

using namespace pipeline;

namespace {

// VGG-16 at batch 128 as PipeDream's published profile has it (vgg16/graph.txt): per layer the
// forward and backward milliseconds, output bytes and parameter bytes.
Profile vgg16_profile() {
  struct Row {
    double forward_ms, backward_ms;
    std::int64_t output, parameters;
  };
  static const Row rows[] = {{22.307, 24.613, 1644167168, 7168},
                             {4.446, 5.553, 1644167168, 0},
                             {46.201, 113.33, 1644167168, 147712},
                             {4.455, 5.311, 1644167168, 0},
                             {3.795, 5.579, 411041792, 0},
                             {15.155, 39.648, 822083584, 295424},
                             {2.359, 2.738, 822083584, 0},
                             {22.062, 53.379, 822083584, 590336},
                             {2.513, 2.62, 822083584, 0},
                             {2.211, 2.788, 205520896, 0},
                             {10.814, 18.335, 411041792, 1180672},
                             {1.377, 1.38, 411041792, 0},
                             {17.458, 27.023, 411041792, 2360320},
                             {1.64, 1.463, 411041792, 0},
                             {14.245, 33.888, 411041792, 2360320},
                             {1.549, 1.321, 411041792, 0},
                             {1.169, 1.513, 102760448, 0},
                             {9.249, 14.574, 205520896, 4720640},
                             {1.026, 0.696, 205520896, 0},
                             {15.359, 21.9, 205520896, 9439232},
                             {0.848, 0.679, 205520896, 0},
                             {11.775, 28.67, 205520896, 9439232},
                             {0.881, 0.642, 205520896, 0},
                             {0.802, 0.781, 51380224, 0},
                             {5.608, 7.381, 51380224, 9439232},
                             {0.784, 0.266, 51380224, 0},
                             {4.07, 7.396, 51380224, 9439232},
                             {0.463, 0.19, 51380224, 0},
                             {4.042, 8.648, 51380224, 9439232},
                             {0.455, 0.175, 51380224, 0},
                             {0.553, 0.234, 12845056, 0},
                             {0, 0, 4, 0},
                             {0, 0, 12845056, 0},
                             {2.475, 4.575, 2097152, 411058176},
                             {0.377, 0.03, 2097152, 0},
                             {0, 0, 2097152, 0},
                             {0.709, 0.734, 2097152, 67125248},
                             {0.277, 0.032, 2097152, 0},
                             {0, 0, 2097152, 0},
                             {0.393, 0.548, 512000, 16388000}};
  Profile p;
  p.model = "vgg16";
  p.batch_size = 128;
  int i = 0;
  for (const Row& r : rows) {
    LayerProfile l;
    l.name = fmt::format("layer{}", i++);
    l.forward_s = r.forward_ms * 1e-3;
    l.backward_s = r.backward_ms * 1e-3;
    l.output_bytes = r.output;
    l.parameter_bytes = r.parameters;
    p.layers.push_back(l);
  }
  return p;
}

// The plan's 1F1B-stash schedule simulated as the CLI does (overlapping allreduces), over
// enough minibatches for its steady state.
Simulation run(const Plan& plan, const Profile& profile, const Topology& topology) {
  int lcm = 1;
  for (const PlanStage& s : plan.stages) lcm = std::lcm(lcm, s.replicas);
  const int minibatches = lcm * ((64 * plan.workers + lcm - 1) / lcm);
  SimulateOptions options;
  options.overlap_allreduce = true;
  return simulate(generate_schedule("1f1b-stash", ScheduleSpec::from_plan(plan, 1, minibatches)),
                  profile, plan, topology, options);
}

// PipeDream's counts: what the plan held before the counts took transfers into account.
Plan with_pipedream_counts(Plan plan) {
  std::vector<int> replicas = plan.replica_counts();
  const std::vector<int> counts = stash_in_flights(plan.workers, replicas);
  for (std::size_t s = 0; s < plan.stages.size(); ++s) plan.stages[s].in_flight = counts[s];
  plan.in_flight = counts.front();
  return plan;
}

void check_memory_as_planned(const Plan& plan, const Simulation& sim) {
  for (const PlanStage& s : plan.stages)
    for (int r : s.ranks) {
      CAPTURE(r);
      CHECK(static_cast<double>(sim.ranks[static_cast<std::size_t>(r)].peak_memory_bytes) <=
            s.memory_bytes * (1 + 1e-9));
    }
}

}  // namespace

TEST_CASE("on free links and balanced stages the counts with transfers are PipeDream's") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int stages = 1 + static_cast<int>(rng() % 6);
    std::vector<int> replicas;
    std::vector<double> seconds, messages(static_cast<std::size_t>(stages), 0.0);
    int workers = 0;
    for (int s = 0; s < stages; ++s) {
      replicas.push_back(1 + static_cast<int>(rng() % 4));
      workers += replicas.back();
      seconds.push_back(0.01 * replicas.back());  // every stage 10 ms per minibatch
    }
    CAPTURE(replicas);
    CHECK(stash_in_flights(workers, replicas, seconds, messages, 0.01) ==
          stash_in_flights(workers, replicas));
    // Stages faster than the period need no more either.
    for (double& t : seconds) t *= 0.5;
    CHECK(stash_in_flights(workers, replicas, seconds, messages, 0.01) ==
          stash_in_flights(workers, replicas));
    // Messages of two periods: never fewer, and more at the input stage of every pipeline of
    // several stages (its loop to the next stage and back takes 4 periods more).
    for (double& m : messages) m = 0.02;
    const std::vector<int> slow = stash_in_flights(workers, replicas, seconds, messages, 0.01);
    const std::vector<int> free = stash_in_flights(workers, replicas);
    for (int s = 0; s < stages; ++s) CHECK(slow[s] >= free[s]);
    if (stages > 1 && replicas[0] == 1) CHECK(slow[0] > free[0]);
  }
}

TEST_CASE("with replicas each loop fits in the minibatches a replica holds") {
  // mlp on 4 workers at 1 Gbit/s, 1-2-1 (the partitioner's plan): 0.897, 0.008 and 0.456 ms of
  // compute per minibatch on a replica, a period of 1.049 ms (the transfers), messages of
  // 1.049 ms at a link's whole bandwidth, 2.098 ms on a pair's half of it.
  const std::vector<int> replicas{1, 2, 1};
  const std::vector<double> seconds{0.897e-3, 0.008e-3, 0.456e-3}, messages{0, 1.049e-3, 1.049e-3};
  // Stage 1's loop to stage 2 and back: 0.464 + 2 · 2.098 ms, 5 periods, over its 2 replicas:
  // 3. Stage 0's loop to stage 2: 1.361 + 4 · 2.098 ms, 10 periods; to stage 1: 5 periods after
  // the (3 − 1) · 2 stage 1 holds its minibatches: 9.
  CHECK(stash_in_flights(4, replicas, seconds, messages, 1.049e-3) == std::vector<int>{10, 3, 1});
  CHECK(stash_in_flights(4, replicas) == std::vector<int>{5, 3, 1});
}

TEST_CASE("over a slow link replicated plans run at the partitioner's rate") {
  // Six equal layers of 0.6 ms on 4 workers at 1 Gbit/s, a replicated stage after the first
  // and at it: a message takes 1.05 ms at a link's whole bandwidth, 2.1 ms on a pair's share,
  // against a period of 1.8 ms.
  const Profile profile = testing::uniform_profile(6, 0.0002, 0.0004, 1 << 16, 1000);
  for (const char* stages : {"0:3,3:4x2,4:6", "0:2x2,2:5,5:6"}) {
    CAPTURE(stages);
    const Topology topology{{{4, 1.25e8}}, {}};
    const Plan plan = evaluate_stages(profile, topology, parse_manual_stages(stages));
    const Simulation sim = run(plan, profile, topology);
    const Simulation before = run(with_pipedream_counts(plan), profile, topology);
    MESSAGE(fmt::format(
        "config {}: in flight {}, simulated {:.3f}x the predicted rate "
        "(the counts without messages: {:.3f}x)",
        plan.config, plan.in_flight, plan.predicted.time_per_minibatch_s / sim.time_per_minibatch_s,
        plan.predicted.time_per_minibatch_s / before.time_per_minibatch_s));
    CHECK(sim.time_per_minibatch_s <= plan.predicted.time_per_minibatch_s * (1 + 5e-3));
    CHECK(before.time_per_minibatch_s > 1.2 * sim.time_per_minibatch_s);
    check_memory_as_planned(plan, sim);
  }
}

TEST_CASE("without replicas each loop between two stages fits in its minibatches in flight") {
  // VGG-16's four stages at 1.25 GB/s (below): 381, 133, 24 and 134 ms per minibatch, messages
  // of 329, 164 and 329 ms into stages 1-3, the first stage the bottleneck.
  const std::vector<int> replicas{1, 1, 1, 1};
  const std::vector<double> seconds{0.381, 0.133, 0.024, 0.134}, messages{0, 0.329, 0.164, 0.329};
  // Loops: 0-1 takes 381 + 133 + 2·329 ms = 3.1 periods, so 4 minibatches, depths 3 apart;
  // 1-3 3.4 periods over 1-2's 2; 0-3 6.1 periods, so 7 in flight at the first stage.
  CHECK(stash_in_flights(4, replicas, seconds, messages, 0.381) == std::vector<int>{7, 4, 3, 1});
  CHECK(stash_in_flights(4, replicas) == std::vector<int>{4, 3, 2, 1});
}

TEST_CASE("over a slow link the partitioner's plans run at its rate under their deeper counts") {
  const Profile profile = vgg16_profile();
  for (int workers : {4, 8}) {
    for (bool straight : {true, false}) {
      CAPTURE(workers);
      CAPTURE(straight);
      const Topology topology{{{workers, 1.25e9}}, {}};
      PartitionOptions options;
      options.straight = straight;
      const Plan plan = partition(profile, topology, options);
      CAPTURE(plan.config);
      const Simulation sim = run(plan, profile, topology);
      const Simulation before = run(with_pipedream_counts(plan), profile, topology);
      const double predicted = plan.predicted.time_per_minibatch_s;
      MESSAGE(
          fmt::format("{} workers, config {}: in flight {}, simulated {:.3f}x the predicted "
                      "rate (PipeDream's counts: {:.3f}x)",
                      workers, plan.config, plan.in_flight, predicted / sim.time_per_minibatch_s,
                      predicted / before.time_per_minibatch_s));
      // Straight: exactly the prediction (to the 0.1% of whole periods the counts round off),
      // which PipeDream's counts miss by far; with replicas PipeDream's counts, the shape that
      // the search times on the plan's own stages and links reaching at least the prediction
      // (their overlapped allreduces may beat the sum the partitioner charges).
      CHECK(sim.time_per_minibatch_s <= predicted * (1 + 1e-3));
      if (straight) {
        CHECK(plan.in_flight > with_pipedream_counts(plan).in_flight);
        // The least staleness, asked for: PipeDream's counts.
        PartitionOptions least = options;
        least.pipedream_in_flight = true;
        const Plan pd = partition(profile, topology, least);
        CHECK(pd.config == plan.config);
        CHECK(pd.in_flight == with_pipedream_counts(plan).in_flight);
        CHECK(before.time_per_minibatch_s > 1.2 * sim.time_per_minibatch_s);
      } else {
        CHECK(plan.in_flight == with_pipedream_counts(plan).in_flight);
      }
      check_memory_as_planned(plan, sim);
    }
  }
}

TEST_CASE("under a memory limit the counts go only as deep as the stage fits") {
  const Profile profile = vgg16_profile();
  Topology topology{{{4, 1.25e9}}, {}};
  PartitionOptions options;
  options.straight = true;
  options.recompute = Recompute::None;
  const Plan free = partition(profile, topology, options);
  REQUIRE(free.stages.front().in_flight == 7);
  // Room for the first stage's 5 minibatches, not 6 or 7: its bytes at PipeDream's 4 (on free
  // links) and at 7, a minibatch a third of the difference.
  const auto stages = parse_manual_stages("0:10,10:17,17:18,18:40");
  const Plan deep = evaluate_stages(profile, topology, stages, options);
  const Plan shallow = evaluate_stages(profile, Topology{{{4, 1e18}}, {}}, stages, options);
  REQUIRE(deep.stages.front().in_flight == 7);
  REQUIRE(shallow.stages.front().in_flight == 4);
  const double one = (deep.stages.front().memory_bytes - shallow.stages.front().memory_bytes) / 3;
  REQUIRE(one > 0);
  topology.memory_bytes_per_worker = deep.stages.front().memory_bytes - 1.5 * one;
  const Plan limited = evaluate_stages(profile, topology, stages, options);
  CHECK(limited.stages.front().in_flight == 5);
  CHECK(!limited.stages.front().recompute);
  for (const PlanStage& s : limited.stages)
    CHECK(s.memory_bytes <= *topology.memory_bytes_per_worker);
  const Simulation sim = run(limited, profile, topology);
  check_memory_as_planned(limited, sim);
}

TEST_CASE("the trainers ask for the schedule the simulator times for the plan") {
  const Profile profile = vgg16_profile();
  const Topology topology{{{4, 1.25e9}}, {}};
  Plan plan = partition(profile, topology, PartitionOptions{});
  REQUIRE(plan.config == "3-1");
  // And as a plan whose memory allowed only PipeDream's counts and no delayed allreduces.
  Plan shallow = with_pipedream_counts(plan);
  for (PlanStage& s : shallow.stages) s.delay_allreduce = s.replicas == 1;
  for (const Plan* p : {&plan, &shallow}) {
    PipelineLayout layout;
    for (const PlanStage& s : p->stages) {
      layout.stages.push_back({s.begin, s.end});
      layout.stage_ranks.push_back(s.ranks);
    }
    ScheduleRequest request;
    take_plan_hints(request, *p);
    const Schedule trained = make_schedule(request, layout, 12);
    const Schedule timed = generate_schedule("1f1b-stash", ScheduleSpec::from_plan(*p, 1, 12));
    CHECK(trained.ranks == timed.ranks);
  }
}

}  // namespace test_transfer_depths
