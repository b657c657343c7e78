#include <pipeline/nn/layers/linear.hpp>
#include <pipeline/nn/loss.hpp>
#include <pipeline/ops/softmax_xent.hpp>

#include "support/gradcheck.hpp"

#include <cmath>

namespace test_softmax_xent {

using namespace pipeline;

namespace {

Tensor random_labels(std::int64_t n, std::int64_t classes, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::int32_t> v;
  for (std::int64_t i = 0; i < n; ++i) v.push_back(static_cast<std::int32_t>(rng.below(classes)));
  return Tensor::from_ints({n}, v);
}

// Loss in double, straight from the definition.
double reference_loss(const Tensor& z, const Tensor& y, double scale) {
  const auto C = z.dim(-1), R = z.numel() / C;
  double total = 0;
  for (std::int64_t r = 0; r < R; ++r) {
    double s = 0;
    for (std::int64_t c = 0; c < C; ++c) s += std::exp(double(z.values()[r * C + c]));
    total += std::log(s) - z.values()[r * C + y.data<std::int32_t>()[r]];
  }
  return total * scale;
}

}  // namespace

TEST_CASE("softmax cross-entropy matches the definition") {
  const std::int64_t n = 13, classes = 7;
  Tensor z = testing::random_tensor({n, classes}, 1, -3.f, 3.f);
  Tensor y = random_labels(n, classes, 2);
  const float scale = 1.f / 20;
  LossResult r = SoftmaxCrossEntropy()(z, y, scale);
  CHECK(r.count == n);
  CHECK(r.loss == doctest::Approx(reference_loss(z, y, scale)).epsilon(1e-6));

  std::int64_t correct = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const float* row = z.data<float>() + i * classes;
    correct += std::max_element(row, row + classes) - row == y.data<std::int32_t>()[i];
    double s = 0;
    for (std::int64_t c = 0; c < classes; ++c) s += std::exp(double(row[c]));
    for (std::int64_t c = 0; c < classes; ++c) {
      const double want = scale * (std::exp(double(row[c])) / s - (c == y.data<std::int32_t>()[i]));
      CHECK(r.grad.values()[i * classes + c] == doctest::Approx(want).epsilon(1e-5).scale(1e-3));
    }
  }
  CHECK(r.correct == correct);

  // Central differences of the loss itself.
  Tensor zz = z.clone();
  for (std::int64_t k = 0; k < z.numel(); k += 5) {
    const float keep = zz.values()[k], h = 1e-2f;
    zz.values()[k] = keep + h;
    const double lp = reference_loss(zz, y, scale);
    zz.values()[k] = keep - h;
    const double lm = reference_loss(zz, y, scale);
    zz.values()[k] = keep;
    CHECK(r.grad.values()[k] == doctest::Approx((lp - lm) / (2.0 * h)).epsilon(1e-3).scale(1e-3));
  }
}

TEST_CASE("softmax cross-entropy is stable for large logits and counts argmax hits") {
  Tensor z = Tensor::from_vector({2, 3}, {1e4f, 0.f, -1e4f, -1e4f, -1e4f + 1.f, -1e4f});
  Tensor y = Tensor::from_ints({2}, {0, 0});
  LossResult r = SoftmaxCrossEntropy()(z, y, 1.f);
  CHECK(std::isfinite(r.loss));
  // Row 0 is certain and right (loss 0); row 1 puts e/(e+2) on class 1, label 0.
  const double want = std::log(std::exp(1.0) + 2.0);
  CHECK(r.loss == doctest::Approx(want).epsilon(1e-5));
  CHECK(r.correct == 1);
  for (float g : r.grad.values()) CHECK(std::isfinite(g));
  // Labels of any shape holding one per row: [B, T, C] logits with [B, T] labels.
  Tensor z3 = testing::random_tensor({2, 3, 4}, 5);
  Tensor y3 = Tensor::from_ints({2, 3}, {0, 1, 2, 3, 0, 1});
  CHECK(SoftmaxCrossEntropy()(z3, y3, 1.f).count == 6);
}

TEST_CASE("softmax cross-entropy rejects bad labels") {
  Tensor z = testing::random_tensor({3, 4}, 1);
  CHECK_THROWS_AS(SoftmaxCrossEntropy()(z, Tensor::from_ints({3}, {0, 4, 1}), 1.f), ConfigError);
  CHECK_THROWS_AS(SoftmaxCrossEntropy()(z, Tensor::from_ints({3}, {0, -1, 1}), 1.f), ConfigError);
  CHECK_THROWS_AS(SoftmaxCrossEntropy()(z, Tensor::from_ints({2}, {0, 1}), 1.f), ConfigError);
  CHECK_THROWS_AS(SoftmaxCrossEntropy()(z, Tensor::zeros({3}), 1.f), ConfigError);  // float labels
  try {
    SoftmaxCrossEntropy()(z, Tensor::from_ints({3}, {0, 9, 1}), 1.f);
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()).find("label 9 of sample 1 is outside [0, 4)") != std::string::npos);
  }
}

TEST_CASE("loss: k accumulated microbatches equal one batch of k times the size") {
  const std::int64_t k = 4, micro = 3, total = k * micro, classes = 5;
  Linear fc("fc", 6, classes);
  LayerParams p = fc.init(3);
  Tensor x = testing::random_tensor({total, 6}, 4);
  Tensor y = random_labels(total, classes, 5);
  const float scale = 1.f / total;
  SoftmaxCrossEntropy xent;

  std::vector<Tensor> whole = fc.zero_grads();
  double whole_loss;
  std::int64_t whole_correct;
  {
    Saved s;
    LossResult r = xent(fc.forward(p, x, s, {}), y, scale);
    fc.backward(p, s, r.grad, whole);
    whole_loss = r.loss;
    whole_correct = r.correct;
  }
  std::vector<Tensor> acc = fc.zero_grads();
  double acc_loss = 0;
  std::int64_t acc_correct = 0, acc_count = 0;
  for (std::int64_t i = 0; i < k; ++i) {
    Saved s;
    LossResult r = xent(fc.forward(p, x.slice(i * micro, (i + 1) * micro), s, {}),
                        y.slice(i * micro, (i + 1) * micro), scale);
    fc.backward(p, s, r.grad, acc);
    acc_loss += r.loss;
    acc_correct += r.correct;
    acc_count += r.count;
  }
  CHECK(acc_loss == doctest::Approx(whole_loss).epsilon(1e-6));
  CHECK(acc_correct == whole_correct);
  CHECK(acc_count == total);
  for (std::size_t j = 0; j < whole.size(); ++j)
    for (std::int64_t e = 0; e < whole[j].numel(); ++e)
      CHECK(acc[j].values()[e] == doctest::Approx(whole[j].values()[e]).epsilon(1e-5).scale(1e-4));
}

}  // namespace test_softmax_xent
