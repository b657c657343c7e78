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

// One training step of resnet18 (convolutions, batch norm with its running statistics, residual
// additions, average pooling) on cuda:0 against the CPU: the loss, every parameter after the
// update within 1e-4, and the update itself (the gradients times the learning rate) within 1e-2
// of the CPU's, the check that the parameters' large values do not hide.
TEST_CASE("resnet18: one training step on cuda:0 equals the CPU's") {
  cuda::set_allow_tf32(false);
  cuda::set_deterministic(true);
  const ZooModel zoo = make_model("resnet18", ZooOptions{});
  const SyntheticDataset data(zoo.sample_shape, 10, 64, 23);
  const ModelParams init = zoo.model.init(4);
  const auto sgd = [] { return std::make_unique<Sgd>(SgdOptions{.momentum = 0.9f}); };
  ModelParams cpu_init;  // a deep copy: the CPU trainer updates its tensors in place
  for (const LayerParams& p : init) cpu_init.push_back(p.clone());
  SequentialTrainer cpu(zoo.model, std::move(cpu_init), sgd(), 6);
  SequentialTrainer gpu(zoo.model, to_device(init, Device::cuda(0)), sgd(), 6);
  const Batch b = batch_of(data, 0, 16);
  const float lr = 0.1f;
  const StepResult rc = cpu.step(b, lr, 1);
  const StepResult rg = gpu.step(b, lr, 1);
  CHECK(rg.loss == doctest::Approx(rc.loss).epsilon(1e-4));
  const ModelParams back = to_device(gpu.params(), Device::cpu());
  CHECK(max_rel_diff(back, cpu.params(), zoo.model.all()) <= 1e-4);
  double worst = 0, scale = 0;
  for (std::size_t l = 0; l < init.size(); ++l)
    for (std::size_t k = 0; k < init[l].params.size(); ++k) {
      const std::vector<float> p0 = init[l].params[k].to_vector(),
                               pc = cpu.params()[l].params[k].to_vector(),
                               pg = back[l].params[k].to_vector();
      for (std::size_t e = 0; e < p0.size(); ++e) {
        const double dc = double(pc[e]) - p0[e], dg = double(pg[e]) - p0[e];
        worst = std::max(worst, std::abs(dg - dc));
        scale = std::max(scale, std::abs(dc));
      }
    }
  CHECK(scale > 0);
  CHECK(worst <= 1e-2 * scale);
}
