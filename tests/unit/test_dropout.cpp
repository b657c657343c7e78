#include <pipeline/nn/layers/dropout.hpp>
#include <pipeline/ops/dropout.hpp>

#include "support/gradcheck.hpp"

#include <cmath>

namespace test_dropout {

using namespace pipeline;

TEST_CASE("dropout mask: keep rate, scale and determinism") {
  const float p = 0.3f;
  Tensor m = ops::dropout_mask({200, 500}, p, 42, "fc1");
  std::int64_t dropped = 0;
  for (float v : m.values()) {
    if (v == 0.f)
      ++dropped;
    else
      CHECK(v == doctest::Approx(1.0 / (1.0 - p)));
  }
  CHECK(double(dropped) / m.numel() == doctest::Approx(p).epsilon(0.02));
  // The same (seed, key) draws the same mask; another key or seed draws another.
  CHECK(ops::dropout_mask({200, 500}, p, 42, "fc1").to_vector() == m.to_vector());
  CHECK(ops::dropout_mask({200, 500}, p, 42, "fc2").to_vector() != m.to_vector());
  CHECK(ops::dropout_mask({200, 500}, p, 43, "fc1").to_vector() != m.to_vector());
  // Edge probabilities.
  Tensor keep_all = ops::dropout_mask({10}, 0.f, 1, "k");
  Tensor drop_all = ops::dropout_mask({10}, 1.f, 1, "k");
  for (float v : keep_all.values()) CHECK(v == 1.f);
  for (float v : drop_all.values()) CHECK(v == 0.f);
  CHECK_THROWS_AS(ops::dropout_mask({10}, 1.5f, 1, "k"), ConfigError);
  CHECK_THROWS_AS(ops::dropout_mask({10}, -0.1f, 1, "k"), ConfigError);
}

TEST_CASE("dropout keeps the expectation and applies its mask") {
  Tensor x = testing::random_tensor({100, 1000}, 3, 0.5f, 1.5f);
  Tensor mask;
  Tensor y = ops::dropout(x, 0.5f, 7, "d", mask);
  double sx = 0, sy = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    sx += x.values()[i];
    sy += y.values()[i];
    REQUIRE(y.values()[i] == x.values()[i] * mask.values()[i]);
  }
  CHECK(sy / sx == doctest::Approx(1.0).epsilon(0.01));
}

TEST_CASE("Dropout layer: same mask on any rank, identity in evaluation") {
  Dropout a("drop", 0.4f), b("drop", 0.4f), c("other", 0.4f);
  LayerParams none;
  Tensor x = testing::random_tensor({3, 17}, 5);
  Saved sa, sb, sc;
  ForwardContext train{Mode::Train, 99};
  Tensor ya = a.forward(none, x, sa, train);
  CHECK(b.forward(none, x, sb, train).to_vector() == ya.to_vector());  // another "rank"
  CHECK(c.forward(none, x, sc, train).to_vector() != ya.to_vector());  // name mixed in
  CHECK(ya.to_vector() != x.to_vector());

  Tensor dy = testing::random_tensor({3, 17}, 6);
  std::vector<Tensor> grads;
  Tensor dx = a.backward(none, sa, dy, grads);
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    // Where the output kept x (scaled), the gradient is scaled alike; where it dropped, zero.
    if (ya.values()[i] == 0.f)
      CHECK(dx.values()[i] == 0.f);
    else
      CHECK(dx.values()[i] == doctest::Approx(dy.values()[i] / 0.6f));
  }

  Saved se;
  Tensor ye = a.forward(none, x, se, {Mode::Eval, 99});
  CHECK(ye.to_vector() == x.to_vector());
  CHECK(a.backward(none, se, dy, grads).to_vector() == dy.to_vector());
  CHECK_THROWS_AS(Dropout("bad", 1.2f), ConfigError);
}

TEST_CASE("Dropout backward matches finite differences") {
  testing::check_layer_gradients(Dropout("drop", 0.3f), {1, 13});
  testing::check_layer_gradients(Dropout("drop", 0.5f), {3, 2, 5, 3});
  testing::GradCheckOptions eval;
  eval.mode = Mode::Eval;
  testing::check_layer_gradients(Dropout("drop", 0.5f), {2, 7}, eval);
}

}  // namespace test_dropout
