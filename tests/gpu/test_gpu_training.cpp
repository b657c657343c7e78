// Training on a GPU in one process: the mlp under SequentialTrainer on cuda:0 follows the same
// trajectory as on the CPU (SGD with momentum and AdamW, gradient clipping, several microbatches),
// evaluation agrees, and parameters saved from the GPU run load into a CPU model unchanged.
#include <pipeline/data/synthetic.hpp>
#include <pipeline/io/safetensors.hpp>
#include <pipeline/nn/zoo.hpp>
#include <pipeline/optim/adamw.hpp>
#include <pipeline/optim/sgd.hpp>
#include <pipeline/runtime/sequential_trainer.hpp>

#include <doctest/doctest.h>

#include "support/param_compare.hpp"
#include "support/temp_dir.hpp"

#include <numeric>

namespace test_gpu_training {

using namespace pipeline;
using pipeline::testing::max_rel_diff;

namespace {

Batch batch_of(const SyntheticDataset& data, std::int64_t j, std::int64_t size) {
  std::vector<std::int64_t> idx(static_cast<std::size_t>(size));
  std::iota(idx.begin(), idx.end(), j * size);
  return data.get(idx);
}

std::unique_ptr<Optimizer> make(const std::string& kind) {
  if (kind == "sgd") return std::make_unique<Sgd>(SgdOptions{.momentum = 0.9f, .weight_decay = 1e-4f});
  return std::make_unique<AdamW>(AdamWOptions{.weight_decay = 1e-2f});
}

}  // namespace

TEST_CASE("the mlp trains on cuda:0 as on the CPU") {
  ZooOptions zo;
  zo.width = 0.25;
  const ZooModel zoo = make_model("mlp", zo);
  const SyntheticDataset data(Shape{1, 28, 28}, 10, 512, 9);
  for (const std::string kind : {"sgd", "adamw"}) {
    CAPTURE(kind);
    const ModelParams init = zoo.model.init(5);
    SequentialTrainer cpu(zoo.model, init, make(kind), 5, /*clip_norm=*/1.f);
    SequentialTrainer gpu(zoo.model, to_device(init, Device::cuda(0)), make(kind), 5, 1.f);
    CHECK(gpu.device() == Device::cuda(0));
    for (std::int64_t j = 0; j < 8; ++j) {
      const Batch b = batch_of(data, j, 32);
      const StepResult rc = cpu.step(b, 0.05f, 2);
      const StepResult rg = gpu.step(b, 0.05f, 2);
      CHECK(rg.loss == doctest::Approx(rc.loss).epsilon(1e-5));
      CHECK(rg.correct == rc.correct);
      CHECK(rg.grad_norm == doctest::Approx(rc.grad_norm).epsilon(1e-4));
    }
    const ModelParams back = to_device(gpu.params(), Device::cpu());
    CHECK(max_rel_diff(back, cpu.params(), zoo.model.all()) <= 1e-4);
    const EvalResult ec = cpu.evaluate(data, 64), eg = gpu.evaluate(data, 64);
    CHECK(eg.loss == doctest::Approx(ec.loss).epsilon(1e-4));
    CHECK(eg.accuracy == doctest::Approx(ec.accuracy));
  }
}

TEST_CASE("parameters saved from a GPU run load into a CPU model unchanged, and back") {
  ZooOptions zo;
  zo.width = 0.25;
  const ZooModel zoo = make_model("mlp", zo);
  const ModelParams gpu_params = to_device(zoo.model.init(11), Device::cuda(0));
  const testing::TempDir dir("gpu_training");
  const std::string path = dir.file("mlp.safetensors");
  save_parameters(path, zoo.model, gpu_params, zoo.model.all());
  ModelParams cpu_params = zoo.model.init(0);
  load_parameters(path, zoo.model, cpu_params, zoo.model.all());
  CHECK(max_rel_diff(cpu_params, to_device(gpu_params, Device::cpu()), zoo.model.all()) == 0.0);
  ModelParams gpu_again = to_device(zoo.model.init(0), Device::cuda(0));
  load_parameters(path, zoo.model, gpu_again, zoo.model.all());
  CHECK(max_rel_diff(to_device(gpu_again, Device::cpu()), cpu_params, zoo.model.all()) == 0.0);
}

}  // namespace test_gpu_training
