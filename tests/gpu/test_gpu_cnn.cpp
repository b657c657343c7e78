// Training fashion-cnn on a GPU in one process: convolutions (cuDNN), max pools, ReLU, linear
// layers and the loss on cuda:0 follow the CPU's trajectory from the same initialisation under
// SequentialTrainer (SGD with momentum, two microbatches a step so the accumulating weight
// gradients are exercised), and evaluation agrees.
#include <pipeline/cuda/blas.hpp>
#include <pipeline/cuda/dnn.hpp>
#include <pipeline/data/synthetic.hpp>
#include <pipeline/nn/zoo.hpp>
#include <pipeline/optim/sgd.hpp>
#include <pipeline/runtime/sequential_trainer.hpp>

#include <doctest/doctest.h>

#include "support/param_compare.hpp"

#include <numeric>

using namespace pipeline;
using pipeline::testing::max_rel_diff;

namespace {

Batch batch_of(const SyntheticDataset& data, std::int64_t j, std::int64_t size) {
  std::vector<std::int64_t> idx(static_cast<std::size_t>(size));
  std::iota(idx.begin(), idx.end(), j * size);
  return data.get(idx);
}

}  // namespace

TEST_CASE("fashion-cnn trains on cuda:0 as on the CPU") {
  cuda::set_allow_tf32(false);
  cuda::set_deterministic(true);
  const ZooModel zoo = make_model("fashion-cnn", ZooOptions{});
  const SyntheticDataset data(Shape{1, 28, 28}, 10, 512, 17);
  const ModelParams init = zoo.model.init(3);
  const auto sgd = [] {
    return std::make_unique<Sgd>(SgdOptions{.momentum = 0.9f, .weight_decay = 1e-4f});
  };
  SequentialTrainer cpu(zoo.model, init, sgd(), 5);
  SequentialTrainer gpu(zoo.model, to_device(init, Device::cuda(0)), sgd(), 5);
  CHECK(gpu.device() == Device::cuda(0));
  for (std::int64_t j = 0; j < 5; ++j) {
    CAPTURE(j);
    const Batch b = batch_of(data, j, 64);
    const StepResult rc = cpu.step(b, 0.05f, 2);
    const StepResult rg = gpu.step(b, 0.05f, 2);
    CHECK(rg.loss == doctest::Approx(rc.loss).epsilon(1e-4));
    CHECK(rg.grad_norm == doctest::Approx(rc.grad_norm).epsilon(1e-3));
  }
  const ModelParams back = to_device(gpu.params(), Device::cpu());
  CHECK(max_rel_diff(back, cpu.params(), zoo.model.all()) <= 1e-3);
  const EvalResult ec = cpu.evaluate(data, 64), eg = gpu.evaluate(data, 64);
  CHECK(eg.loss == doctest::Approx(ec.loss).epsilon(1e-4));
}
