// Plans the partitioner emits for random models and clusters (tests/support/random_plans.hpp:
// replicated, interleaved and recomputing stages), trained in one process on one GPU, each rank a
// thread with its own stream: flush schedules equal sequential training on the same GPU, 2BW the
// reference of double-buffered weights and 1F1B-stash that of weight stashing (both on the CPU),
// to fp32 rounding.
#include <doctest/doctest.h>

#include <pipeline/core/rng.hpp>
#include <pipeline/schedule/generator.hpp>

#include "support/random_plans.hpp"

#include <string>

namespace test_gpu_plans {

using namespace pipeline;
using namespace pipeline::testing;

namespace {

constexpr float kLr = 0.05f;
constexpr std::uint64_t kSeed = 5;
const Device kGpu = Device::cuda(0);

}  // namespace

TEST_CASE("random partitioner plans train on one GPU like their references") {
  Rng rng(2027, "gpu-plans");
  for (int trial = 0; trial < 10; ++trial) {
    CAPTURE(trial);
    const RandomPlan c = random_plan(rng, kSeed);
    CAPTURE(c.describe());
    const Sequential model = c.model(0.2f);
    const PipelineLayout layout = PipelineLayout::from_plan(c.plan, model);

    const int minibatches = 2, micro = c.flush_microbatches;
    CAPTURE(micro);
    const ModelParams want = sequential_run(c, model, minibatches, micro, kSeed, kLr, kGpu);
    for (const std::string& name : flush_schedules(c.plan)) {
      CAPTURE(name);
      const Schedule s =
          generate_schedule(name, ScheduleSpec::from_plan(c.plan, micro, minibatches));
      check_stages(train_in_process(c, model, layout, s, kSeed, kLr, kGpu), want, layout, 1e-5);
    }

    if (c.plan.virtual_stages > 1) continue;
    // 2BW and 1F1B-stash against their references, which run on the CPU: fp32 rounding apart.
    for (const ReferenceRun& run : {two_buffered_run(c, micro, minibatches + 2, kSeed, kLr),
                                    stash_run(c, layout, kSeed, kLr)})
      check_stages(train_in_process(c, run.model, layout, run.schedule, kSeed, kLr, kGpu), run.want,
                   layout, 1e-4);
  }
}

}  // namespace test_gpu_plans
