// Plans the partitioner emits for random models and clusters (tests/support/random_plans.hpp:
// replicated, interleaved and recomputing stages), trained in one process on one GPU, each rank a
// thread with its own stream: flush schedules equal sequential training on the same GPU, 2BW the
// reference of double-buffered weights and 1F1B-stash that of weight stashing (both on the CPU),
// to fp32 rounding.
#include <doctest/doctest.h>

#include <pipeline/core/rng.hpp>
#include <pipeline/runtime/in_process.hpp>
#include <pipeline/runtime/sequential_trainer.hpp>
#include <pipeline/runtime/stage_executor.hpp>
#include <pipeline/schedule/generator.hpp>

#include "support/param_compare.hpp"
#include "support/random_plans.hpp"
#include "support/synthetic_minibatches.hpp"

#include <cmath>
#include <map>
#include <mutex>
#include <string>

namespace test_gpu_plans {

using namespace pipeline;
using namespace pipeline::testing;

namespace {

constexpr float kLr = 0.05f;
constexpr std::uint64_t kSeed = 5;
const Device kGpu = Device::cuda(0);

// Each stage's final parameters on the host.
std::map<int, ModelParams> train_plan_on_gpu(const RandomPlan& c, const Sequential& model,
                                             const PipelineLayout& layout,
                                             const Schedule& schedule) {
  std::mutex mutex;
  std::map<int, ModelParams> out;
  run_in_process({.ranks = layout.num_ranks(), .device = kGpu}, [&](Communicator& comm, Device d) {
    StageExecutor ex(model, c.sample(), DType::Float32, layout, comm, momentum_sgd(),
                     {.seed = kSeed, .device = d, .recompute = c.recompute});
    const TrainResult r =
        ex.train(schedule, c.minibatches().feed(), 0, [](std::int64_t) { return kLr; });
    CHECK(std::isfinite(r.loss));
    std::lock_guard<std::mutex> lock(mutex);
    for (int stage : ex.stages()) out.emplace(stage, to_device(ex.params(stage), Device::cpu()));
  });
  return out;
}
}  // namespace

TEST_CASE("random partitioner plans train on one GPU like their references") {
  Rng rng(2027, "gpu-plans");
  for (int trial = 0; trial < 10; ++trial) {
    CAPTURE(trial);
    const RandomPlan c = random_plan(rng, kSeed);
    CAPTURE(c.describe());
    const Sequential model = c.model(0.2f);
    const SyntheticMinibatches& minibatch = c.minibatches();
    const PipelineLayout layout = PipelineLayout::from_plan(c.plan, model);

    const int minibatches = 2, micro = c.flush_microbatches;
    CAPTURE(micro);
    SequentialTrainer ref(model, to_device(model.init(kSeed), kGpu), momentum_sgd(), kSeed);
    for (int j = 0; j < minibatches; ++j) ref.step(minibatch(j), kLr, micro);
    const ModelParams want = to_device(ref.params(), Device::cpu());
    for (const std::string& name : flush_schedules(c.plan)) {
      CAPTURE(name);
      const Schedule s =
          generate_schedule(name, ScheduleSpec::from_plan(c.plan, micro, minibatches));
      check_stages(train_plan_on_gpu(c, model, layout, s), want, layout, 1e-5);
    }

    if (c.plan.virtual_stages > 1) continue;
    // 2BW and 1F1B-stash against their references, which run on the CPU: fp32 rounding apart.
    for (const ReferenceRun& run : {two_buffered_run(c, micro, minibatches + 2, kSeed, kLr),
                                    stash_run(c, layout, kSeed, kLr)})
      check_stages(train_plan_on_gpu(c, run.model, layout, run.schedule), run.want, layout, 1e-4);
  }
}

}  // namespace test_gpu_plans
