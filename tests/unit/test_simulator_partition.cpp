// The simulator and the partitioner are two views of one cost model (plan/cost_model.hpp): plans
// made by pipeline::partition() for real and synthetic profiles, simulated under 1F1B with
// weight stashing, must run at the partitioner's predicted time per minibatch in the steady
// state — exactly where both model the same thing, and never faster where the simulator sees
// more (a transfer round trip that the warm-up depth cannot hide, replicas meeting at their
// allreduce).
#include <pipeline/plan/cost_model.hpp>
#include <pipeline/plan/partition.hpp>
#include <pipeline/profile/pipedream_graph.hpp>
#include <pipeline/schedule/generator.hpp>
#include <pipeline/schedule/simulator.hpp>

#include "../support/pipedream_profiles.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <numeric>

namespace test_simulator_partition {

using namespace pipeline;

namespace {

// A chain whose layers differ in cost, activations and weights, deterministic per seed.
Profile chain_profile(int layers, unsigned seed) {
  Profile p;
  p.model = fmt::format("chain{}", seed);
  p.batch_size = 32;
  unsigned x = seed * 2654435761u + 12345u;
  auto next = [&x] {
    x = x * 1664525u + 1013904223u;
    return static_cast<double>((x >> 8) & 0xffff) / 65536.0;
  };
  for (int i = 0; i < layers; ++i) {
    LayerProfile l;
    l.name = fmt::format("l{}", i);
    l.forward_s = 1e-3 * (0.2 + 2 * next());
    l.backward_s = l.forward_s * (1.5 + next());
    l.output_bytes = static_cast<std::int64_t>(1e6 * (0.1 + 4 * next()));
    l.parameter_bytes = static_cast<std::int64_t>(1e6 * (0.1 + 8 * next()));
    // Optimizer steps as a CPU pays them: a few passes over the weights, more for AdamW.
    const double pass = static_cast<double>(l.parameter_bytes) * 1e-11 * (0.5 + next());
    l.step_s = {.sgd = 3 * pass, .momentum = 5 * pass, .adamw = 7 * pass};
    p.layers.push_back(l);
  }
  return p;
}

// Minibatches to simulate: many per worker, a multiple of every stage's replica count (so the
// round-robin dealing pairs up the allreduces).
int minibatches_for(const Plan& plan) {
  int lcm = 1;
  for (const auto& s : plan.stages) lcm = std::lcm(lcm, s.replicas);
  return lcm * ((192 * plan.workers + lcm - 1) / lcm);
}

// Where a round trip sets the pace the pipeline settles into a pattern that repeats only every
// few minibatches, so the simulator's window of half the run's forwards can be off by a fraction
// of one such repeat: relative 1e-3 at ~200 minibatches per worker. Elsewhere it is exact.
constexpr double kRoundTripTolerance = 1e-3;

// The steady-state period of 1F1B-stash on a straight pipeline (one rank per stage) as the
// simulator's cost model has it: the slowest of
//  - each stage's compute per minibatch and each link's time per message (the partitioner's
//    per-stage terms: its prediction), and
//  - every round trip from stage s down to stage j and back: forwards s..j, backwards j..s and
//    the activation and gradient messages in between, shared by the w_s - w_j + 1 minibatches
//    that 1F1B keeps in flight over it (w: the warm-up depths, each stage's in-flight count less
//    one; PipeDream's p-1-s differ by j - s). The partitioner deepens the counts until these
//    loops fit in its period where the stages have the memory, so only where they do not can the
//    simulator be slower.
double straight_period(const Plan& plan, const Profile& profile, const Topology& topology) {
  const int p = plan.num_stages();
  std::vector<double> compute(static_cast<std::size_t>(p)),
      message(static_cast<std::size_t>(p), 0.0);
  for (int s = 0; s < p; ++s) {
    StageTiming t = stage_timing(profile, plan, s, 1.0);
    compute[static_cast<std::size_t>(s)] = t.forward_s + t.backward_s + t.step_s;
    if (s + 1 < p)
      message[static_cast<std::size_t>(s)] = transfer_time(
          static_cast<double>(t.output_bytes), 1,
          link_bandwidth(topology, plan.stages[s].ranks[0], plan.stages[s + 1].ranks[0]), 1.0);
  }
  const std::vector<int> warmups = detail::planned_warmups(ScheduleSpec::from_plan(plan, 1));
  double period = plan.predicted.time_per_minibatch_s;
  for (int s = 0; s < p; ++s) {
    double path = 0;
    for (int j = s; j < p; ++j) {
      path += compute[static_cast<std::size_t>(j)];
      if (j > s) path += 2 * message[static_cast<std::size_t>(j - 1)];
      const int held =
          warmups[static_cast<std::size_t>(s)] - warmups[static_cast<std::size_t>(j)] + 1;
      period = std::max(period, path / held);
    }
  }
  return period;
}

bool straight(const Plan& plan) {
  return std::all_of(plan.stages.begin(), plan.stages.end(),
                     [](const PlanStage& s) { return s.replicas == 1; });
}

struct Outcome {
  int equal = 0;       // simulator == partitioner
  int round_trip = 0;  // simulator == the round-trip bound > partitioner
  int replicated = 0;  // simulator >= partitioner with replicated stages
};

void check_plan(const Profile& profile, const Topology& topology, const PartitionOptions& options,
                Outcome& out) {
  Plan plan = partition(profile, topology, options);
  CAPTURE(plan.config);
  const double predicted = plan.predicted.time_per_minibatch_s;
  REQUIRE(predicted > 0);
  Schedule schedule =
      generate_schedule("1f1b-stash", ScheduleSpec::from_plan(plan, 1, minibatches_for(plan)));
  Simulation sim = simulate(schedule, profile, plan, topology);
  CAPTURE(predicted);
  CAPTURE(sim.time_per_minibatch_s);
  // Both count samples of the profile's batch per minibatch.
  CHECK(sim.samples_per_minibatch == profile.batch_size);
  if (straight(plan)) {
    const double bound = straight_period(plan, profile, topology);
    CAPTURE(bound);
    if (bound == predicted) {
      ++out.equal;
      CHECK(sim.time_per_minibatch_s == doctest::Approx(predicted).epsilon(1e-9));
      CHECK(sim.samples_per_s == doctest::Approx(plan.predicted.samples_per_s).epsilon(1e-9));
    } else {
      ++out.round_trip;
      CHECK(bound > predicted);
      CHECK(sim.time_per_minibatch_s == doctest::Approx(bound).epsilon(kRoundTripTolerance));
      // Without a memory limit the partitioner's in-flight counts hide every round trip but
      // for loops within 0.1% of whole periods (stash_in_flights with transfers).
      CHECK(bound <= predicted * (1 + 1e-3));
    }
  } else {
    // Replicas of a stage take turns (round robin) but must all reach each allreduce, and the
    // runtime's allreduce is a blocking collective; the partitioner's (T + sync) / r assumes
    // their turns never wait on each other. Never faster than the prediction.
    CHECK(sim.time_per_minibatch_s >= predicted * (1 - 1e-9));
    ++out.replicated;
    // Data parallelism alone (one stage) is exactly the partitioner's (T + sync) / r.
    if (plan.num_stages() == 1)
      CHECK(sim.time_per_minibatch_s == doctest::Approx(predicted).epsilon(1e-9));
  }
}

}  // namespace

TEST_CASE(
    "simulated steady state of partitioned synthetic chains equals the partitioner's prediction") {
  Outcome out;
  for (unsigned seed : {1u, 2u, 3u, 4u}) {
    Profile profile = chain_profile(12 + static_cast<int>(seed), seed);
    CAPTURE(seed);
    for (const std::vector<TopologyLevel>& levels :
         {std::vector<TopologyLevel>{{2, 1e10}}, std::vector<TopologyLevel>{{4, 1e10}},
          std::vector<TopologyLevel>{{4, 1e12}}, std::vector<TopologyLevel>{{6, 2e9}},
          std::vector<TopologyLevel>{{8, 1e11}}, std::vector<TopologyLevel>{{2, 1e11}, {3, 5e9}}}) {
      Topology topology{levels, {}};
      CAPTURE(topology.workers());
      for (bool no_replicas : {true, false})
        for (const char* optimizer : {"", "adamw"}) {
          CAPTURE(no_replicas);
          CAPTURE(optimizer);
          PartitionOptions options;
          options.straight = no_replicas;
          options.optimizer = optimizer;
          if (!no_replicas && levels.size() > 1) continue;  // hierarchical replication: below
          check_plan(profile, topology, options, out);
        }
    }
  }
  // The cases above include every kind of outcome.
  CHECK(out.equal > 0);
  CHECK(out.round_trip > 0);
  CHECK(out.replicated > 0);
}

TEST_CASE(
    "free transfers: the simulator equals the partitioner on straight pipelines, round trips "
    "included") {
  // Fast links make transfers negligible, so every round trip is a mean of stage times and the
  // bottleneck stage alone sets the pace.
  for (unsigned seed : {5u, 6u, 7u}) {
    Profile profile = chain_profile(16, seed);
    for (int workers : {2, 3, 5, 8}) {
      Topology topology{{{workers, 1e18}}, {}};
      PartitionOptions options;
      options.straight = true;
      Plan plan = partition(profile, topology, options);
      Simulation sim =
          simulate(generate_schedule("1f1b-stash", ScheduleSpec::from_plan(plan, 1, 48 * workers)),
                   profile, plan, topology);
      CAPTURE(seed);
      CAPTURE(workers);
      CHECK(sim.time_per_minibatch_s ==
            doctest::Approx(plan.predicted.time_per_minibatch_s).epsilon(1e-9));
      CHECK(sim.steady_state_bubble_fraction >= 0);
    }
  }
}

TEST_CASE("simulated steady state of partitioned PipeDream profiles agrees with the partitioner") {
  const std::string dir = testing::pipedream_profiles_dir();
  if (dir.empty()) {
    MESSAGE("shared/reference/pipedream-profiles not found; skipping");
    return;
  }
  Outcome out;
  int dag_stages = 0;
  for (const char* model : {"alexnet", "vgg16", "resnet18", "squeezenet1_0", "gnmt", "resnet50"}) {
    CAPTURE(model);
    Profile profile = read_pipedream_graph(dir + "/" + model + "/graph.txt");
    for (const std::vector<TopologyLevel>& levels :
         {std::vector<TopologyLevel>{{4, 1e10}}, std::vector<TopologyLevel>{{8, 1.25e9}},
          std::vector<TopologyLevel>{{4, 1e10}, {2, 1.25e9}}}) {
      Topology topology{levels, {}};
      CAPTURE(topology.workers());
      for (bool no_replicas : {true, false}) {
        if (!no_replicas && levels.size() > 1) continue;
        CAPTURE(no_replicas);
        PartitionOptions options;
        options.straight = no_replicas;
        check_plan(profile, topology, options, out);
        Plan plan = partition(profile, topology, options);
        for (const auto& s : plan.stages) dag_stages += s.layer_ids.empty() ? 0 : 1;
      }
    }
  }
  CHECK(out.equal + out.round_trip > 0);
  MESSAGE(fmt::format("{} equal, {} round-trip bound, {} replicated; {} stages not one layer range",
                      out.equal, out.round_trip, out.replicated, dag_stages));
}

}  // namespace test_simulator_partition
