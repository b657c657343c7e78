// Pipelines on one GPU, every rank a thread of this process with its own stream
// (runtime/in_process.hpp): GPipe, 1F1B-flush and ZB-H1 on 2, 3 and 4 stages (and a replicated
// stage), and interleaved 1F1B, interleaved ZB-H1 and ZB-V with and without recomputation, equal
// sequential training on the same GPU to fp32 rounding; 1F1B-stash equals the independent
// weight-history reference; the in-process communicator hands device tensors between streams
// (point-to-point and allreduce, bitwise the CPU's group-order sum); and the stage executor's
// every tensor stays on the device.
#include <doctest/doctest.h>

#include <pipeline/comm/comms/local.hpp>
#include <pipeline/core/rng.hpp>
#include <pipeline/cuda/stream.hpp>
#include <pipeline/data/synthetic.hpp>
#include <pipeline/nn/layers/activation.hpp>
#include <pipeline/nn/layers/dropout.hpp>
#include <pipeline/nn/layers/linear.hpp>
#include <pipeline/optim/sgd.hpp>
#include <pipeline/runtime/in_process.hpp>
#include <pipeline/runtime/sequential_trainer.hpp>
#include <pipeline/runtime/stage_executor.hpp>
#include <pipeline/schedule/generator.hpp>

#include "support/param_compare.hpp"
#include "support/synthetic_minibatches.hpp"
#include "support/stash_reference.hpp"

#include <cstring>
#include <map>
#include <mutex>
#include <numeric>

