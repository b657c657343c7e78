#include <pipeline/nn/layers/activation.hpp>

#include "support/gradcheck.hpp"

#include <cmath>
#include <functional>

namespace test_activation {

using namespace pipeline;

namespace {

double reference(ops::Activation a, double x) {
  switch (a) {
    case ops::Activation::ReLU:
      return x > 0 ? x : 0;
    case ops::Activation::GELU:
      return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    case ops::Activation::Tanh:
      return std::tanh(x);
    case ops::Activation::Sigmoid:
      return 1 / (1 + std::exp(-x));
  }
  return 0;
}

// Central difference of the double reference: an independent oracle for f'.
double reference_derivative(ops::Activation a, double x) {
  if (a == ops::Activation::ReLU) return x > 0 ? 1 : 0;
  const double h = 1e-6;
  return (reference(a, x + h) - reference(a, x - h)) / (2 * h);
}

constexpr ops::Activation kAll[] = {ops::Activation::ReLU, ops::Activation::GELU,
                                    ops::Activation::Tanh, ops::Activation::Sigmoid};

}  // namespace

TEST_CASE("activation ops match a double-precision reference") {
  // Large enough to take the multi-threaded path, with a ragged tail; values span the saturated
  // regions of tanh/sigmoid and the negative tail of GELU.
  for (std::int64_t n : {std::int64_t{1}, std::int64_t{37}, std::int64_t{100003}}) {
    Tensor x = testing::random_tensor({n}, 7 + n, -9.f, 9.f);
    Tensor dy = testing::random_tensor({n}, 8 + n);
    for (auto a : kAll) {
      INFO(ops::activation_name(a), " n=", n);
      Tensor y = ops::activation_forward(a, x);
      Tensor saved = ops::activation_saves_output(a) ? y : x;
      Tensor dx = ops::activation_backward(a, saved, dy);
      double worst_y = 0, worst_dx = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        double xi = x.data<float>()[i];
        worst_y = std::max(worst_y, std::abs(y.data<float>()[i] - reference(a, xi)));
        double want = dy.data<float>()[i] * reference_derivative(a, xi);
        worst_dx = std::max(worst_dx, std::abs(dx.data<float>()[i] - want));
      }
      CHECK(worst_y < 2e-6 * 9);
      CHECK(worst_dx < 2e-5);
    }
  }
}

TEST_CASE("activation ops work in place") {
  Tensor x = testing::random_tensor({5, 11}, 3, -3.f, 3.f);
  for (auto a : kAll) {
    Tensor want = ops::activation_forward(a, x);
    Tensor y = x.clone();
    ops::activation_forward(a, y, y);
    CHECK(y.to_vector() == want.to_vector());
  }
}

TEST_CASE("ReLU is exactly zero for negatives and passes positives") {
  Tensor x = Tensor::from_vector({4}, {-2.f, -0.f, 0.5f, 3.f});
  Tensor y = ops::activation_forward(ops::Activation::ReLU, x);
  CHECK(y.to_vector() == std::vector<float>{0.f, 0.f, 0.5f, 3.f});
  Tensor dx = ops::activation_backward(ops::Activation::ReLU, x, Tensor::full({4}, 2.f));
  CHECK(dx.to_vector() == std::vector<float>{0.f, 0.f, 2.f, 2.f});
}

TEST_CASE("activation ops reject mismatched sizes") {
  Tensor x = Tensor::zeros({3});
  Tensor y = Tensor::zeros({4});
  CHECK_THROWS_AS(ops::activation_forward(ops::Activation::Tanh, x, y), Error);
  CHECK_THROWS_AS(ops::activation_backward(ops::Activation::Tanh, x, y, y), Error);
}

TEST_CASE("activation layers: backward matches finite differences") {
  // ReLU's kink: a small step keeps sampled points away from it.
  testing::GradCheckOptions relu_opts;
  relu_opts.step = 1e-3f;
  testing::check_layer_gradients(ReLU("relu"), {3, 7}, relu_opts);
  testing::check_layer_gradients(ReLU("relu"), {1, 5, 3, 3}, relu_opts);
  testing::GradCheckOptions wide;
  wide.input_lo = -3.f;
  wide.input_hi = 3.f;
  for (const Shape& s : {Shape{1, 1}, Shape{2, 5, 3}, Shape{3, 2, 5, 7}}) {
    testing::check_layer_gradients(GELU("gelu"), s, wide);
    testing::check_layer_gradients(Tanh("tanh"), s, wide);
    testing::check_layer_gradients(Sigmoid("sigmoid"), s, wide);
  }
}

TEST_CASE("activation layers report kind, shape and no parameters") {
  ReLU r("r");
  GELU g("g");
  Tanh t("t");
  Sigmoid s("s");
  CHECK(r.kind() == "ReLU");
  CHECK(g.kind() == "GELU");
  CHECK(t.kind() == "Tanh");
  CHECK(s.kind() == "Sigmoid");
  CHECK(g.output_shape({2, 3, 4}) == Shape{2, 3, 4});
  CHECK(r.parameters().empty());
  CHECK(r.flops({2, 8}) > 0);
  // Only the input gradient exists; a weight-only backward computes nothing.
  LayerParams p;
  Saved saved;
  Tensor x = testing::random_tensor({2, 3}, 1);
  r.forward(p, x, saved, {});
  std::vector<Tensor> none;
  CHECK_FALSE(r.backward(p, saved, x, none, GradParts::Weight).defined());
}

}  // namespace test_activation
