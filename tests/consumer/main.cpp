// Builds against the installed package (and the build tree) and runs the README's library
// examples at a tiny size: a zoo model profiled and planned; a model of one's own profiled,
// planned for 1F1B-flush and trained as a 2-rank pipeline in this process, whose losses equal
// sequential training's.
#include <pipeline/pipeline.hpp>

#include <fmt/format.h>

#include <cmath>
#include <memory>
#include <mutex>
#include <numeric>
#include <vector>

namespace {

bool zoo_model_plans() {
  pipeline::ZooModel z = pipeline::make_model("fashion-cnn");
  pipeline::ProfileOptions options;
  options.warmup = 0;
  options.repeat = 1;
  pipeline::Profile profile = pipeline::profile(z, /*batch=*/2, pipeline::Device::cpu(), options);
  pipeline::Topology topology{{pipeline::parse_level("4:10Gbit/s")}};
  pipeline::Plan plan = pipeline::partition(profile, topology);
  fmt::print("consumer ok: {} layers, config {}\n", profile.size(), plan.config);
  return profile.size() == z.model.size() && plan.workers == 4;
}

// --- README: "A model and data of your own" ---------------------------------------------------
bool own_model_trains() {
  using namespace pipeline;
  Sequential model("my-mlp");
  model.emplace<Linear>("fc1", 16, 64);
  model.emplace<ReLU>("relu1");
  model.emplace<Linear>("fc2", 64, 64);
  model.emplace<ReLU>("relu2");
  model.emplace<Linear>("fc3", 64, 4);
  const Shape sample{16};
  const std::int64_t batch = 32;
  const SyntheticDataset data(sample, /*classes=*/4, /*samples=*/1024, /*seed=*/1);

  // Minibatch j is samples [32 j, 32 j + 32); load_samples hands out one microbatch's part.
  const auto samples = [&data](std::int64_t begin, std::int64_t end) {
    std::vector<std::int64_t> indices(static_cast<std::size_t>(end - begin));
    std::iota(indices.begin(), indices.end(), begin);
    return data.get(indices);
  };
  const MinibatchFeed feed{[&](std::int64_t j) { return samples(j * batch, (j + 1) * batch); },
                           [&](std::int64_t) { return batch; },
                           [&](std::int64_t j, std::int64_t begin, std::int64_t end) {
                             return samples(j * batch + begin, j * batch + end);
                           }};

  // Profile, plan for two workers under 1F1B-flush, and that plan's schedule for 8 minibatches.
  const Profile profile = pipeline::profile(model, sample, static_cast<int>(batch), Device::cpu());
  PartitionOptions options;
  options.schedule = "1f1b-flush";
  options.straight = true;  // two stages (data parallelism may be faster for so small a model)
  const Plan plan = partition(profile, Topology{{parse_level("2:10Gbit/s")}}, options);
  const PipelineLayout layout = PipelineLayout::from_plan(plan, model);
  ScheduleRequest request;
  take_plan_hints(request, plan);
  request.name = plan.schedule;
  request.microbatches = 4;
  const Schedule schedule = make_schedule(request, layout, /*minibatches=*/8);
  const auto optimizer = [] { return std::make_unique<Sgd>(SgdOptions{.momentum = 0.9f}); };
  const auto lr = [](std::int64_t) { return 0.05f; };

  // The plan's ranks as threads of this process; the feed is shared by them, so it keeps no
  // state (or build one per rank).
  std::vector<double> losses;
  std::mutex mutex;
  run_in_process({.ranks = layout.num_ranks()}, [&](Communicator& comm, Device device) {
    StageExecutor stage(model, sample, DType::Float32, layout, comm, optimizer(),
                        {.seed = 3, .device = device});
    stage.train(schedule, feed, /*first_minibatch=*/0, lr, [&](const MinibatchStats& s) {
      std::lock_guard<std::mutex> lock(mutex);
      losses.push_back(s.loss);
    });
  });

  // Under a flush schedule the pipeline computes what one process does.
  SequentialTrainer sequential(model, model.init(3), optimizer(), 3);
  bool same = losses.size() == 8;
  for (std::int64_t j = 0; same && j < 8; ++j) {
    const double want = sequential.step(feed.load(j), lr(j), request.microbatches).loss;
    same = std::abs(losses[static_cast<std::size_t>(j)] - want) <= 1e-5 * std::abs(want);
  }
  fmt::print("own model: config {}, loss {:.4f} -> {:.4f}, {} sequential training\n", plan.config,
             losses.front(), losses.back(), same ? "equal to" : "NOT equal to");
  return same && losses.back() < losses.front();
}

}  // namespace

int main() {
  return zoo_model_plans() && own_model_trains() ? 0 : 1;
}