namespace test_gpu_pipeline {

using namespace pipeline;
using pipeline::testing::max_rel_diff;
using pipeline::testing::StashReference;

namespace {

constexpr int kFeatures = 33;  // odd sizes: no kernel may assume a multiple of its block
constexpr int kClasses = 7;
constexpr int kBatch = 24;
constexpr float kLr = 0.05f;
constexpr std::uint64_t kSeed = 11;
const Device kGpu = Device::cuda(0);

Sequential model_of(float dropout) {
  Sequential m("gpu-pipeline-mlp");
  m.emplace<Linear>("fc1", kFeatures, 65);
  m.emplace<ReLU>("relu1");
  m.emplace<Linear>("fc2", 65, 40);
  m.emplace<ReLU>("relu2");
  m.emplace<Dropout>("drop", dropout);
  m.emplace<Linear>("fc3", 40, kClasses);
  return m;
}

const auto make_sgd = pipeline::testing::momentum_sgd;
const pipeline::testing::SyntheticMinibatches minibatch(Shape{kFeatures}, kClasses, kBatch, 1024,
                                                        5);

MinibatchFeed feed() { return minibatch.feed(); }

// Trains `schedule` in-process on cuda:0; returns every rank's final parameters on the host.
struct RankParams {
  std::mutex mutex;
  std::vector<ModelParams> params;
  std::vector<LayerRange> ranges;
};

void run_on_gpu(const Sequential& model, const PipelineLayout& layout, const Schedule& schedule,
                RankParams& out) {
  out.params.assign(static_cast<std::size_t>(layout.num_ranks()), {});
  out.ranges.assign(static_cast<std::size_t>(layout.num_ranks()), {});
  run_in_process({.ranks = layout.num_ranks(), .device = kGpu}, [&](Communicator& comm, Device d) {
    CHECK(d == kGpu);
    StageExecutor ex(model, Shape{kFeatures}, DType::Float32, layout, comm, make_sgd(),
                     {.seed = kSeed, .device = d});
    for (const auto& layer : ex.params())
      for (const Tensor& t : layer.params) CHECK(t.device() == kGpu);
    ex.train(schedule, feed(), 0, [](std::int64_t) { return kLr; });
    CHECK(ex.peak_memory().total_bytes > 0);
    std::lock_guard<std::mutex> lock(out.mutex);
    out.params[static_cast<std::size_t>(comm.rank())] = to_device(ex.params(), Device::cpu());
    out.ranges[static_cast<std::size_t>(comm.rank())] = ex.layers();
  });
}

Tensor random_tensor(std::int64_t n, std::uint64_t seed) {
  Rng rng(seed, "gpu-pipeline");
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = rng.uniform(-2.f, 2.f);
  return Tensor::from_vector(Shape{n}, v);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor x = a.to(Device::cpu()), y = b.to(Device::cpu());
  return x.numel() == y.numel() && std::memcmp(x.raw(), y.raw(), x.nbytes()) == 0;
}

}  // namespace

TEST_CASE("the in-process communicator moves device tensors between the ranks' streams") {
  const std::int64_t n = 1000;  // not a multiple of any block size
  std::vector<Tensor> host;
  for (int r = 0; r < 3; ++r) host.push_back(random_tensor(n, 100 + static_cast<std::uint64_t>(r)));
  // The CPU's group-order sum, which the device sum must equal bit for bit.
  Tensor want = host[0].clone();
  for (int r = 1; r < 3; ++r)
    for (std::int64_t i = 0; i < n; ++i)
      want.data<float>()[i] += host[static_cast<std::size_t>(r)].data<float>()[i];

  run_in_process({.ranks = 3, .device = kGpu}, [&](Communicator& comm, Device d) {
    const int me = comm.rank();
    // A send posted before its receive, and a receive posted before its send.
    Tensor mine = host[static_cast<std::size_t>(me)].to(d);
    const int next = (me + 1) % 3, prev = (me + 2) % 3;
    Request s = comm.isend(mine, next, Tag::activation(me, 0));
    Tensor got = Tensor::full(Shape{n}, -7.f, d);  // poisoned
    comm.irecv(got, prev, Tag::activation(prev, 0)).wait();
    s.wait();
    CHECK(same_bits(got, host[static_cast<std::size_t>(prev)]));
    // A device tensor into a host receive and back.
    if (me == 0) comm.send(mine, 1, Tag::gradient(0, 1));
    if (me == 1) {
      Tensor cpu = Tensor::zeros(Shape{n});
      comm.recv(cpu, 0, Tag::gradient(0, 1));
      CHECK(same_bits(cpu, host[0]));
    }
    // Allreduce over the world, and over a group of two.
    Tensor sum = host[static_cast<std::size_t>(me)].to(d);
    comm.allreduce_sum(sum, comm.world());
    CHECK(same_bits(sum, want));
    Tensor pair = host[static_cast<std::size_t>(me)].to(d);
    if (me < 2) {
      const Group g = comm.create_group({0, 1});
      comm.allreduce_sum(pair, g);
      Tensor expect = host[0].clone();
      for (std::int64_t i = 0; i < n; ++i) expect.data<float>()[i] += host[1].data<float>()[i];
      CHECK(same_bits(pair, expect));
    }
    CHECK(cuda::current_stream(d.index) != nullptr);  // the rank's own, not the legacy default
  });
}

TEST_CASE("gpipe, 1f1b-flush and zb-h1 on one GPU equal sequential GPU training") {
  const Sequential model = model_of(0.25f);
  const int minibatches = 3, micro = 4;
  SequentialTrainer ref(model, to_device(model.init(kSeed), kGpu), make_sgd(), kSeed);
  for (int j = 0; j < minibatches; ++j) ref.step(minibatch(j), kLr, micro);
  const ModelParams want = to_device(ref.params(), Device::cpu());

  struct Case {
    std::vector<LayerRange> stages;
    std::vector<std::vector<int>> ranks;
  };
  const std::vector<Case> cases = {
      {{{0, 3}, {3, 6}}, {{0}, {1}}},
      {{{0, 1}, {1, 4}, {4, 6}}, {{0}, {1}, {2}}},
      {{{0, 2}, {2, 3}, {3, 5}, {5, 6}}, {{0}, {1}, {2}, {3}}},
      {{{0, 3}, {3, 6}}, {{0, 1}, {2}}},  // a replicated stage: its allreduce on the device
  };
  // ZB-H1: each backward split into its input half and its weight half, which reads the output
  // gradients the first kept (of the layers with weights) on the device.
  for (const std::string name : {"gpipe", "1f1b-flush", "zb-h1"}) {
    for (const Case& c : cases) {
      ScheduleSpec spec;
      spec.stage_ranks = c.ranks;
      spec.microbatches = micro;
      spec.minibatches = minibatches;
      const Schedule s = generate_schedule(name, spec);
      const PipelineLayout layout{c.stages, c.ranks};
      CAPTURE(name);
      CAPTURE(layout.num_ranks());
      RankParams out;
      run_on_gpu(model, layout, s, out);
      for (int r = 0; r < layout.num_ranks(); ++r)
        CHECK(max_rel_diff(out.params[static_cast<std::size_t>(r)], want,
                           out.ranges[static_cast<std::size_t>(r)]) <= 1e-5);
    }
  }
}

// Interleaved 1F1B and its zero-bubble form (v = 2: every rank holds two stages, stage k on rank
// k mod p), and ZB-V (stages k and 2p - 1 - k on rank k) on 2 and 3 ranks, 2 ranks also as 2
// data-parallel pipelines (4 ranks), then again with most stages recomputing their activations in
// the backward: the weights of sequential training on the same GPU.
TEST_CASE("interleaved schedules on one GPU, with and without recomputation, equal sequential") {
  const Sequential model = model_of(0.25f);
  for (const auto& shape : {std::pair{2, 1}, {3, 1}, {2, 2}}) {
    const int p = shape.first, replicas = shape.second;
    const int micro = p == 3 ? 6 : 4, minibatches = 3, stages = 2 * p;
    CAPTURE(p);
    CAPTURE(replicas);
    SequentialTrainer ref(model, to_device(model.init(kSeed), kGpu), make_sgd(), kSeed);
    for (int j = 0; j < minibatches; ++j) ref.step(minibatch(j), kLr, micro);
    const ModelParams want = to_device(ref.params(), Device::cpu());
    PipelineLayout layout;
    for (int k = 0; k < stages; ++k)
      layout.stages.push_back({k * 6 / stages, (k + 1) * 6 / stages});
    for (const std::string name : {"interleaved-1f1b", "interleaved-zb-h1", "zb-v"})
      for (const bool recompute : {false, true}) {
        CAPTURE(name);
        CAPTURE(recompute);
        // zb-v runs the stages in a V (stages k and 2p - 1 - k on rank k).
        const ScheduleSpec spec =
            name == "zb-v" ? ScheduleSpec::v_shape(p, micro, minibatches, replicas)
                           : ScheduleSpec::interleaved(p, 2, micro, minibatches, replicas);
        layout.stage_ranks = spec.stage_ranks;
        const Schedule s = generate_schedule(name, spec);
        std::vector<bool> which;
        if (recompute)
          for (int k = 0; k < stages; ++k) which.push_back(k % 3 != 1);
        std::mutex mutex;
        std::vector<std::pair<int, ModelParams>> stage_params;  // every replica's
        run_in_process({.ranks = p * replicas, .device = kGpu}, [&](Communicator& comm, Device d) {
          StageExecutor ex(model, Shape{kFeatures}, DType::Float32, layout, comm, make_sgd(),
                           {.seed = kSeed, .device = d, .recompute = which});
          ex.train(s, feed(), 0, [](std::int64_t) { return kLr; });
          std::lock_guard<std::mutex> lock(mutex);
          for (int stage : ex.stages())
            stage_params.emplace_back(stage, to_device(ex.params(stage), Device::cpu()));
        });
        REQUIRE(stage_params.size() == static_cast<std::size_t>(stages * replicas));
        for (const auto& entry : stage_params) {
          const int k = entry.first;
          const ModelParams& params = entry.second;
          CAPTURE(k);
          CHECK(max_rel_diff(params, want, layout.stages[static_cast<std::size_t>(k)]) <= 1e-5);
        }
      }
  }
}

TEST_CASE("1f1b-stash on one GPU equals the weight-history reference") {
  const Sequential model = model_of(0.f);
  const int minibatches = 8;
  const std::vector<LayerRange> stages = {{0, 2}, {2, 4}, {4, 6}};
  const std::vector<std::vector<int>> ranks = {{0}, {1}, {2}};
  ScheduleSpec spec;
  spec.stage_ranks = ranks;
  spec.minibatches = minibatches;
  const Schedule s = generate_schedule("1f1b-stash", spec);
  StashReference ref{model, kSeed, kLr, make_sgd, minibatch, stages, {}, {}, false};
  ref.follow(s);
  const ModelParams want = ref.run(minibatches);  // on the CPU: fp32 rounding apart
  RankParams out;
  run_on_gpu(model, PipelineLayout{stages, ranks}, s, out);
  for (int r = 0; r < 3; ++r)
    CHECK(max_rel_diff(out.params[static_cast<std::size_t>(r)], want,
                       out.ranges[static_cast<std::size_t>(r)]) <= 1e-4);
}

}  // namespace test_gpu_pipeline
