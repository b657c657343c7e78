// Every plan the partitioner emits trains, the way a user reaches it: random MLPs and CNNs,
// profiles (measured bytes, random times) and cluster topologies (mixed ones too) are partitioned,
// the plan goes through plan.json and back, and each schedule kind generated from it validates,
// simulates and runs on the in-process communicator. Flush schedules (GPipe, 1F1B-flush, ZB-H1,
// interleaved 1F1B for interleaved plans, ZB-V for those in a V; replicas dealt microbatches
// round-robin or by random speeds) equal the single process with gradient accumulation; 2BW the
// reference of double-buffered weights; 1F1B-stash the independent reference of weight stashing
// with the plan's replicas, warm-ups and delays, with and without vertical sync; stages marked to
// recompute change nothing.
#include <doctest/doctest.h>

#include <pipeline/core/rng.hpp>
#include <pipeline/core/threads.hpp>
#include <pipeline/schedule/dealing.hpp>
#include <pipeline/schedule/generator.hpp>
#include <pipeline/schedule/simulator.hpp>
#include <pipeline/schedule/validate.hpp>

#include "support/random_plans.hpp"

#include <string>
#include <vector>

namespace test_plans_train {

using namespace pipeline;
using namespace pipeline::testing;

namespace {

constexpr float kLr = 0.05f;
constexpr std::uint64_t kSeed = 5;

}  // namespace

TEST_CASE("random partitioner plans schedule, validate, simulate and train like their references") {
  set_num_threads(1);
  Rng rng(2026, "plans-train");
  int cnns = 0, replicated = 0, interleaved = 0, mixed = 0, recomputing = 0, dealt = 0,
      two_buffered = 0, data_parallel_interleaved = 0, v_shaped = 0, for_flush = 0, idle = 0;
  for (int trial = 0; trial < 40; ++trial) {
    CAPTURE(trial);
    const RandomPlan c = random_plan(rng, kSeed);
    CAPTURE(c.workers);
    CAPTURE(c.describe());
    cnns += c.cnn;
    replicated += c.max_replicas() > 1;
    interleaved += c.plan.virtual_stages > 1;
    data_parallel_interleaved += c.plan.virtual_stages > 1 && c.max_replicas() > 1;
    v_shaped += placement_of(c.plan) == StagePlacement::V;
    for_flush += c.plan.microbatches > 0;
    mixed += !c.typed_profiles.empty();
    idle += c.typed_profiles.empty() && c.idle_workers > 0;
    recomputing += c.recomputes();
    const Sequential model = c.model(0.2f);
    const PipelineLayout layout = PipelineLayout::from_plan(c.plan, model);

    // Flush schedules against the single process.
    const int minibatches = 2, micro = c.flush_microbatches;
    CAPTURE(micro);
    const ModelParams want = sequential_run(c, model, minibatches, micro, kSeed, kLr);
    for (const std::string& name : flush_schedules(c.plan)) {
      CAPTURE(name);
      ScheduleSpec spec = ScheduleSpec::from_plan(c.plan, micro, minibatches);
      // Replicas of random speeds get microbatches by speed (as --rebalance deals them) on every
      // other plan with a replicated stage: the same minibatch gradients.
      if (c.max_replicas() > 1 && c.plan.virtual_stages == 1 && trial % 2 == 0) {
        std::vector<double> seconds;
        for (int r = 0; r < c.plan.workers; ++r) seconds.push_back(1.0 + rng.below(4));
        spec.dealing = dealing_by_speed(spec, seconds);
        dealt += !spec.dealing.empty();
      }
      const Schedule s = generate_schedule(name, spec);
      CHECK(validation_error(s).empty());
      CHECK(c.simulate_schedule(s).samples_per_s > 0);
      check_stages(train_in_process(c, model, layout, s, kSeed, kLr), want, layout, 1e-5);
    }

    if (c.plan.virtual_stages > 1) continue;
    // 2BW with the fewest microbatches it admits for the plan, and 1F1B-stash with the plan's own
    // in-flight counts, against their weight-versioning references.
    const ReferenceRun two = two_buffered_run(c, micro, minibatches + 2, kSeed, kLr);
    const ReferenceRun stash = stash_run(c, layout, kSeed, kLr);
    for (const ReferenceRun* run : {&two, &stash}) {
      const Schedule& s = run->schedule;
      CAPTURE(s.name);
      CAPTURE(s.microbatches);
      CAPTURE(c.vertical_sync);
      CHECK(validation_error(s).empty());
      CHECK(c.simulate_schedule(s).samples_per_s > 0);
      check_stages(train_in_process(c, run->model, layout, s, kSeed, kLr), run->want, layout, 1e-5);
    }
    ++two_buffered;
  }
  MESSAGE("plans of CNNs: " << cnns << ", with replicated stages: " << replicated
                            << ", interleaved: " << interleaved
                            << " (over data-parallel pipelines: " << data_parallel_interleaved
                            << ", in a V: " << v_shaped << "), on mixed workers: " << mixed
                            << ", with recomputing stages: " << recomputing
                            << "; flush schedules dealt by speed: " << dealt << ", 2bw runs: "
                            << two_buffered << "; planned for a flush schedule: " << for_flush
                            << ", leaving workers idle: " << idle);
  CHECK(cnns > 0);
  CHECK(replicated > 0);
  CHECK(interleaved > 0);
  CHECK(data_parallel_interleaved > 0);
  CHECK(v_shaped > 0);
  CHECK(mixed > 0);
  CHECK(recomputing > 0);
  CHECK(dealt > 0);
  CHECK(two_buffered > 0);
  CHECK(for_flush > 0);
  CHECK(idle > 0);
}

}  // namespace test_plans_train
