// CUDA graphs (runtime/graphed_step.hpp): a trainer that captures its step and replays it gives
// the very same parameters, losses, correct counts and gradient norms as one that launches every
// kernel (bit for bit, since the same kernels run with the same arguments), under SGD-momentum and
// AdamW with a changing learning rate, gradient clipping, several microbatches, a batch of
// another shape in between, batch norm's running statistics and the transformer's embedding; and
// a bad label or token id found inside a replay gives the same error as without graphs.
#include <pipeline/data/synthetic.hpp>
#include <pipeline/nn/zoo.hpp>
#include <pipeline/optim/adamw.hpp>
#include <pipeline/optim/sgd.hpp>
#include <pipeline/runtime/sequential_trainer.hpp>

#include <doctest/doctest.h>

#include "gpu_compare.hpp"

#include <numeric>

namespace test_gpu_graphs {

using namespace pipeline;

namespace {

Batch batch_of(const SyntheticDataset& data, std::int64_t first, std::int64_t size) {
  std::vector<std::int64_t> idx(static_cast<std::size_t>(size));
  std::iota(idx.begin(), idx.end(), first);
  return data.get(idx);
}

std::unique_ptr<Optimizer> make(const std::string& kind) {
  if (kind == "sgd")
    return std::make_unique<Sgd>(SgdOptions{.momentum = 0.9f, .weight_decay = 1e-4f});
  return std::make_unique<AdamW>(AdamWOptions{.weight_decay = 1e-2f});
}

// Every parameter and buffer of the two trainers, compared bit for bit.
void check_same_state(SequentialTrainer& a, SequentialTrainer& b, const Sequential& model) {
  const ModelParams pa = to_device(a.params(), Device::cpu());
  const ModelParams pb = to_device(b.params(), Device::cpu());
  for (int i = 0; i < model.size(); ++i) {
    CAPTURE(model.layer(i).name());
    const LayerParams& x = pa[static_cast<std::size_t>(i)];
    const LayerParams& y = pb[static_cast<std::size_t>(i)];
    REQUIRE(x.params.size() == y.params.size());
    REQUIRE(x.buffers.size() == y.buffers.size());
    for (std::size_t k = 0; k < x.params.size(); ++k)
      CHECK(x.params[k].to_vector() == y.params[k].to_vector());
    for (std::size_t k = 0; k < x.buffers.size(); ++k)
      CHECK(x.buffers[k].to_vector() == y.buffers[k].to_vector());
  }
}

void check_same_step(const StepResult& eager, const StepResult& graphed) {
  CHECK(graphed.loss == eager.loss);
  CHECK(graphed.correct == eager.correct);
  CHECK(graphed.count == eager.count);
  CHECK(graphed.grad_norm == eager.grad_norm);
}

}  // namespace

TEST_CASE("graphed steps equal eager steps: fashion-cnn and resnet18, SGD and AdamW") {
  for (const std::string model : {"fashion-cnn", "resnet18"}) {
    for (const std::string kind : {"sgd", "adamw"}) {
      CAPTURE(model);
      CAPTURE(kind);
      ZooOptions zo;
      zo.width = 0.25;
      const ZooModel zoo = make_model(model, zo);
      const SyntheticDataset data(zoo.sample_shape, 10, 512, 4);
      const ModelParams init = to_device(zoo.model.init(7), Device::cuda(0));
      SequentialTrainer eager(zoo.model, clone_params(init), make(kind), 7, /*clip_norm=*/0.5f);
      SequentialTrainer graphed(zoo.model, clone_params(init), make(kind), 7, 0.5f);
      graphed.use_cuda_graphs();
      // Batches of 32, one of 16 in between (eager), then 32 again (replayed).
      const std::int64_t sizes[] = {32, 32, 32, 16, 32, 32};
      std::int64_t first = 0;
      for (int step = 0; step < 6; ++step) {
        CAPTURE(step);
        const Batch b = batch_of(data, first, sizes[step]);
        first += sizes[step];
        const float lr = 0.05f / static_cast<float>(1 + step);  // a new value every step
        check_same_step(eager.step(b, lr, 2), graphed.step(b, lr, 2));
      }
      check_same_state(eager, graphed, zoo.model);
      REQUIRE(graphed.graphs() != nullptr);
      CHECK(graphed.graphs()->captures() == 1);
      CHECK(graphed.graphs()->replays() == 4);  // steps 2, 3, 5 and 6
      CHECK(graphed.optimizer().state().front().step == 6);
    }
  }
}

TEST_CASE("graphed steps equal eager steps: transformer-lm with its embedding check deferred") {
  ZooOptions zo;
  zo.vocab = 64;
  zo.seq_len = 32;
  zo.dim = 64;
  zo.heads = 4;
  zo.blocks = 2;
  const ZooModel zoo = make_model("transformer-lm", zo);
  const ModelParams init = to_device(zoo.model.init(13), Device::cuda(0));
  SequentialTrainer eager(zoo.model, clone_params(init), make("adamw"), 3, 1.f);
  SequentialTrainer graphed(zoo.model, clone_params(init), make("adamw"), 3, 1.f);
  graphed.use_cuda_graphs();
  for (std::int64_t step = 0; step < 5; ++step) {
    CAPTURE(step);
    const Batch b = gpu_test::token_batch(8, zo.seq_len, static_cast<std::int32_t>(zo.vocab),
                                          static_cast<std::uint64_t>(100 + step));
    check_same_step(eager.step(b, 1e-3f * static_cast<float>(step + 1), 2),
                    graphed.step(b, 1e-3f * static_cast<float>(step + 1), 2));
  }
  check_same_state(eager, graphed, zoo.model);
  CHECK(graphed.graphs()->replays() == 4);

  // A token id out of range, inside a replay: the embedding's message, after the replay.
  Batch bad = gpu_test::token_batch(8, zo.seq_len, static_cast<std::int32_t>(zo.vocab), 200);
  bad.inputs.data<std::int32_t>()[37] = 64;
  CHECK_THROWS_WITH(graphed.step(bad, 1e-3f, 2), doctest::Contains("id 64 at flat position 37"));
}

TEST_CASE("a bad label inside a replay gives a clear error") {
  ZooOptions zo;
  zo.width = 0.25;
  const ZooModel zoo = make_model("mlp", zo);
  const SyntheticDataset data(zoo.sample_shape, 10, 256, 4);
  SequentialTrainer graphed(zoo.model, to_device(zoo.model.init(1), Device::cuda(0)), make("sgd"),
                            1);
  graphed.use_cuda_graphs();
  for (int step = 0; step < 3; ++step) graphed.step(batch_of(data, 32 * step, 32), 0.01f);
  Batch b = batch_of(data, 128, 32);
  b.labels.data<std::int32_t>()[5] = 12;
  CHECK_THROWS_WITH_AS(graphed.step(b, 0.01f), doctest::Contains("label 12 of sample 5"),
                       ConfigError);
}

}  // namespace test_gpu_graphs
