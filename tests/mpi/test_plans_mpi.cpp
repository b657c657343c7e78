// ranks: 3 4
// Plans the partitioner emits for random models on a cluster of the world's size
// (tests/support/random_plans.hpp: replicated, interleaved, mixed-worker and recomputing stages),
// trained over MPI, one process per stage replica: flush schedules equal the single process, 2BW
// the double-buffered reference and 1F1B-stash the weight-stashing reference, every rank's
// stages to 1e-5.
#include <doctest/doctest.h>

#include <pipeline/comm/comms/mpi.hpp>
#include <pipeline/core/threads.hpp>
#include <pipeline/runtime/stage_executor.hpp>
#include <pipeline/schedule/generator.hpp>

#include "support/param_compare.hpp"
#include "support/random_plans.hpp"

#include <string>

using namespace pipeline;
using namespace pipeline::testing;

namespace {

constexpr float kLr = 0.05f;
constexpr std::uint64_t kSeed = 5;

// Trains `schedule` on this rank and checks each of its stages against `want`.
void train_and_check(MpiCommunicator& comm, const RandomPlan& c, const Sequential& model,
                     const PipelineLayout& layout, const Schedule& schedule,
                     const ModelParams& want) {
  StageExecutor ex(model, c.sample(), DType::Float32, layout, comm, momentum_sgd(),
                   {.seed = kSeed, .recompute = c.recompute});
  ex.train(schedule, c.minibatches().feed(), 0, [](std::int64_t) { return kLr; });
  for (int stage : ex.stages()) {
    CAPTURE(stage);
    CHECK(max_rel_diff(ex.params(stage), want, layout.stages[static_cast<std::size_t>(stage)]) <=
          1e-5);
  }
}

}  // namespace

TEST_CASE("random partitioner plans train over MPI like their references") {
  set_num_threads(1);
  MpiCommunicator comm;
  comm.set_timeout(60);
  Rng rng(31 + static_cast<std::uint64_t>(comm.size()), "plans-mpi");  // the same on every rank
  for (int trial = 0; trial < 6; ++trial) {
    CAPTURE(trial);
    RandomPlan c = random_plan(rng, kSeed, comm.size());
    while (c.plan.workers != comm.size())  // a mixed cluster's plan may leave workers idle
      c = random_plan(rng, kSeed, comm.size());
    CAPTURE(c.describe());
    const Sequential model = c.model(0.2f);
    const PipelineLayout layout = PipelineLayout::from_plan(c.plan, model);

    const int minibatches = 2, micro = c.flush_microbatches;
    const ModelParams want = sequential_run(c, model, minibatches, micro, kSeed, kLr);
    for (const std::string& name : flush_schedules(c.plan)) {
      CAPTURE(name);
      train_and_check(comm, c, model, layout,
                      generate_schedule(name, ScheduleSpec::from_plan(c.plan, micro, minibatches)),
                      want);
    }
    if (c.plan.virtual_stages > 1) continue;

    for (const ReferenceRun& run : {two_buffered_run(c, micro, minibatches + 2, kSeed, kLr),
                                    stash_run(c, layout, kSeed, kLr)})
      train_and_check(comm, c, run.model, layout, run.schedule, run.want);
  }
  comm.barrier();
}
