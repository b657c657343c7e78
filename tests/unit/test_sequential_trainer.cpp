#include <pipeline/data/loader.hpp>
#include <pipeline/data/synthetic.hpp>
#include <pipeline/nn/layers/activation.hpp>
#include <pipeline/nn/layers/dropout.hpp>
#include <pipeline/nn/layers/linear.hpp>
#include <pipeline/nn/zoo.hpp>
#include <pipeline/optim/sgd.hpp>
#include <pipeline/runtime/sequential_trainer.hpp>

#include <doctest/doctest.h>

#include <numeric>

namespace test_sequential_trainer {

using namespace pipeline;

namespace {
Batch first_samples(const Dataset& d, std::int64_t n) {
  std::vector<std::int64_t> idx(static_cast<std::size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  return d.get(idx);
}
std::vector<float> all_values(const ModelGrads& g) {
  std::vector<float> v;
  for (auto& layer : g)
    for (auto& t : layer) v.insert(v.end(), t.values().begin(), t.values().end());
  return v;
}
}  // namespace

TEST_CASE("k accumulated microbatches give the gradients of one batch of k times the size") {
  ZooModel z = make_model("fashion-cnn");
  SyntheticDataset data(z.sample_shape, 10, 12, 4);
  Batch batch = first_samples(data, 12);
  auto gradients = [&](int microbatches) {
    SequentialTrainer t(z.model, z.model.init(9), std::make_unique<Sgd>(), 9);
    StepResult r = t.accumulate(batch, microbatches);
    return std::make_pair(all_values(t.grads()), r.loss);
  };
  auto [whole, loss1] = gradients(1);
  for (int k : {2, 3, 4}) {
    CAPTURE(k);
    auto [acc, lossk] = gradients(k);
    REQUIRE(acc.size() == whole.size());
    double err = 0, ref = 0;
    for (std::size_t i = 0; i < acc.size(); ++i) {
      err += (acc[i] - whole[i]) * static_cast<double>(acc[i] - whole[i]);
      ref += whole[i] * static_cast<double>(whole[i]);
    }
    // Only the summation order differs: float rounding, ~1e-7 relative per element.
    CHECK(std::sqrt(err / ref) < 1e-5);
    CHECK(lossk == doctest::Approx(loss1).epsilon(1e-5));
  }
}

TEST_CASE("a run continued from its step draws the dropout masks of the run it continues") {
  Sequential m("dropout-mlp");
  m.emplace<Linear>("fc1", 12, 16);
  m.emplace<ReLU>("relu");
  m.emplace<Dropout>("drop", 0.5f);
  m.emplace<Linear>("fc2", 16, 5);
  SyntheticDataset data(Shape{12}, 5, 64, 3);
  DataLoader loader(data, {.batch_size = 8, .seed = 2});
  const DataLoader::Epoch epoch = loader.epoch(0);
  std::vector<Batch> batches;
  for (const Batch& b : epoch) batches.push_back(b);
  // Plain SGD keeps no state: the parameters alone carry the run on.
  SequentialTrainer whole(m, m.init(5), std::make_unique<Sgd>(), 5);
  std::vector<double> want;
  for (const Batch& b : batches) want.push_back(whole.step(b, 0.1f).loss);
  SequentialTrainer first(m, m.init(5), std::make_unique<Sgd>(), 5);
  for (int j = 0; j < 3; ++j) first.step(batches[static_cast<std::size_t>(j)], 0.1f);
  for (const bool continued : {false, true}) {
    CAPTURE(continued);
    ModelParams params;
    for (const LayerParams& l : first.params()) params.push_back(l.clone());
    SequentialTrainer second(m, std::move(params), std::make_unique<Sgd>(), 5);
    if (continued) second.continue_from(3);
    bool equal = true;
    for (std::size_t j = 3; j < batches.size(); ++j)
      equal = equal && second.step(batches[j], 0.1f).loss == want[j];
    CHECK(equal == continued);
  }
}

TEST_CASE("training on a learnable synthetic task lowers the loss and raises accuracy") {
  ZooModel z = make_model("mlp");
  // The seed fixes the labelling function, so the task is scored on its own training samples.
  SyntheticDataset train(z.sample_shape, 10, 512, 1);
  const Dataset& test = train;
  SequentialTrainer t(z.model, z.model.init(1), std::make_unique<Sgd>(SgdOptions{.momentum = 0.9f}), 1);
  EvalResult before = t.evaluate(test, 128);
  DataLoader loader(train, {.batch_size = 32, .seed = 1});
  for (int epoch = 0; epoch < 6; ++epoch)
    for (const Batch& b : loader.epoch(epoch)) t.step(b, 0.05f);
  EvalResult after = t.evaluate(test, 128);
  CHECK(after.loss < 0.7 * before.loss);
  CHECK(after.accuracy > before.accuracy + 0.3);
}

TEST_CASE("a diverging run stops with the step named") {
  ZooModel z = make_model("mlp");
  SyntheticDataset data(z.sample_shape, 10, 64, 1);
  Batch b = first_samples(data, 64);
  SequentialTrainer t(z.model, z.model.init(1), std::make_unique<Sgd>(), 1);
  CHECK_THROWS_WITH(
      [&] {
        for (int i = 0; i < 50; ++i) t.step(b, 1e8f);
      }(),
      doctest::Contains("at step"));
}

TEST_CASE("a gradient that overflows stops the run, with or without clipping") {
  // Inputs of 1e25 keep the loss finite, but the weight gradients' squares overflow a float.
  ZooModel z = make_model("mlp");
  SyntheticDataset data(z.sample_shape, 10, 64, 1);
  Batch b = first_samples(data, 64);
  for (float& v : b.inputs.values()) v *= 1e25f;
  for (float clip : {0.f, 1.f}) {  // the norm in the update's pass, and before clipping
    CAPTURE(clip);
    SequentialTrainer t(z.model, z.model.init(1), std::make_unique<Sgd>(), 1, clip);
    CHECK_THROWS_WITH(
        t.step(b, 0.01f),
        doctest::Contains("gradient norm became inf at step 1"));  // counted from 1, as logged
  }
}

TEST_CASE("CUDA graphs: refused on the CPU and for a model that draws random numbers") {
  ZooModel z = make_model("fashion-cnn");
  SequentialTrainer cpu(z.model, z.model.init(1), std::make_unique<Sgd>(SgdOptions{}), 1);
  CHECK_THROWS_WITH_AS(cpu.use_cuda_graphs(), doctest::Contains("CUDA graphs"), ConfigError);
  CHECK(cpu.graphs() == nullptr);

  ZooOptions o;
  o.width = 0.125;
  ZooModel vgg = make_model("vgg16", o);  // dropout 0.5 before its last two products
  SequentialTrainer t(vgg.model, vgg.model.init(1), std::make_unique<Sgd>(SgdOptions{}), 1);
  CHECK_THROWS_WITH_AS(t.use_cuda_graphs(), doctest::Contains("layer 'drop1' of 'vgg16'"),
                       ConfigError);
  CHECK(vgg.model.layer(vgg.model.size() - 1).draws_random_numbers() == false);

  ZooOptions lm;
  lm.dropout = 0.1f;
  ZooModel transformer = make_model("transformer-lm", lm);
  CHECK(transformer.model.layer(1).draws_random_numbers());  // a block, its dropout inside
  lm.dropout = 0.f;
  CHECK_FALSE(make_model("transformer-lm", lm).model.layer(1).draws_random_numbers());
}

}  // namespace test_sequential_trainer
