#include <pipeline/nn/layers/batch_norm.hpp>
#include <pipeline/nn/layers/layer_norm.hpp>

#include "support/gradcheck.hpp"

#include <cmath>

namespace test_norm {

using namespace pipeline;

namespace {

// Naive layer norm in double.
std::vector<double> layer_norm_reference(const Tensor& x, const Tensor& w, const Tensor& b,
                                         double eps) {
  const std::int64_t f = w.numel(), rows = x.numel() / f;
  const float* xp = x.data<float>();
  std::vector<double> y(x.numel());
  for (std::int64_t r = 0; r < rows; ++r) {
    double m = 0, v = 0;
    for (std::int64_t i = 0; i < f; ++i) m += xp[r * f + i];
    m /= f;
    for (std::int64_t i = 0; i < f; ++i) v += (xp[r * f + i] - m) * (xp[r * f + i] - m);
    v /= f;
    for (std::int64_t i = 0; i < f; ++i)
      y[r * f + i] =
          (xp[r * f + i] - m) / std::sqrt(v + eps) * w.data<float>()[i] + b.data<float>()[i];
  }
  return y;
}

struct ChannelStats {
  std::vector<double> mean, var;  // biased variance
};

ChannelStats channel_stats(const Tensor& x) {
  const std::int64_t n = x.dim(0), c = x.dim(1), hw = x.dim(2) * x.dim(3);
  ChannelStats s{std::vector<double>(c, 0.0), std::vector<double>(c, 0.0)};
  const float* xp = x.data<float>();
  for (std::int64_t k = 0; k < c; ++k) {
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < hw; ++j) s.mean[k] += xp[(i * c + k) * hw + j];
    s.mean[k] /= static_cast<double>(n * hw);
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < hw; ++j) {
        double dlt = xp[(i * c + k) * hw + j] - s.mean[k];
        s.var[k] += dlt * dlt;
      }
    s.var[k] /= static_cast<double>(n * hw);
  }
  return s;
}

double max_abs_diff(const Tensor& a, const std::vector<double>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < b.size(); ++i)
    worst = std::max(worst, std::abs(a.data<float>()[i] - b[i]));
  return worst;
}

}  // namespace

TEST_CASE("layer_norm_forward matches a naive reference") {
  for (const Shape& s : {Shape{1, 1}, Shape{3, 7}, Shape{2, 5, 33}, Shape{257, 96}}) {
    INFO("shape ", s.str());
    const std::int64_t f = s[-1];
    Tensor x = testing::random_tensor(s, 1, -2.f, 5.f);  // non-zero mean
    Tensor w = testing::random_tensor({f}, 2, 0.5f, 1.5f);
    Tensor b = testing::random_tensor({f}, 3);
    Tensor y = Tensor::empty(s), mean = Tensor::empty({x.numel() / f}),
           rstd = Tensor::empty({x.numel() / f});
    ops::layer_norm_forward(x, w, b, 1e-5f, y, mean, rstd);
    CHECK(max_abs_diff(y, layer_norm_reference(x, w, b, 1e-5)) < 2e-4);
  }
}

TEST_CASE("layer_norm rejects inputs whose last extent does not match") {
  Tensor x = Tensor::zeros({2, 5}), w = Tensor::zeros({4}), b = Tensor::zeros({4});
  Tensor y = Tensor::empty({2, 5}), m = Tensor::empty({2}), r = Tensor::empty({2});
  CHECK_THROWS_AS(ops::layer_norm_forward(x, w, b, 1e-5f, y, m, r), Error);
  CHECK_THROWS_AS(LayerNorm("ln", 4).output_shape({2, 5}), ConfigError);
  CHECK_THROWS_AS(LayerNorm("ln", 0), ConfigError);
}

TEST_CASE("LayerNorm backward matches finite differences") {
  testing::check_layer_gradients(LayerNorm("ln", 7), {3, 7});
  testing::check_layer_gradients(LayerNorm("ln", 5), {1, 1, 5});
  testing::check_layer_gradients(LayerNorm("ln", 13), {2, 3, 13});
  testing::check_layer_gradients(LayerNorm("ln", 2), {4, 2});
}

TEST_CASE("LayerNorm parameters are PyTorch's") {
  LayerNorm ln("ln", 6);
  auto p = ln.init(1);
  CHECK(ln.parameters()[0].name == "weight");
  CHECK(ln.parameters()[1].name == "bias");
  CHECK(p.params[0].to_vector() == std::vector<float>(6, 1.f));
  CHECK(p.params[1].to_vector() == std::vector<float>(6, 0.f));
  CHECK(ln.buffers().empty());
}

TEST_CASE("batch norm training forward: batch statistics and PyTorch running updates") {
  for (const Shape& s :
       {Shape{2, 3, 5, 7}, Shape{1, 5, 3, 1}, Shape{7, 2, 1, 1}, Shape{9, 4, 13, 11}}) {
    INFO("shape ", s.str());
    const std::int64_t c = s[1];
    Tensor x = testing::random_tensor(s, 11, -1.f, 3.f);
    Tensor w = testing::random_tensor({c}, 12, 0.5f, 1.5f);
    Tensor b = testing::random_tensor({c}, 13);
    Tensor rm = testing::random_tensor({c}, 14), rv = testing::random_tensor({c}, 15, 0.5f, 2.f);
    Tensor rm0 = rm.clone(), rv0 = rv.clone();
    Tensor y = Tensor::empty(s), mean = Tensor::empty({c}), rstd = Tensor::empty({c});
    ops::batch_norm_forward_train(x, w, b, 1e-5f, 0.1f, rm, rv, y, mean, rstd);

    ChannelStats st = channel_stats(x);
    const double count = static_cast<double>(s[0] * s[2] * s[3]);
    std::vector<double> want(x.numel());
    const std::int64_t hw = s[2] * s[3];
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      std::int64_t k = (i / hw) % c;
      want[i] =
          (x.data<float>()[i] - st.mean[k]) / std::sqrt(st.var[k] + 1e-5) * w.data<float>()[k] +
          b.data<float>()[k];
    }
    CHECK(max_abs_diff(y, want) < 2e-4);
    for (std::int64_t k = 0; k < c; ++k) {
      CHECK(rm.data<float>()[k] ==
            doctest::Approx(0.9 * rm0.data<float>()[k] + 0.1 * st.mean[k]).epsilon(1e-5));
      double unbiased = st.var[k] * count / (count - 1);
      CHECK(rv.data<float>()[k] ==
            doctest::Approx(0.9 * rv0.data<float>()[k] + 0.1 * unbiased).epsilon(1e-5));
    }
  }
}

TEST_CASE(
    "batch norm evaluation uses running statistics, and its backward treats them as constants") {
  const Shape s{3, 5, 2, 3};
  Tensor x = testing::random_tensor(s, 21, -2.f, 2.f);
  Tensor w = testing::random_tensor({5}, 22, 0.5f, 1.5f), b = testing::random_tensor({5}, 23);
  Tensor rm = testing::random_tensor({5}, 24), rv = testing::random_tensor({5}, 25, 0.5f, 2.f);
  Tensor y = Tensor::empty(s), mean = Tensor::empty({5}), rstd = Tensor::empty({5});
  ops::batch_norm_forward_eval(x, w, b, 1e-3f, rm, rv, y, mean, rstd);
  Tensor dy = testing::random_tensor(s, 26);
  Tensor dx = Tensor::empty(s), dw = Tensor::zeros({5}), db = Tensor::zeros({5});
  ops::batch_norm_backward(x, w, mean, rstd, dy, false, &dx, &dw, &db);
  std::vector<double> want_y(x.numel()), want_dx(x.numel()), want_dw(5, 0.0), want_db(5, 0.0);
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    std::int64_t k = (i / 6) % 5;
    double rs = 1 / std::sqrt(rv.data<float>()[k] + 1e-3);
    double xhat = (x.data<float>()[i] - rm.data<float>()[k]) * rs;
    want_y[i] = xhat * w.data<float>()[k] + b.data<float>()[k];
    want_dx[i] = dy.data<float>()[i] * w.data<float>()[k] * rs;
    want_dw[k] += dy.data<float>()[i] * xhat;
    want_db[k] += dy.data<float>()[i];
  }
  CHECK(max_abs_diff(y, want_y) < 1e-5);
  CHECK(max_abs_diff(dx, want_dx) < 1e-5);
  CHECK(max_abs_diff(dw, want_dw) < 1e-4);
  CHECK(max_abs_diff(db, want_db) < 1e-4);
}

TEST_CASE("BatchNorm2d backward matches finite differences in train and eval modes") {
  testing::GradCheckOptions train;
  testing::check_layer_gradients(BatchNorm2d("bn", 3), {2, 3, 5, 7}, train);
  testing::check_layer_gradients(BatchNorm2d("bn", 5), {1, 5, 3, 2}, train);
  testing::check_layer_gradients(BatchNorm2d("bn", 2), {6, 2, 1, 1}, train);
  testing::GradCheckOptions eval;
  eval.mode = Mode::Eval;
  testing::check_layer_gradients(BatchNorm2d("bn", 3), {2, 3, 5, 7}, eval);
  testing::check_layer_gradients(BatchNorm2d("bn", 1), {1, 1, 1, 1}, eval);
}

TEST_CASE("BatchNorm2d layer: buffers, modes and errors") {
  BatchNorm2d bn("bn", 3, 1e-5f, 0.5f);
  auto specs = bn.parameters();
  auto bufs = bn.buffers();
  REQUIRE(specs.size() == 2);
  REQUIRE(bufs.size() == 2);
  CHECK(specs[0].name == "weight");
  CHECK(specs[1].name == "bias");
  CHECK(bufs[0].name == "running_mean");
  CHECK(bufs[1].name == "running_var");
  LayerParams p = bn.init(3);
  CHECK(p.buffers[0].to_vector() == std::vector<float>(3, 0.f));
  CHECK(p.buffers[1].to_vector() == std::vector<float>(3, 1.f));

  Tensor x = testing::random_tensor({4, 3, 2, 2}, 5, 1.f, 3.f);
  Saved saved;
  // Eval leaves the buffers untouched.
  bn.forward(p, x, saved, {Mode::Eval, 0});
  CHECK(p.buffers[0].to_vector() == std::vector<float>(3, 0.f));
  // Train moves them halfway (momentum 0.5) toward the batch statistics.
  Tensor y = bn.forward(p, x, saved, {Mode::Train, 0});
  ChannelStats st = channel_stats(x);
  for (int k = 0; k < 3; ++k) {
    CHECK(p.buffers[0].data<float>()[k] == doctest::Approx(0.5 * st.mean[k]).epsilon(1e-5));
    CHECK(p.buffers[1].data<float>()[k] ==
          doctest::Approx(0.5 + 0.5 * st.var[k] * 16 / 15).epsilon(1e-5));
  }
  // Training output has zero mean and unit (biased) variance per channel with default affine.
  ChannelStats ys = channel_stats(y);
  for (int k = 0; k < 3; ++k) {
    CHECK(std::abs(ys.mean[k]) < 1e-5);
    CHECK(ys.var[k] == doctest::Approx(1.0).epsilon(1e-3));
  }

  CHECK_THROWS_AS(bn.output_shape({4, 2, 2, 2}), ConfigError);
  CHECK_THROWS_AS(bn.output_shape({4, 3}), ConfigError);
  // One value per channel cannot be normalised with batch statistics.
  LayerParams q = bn.init(3);
  CHECK_THROWS_AS(bn.forward(q, Tensor::zeros({1, 3, 1, 1}), saved, {Mode::Train, 0}), Error);
  CHECK_NOTHROW(bn.forward(q, Tensor::zeros({1, 3, 1, 1}), saved, {Mode::Eval, 0}));
  CHECK_THROWS_AS(BatchNorm2d("bn", 3, 1e-5f, 1.5f), ConfigError);
}

}  // namespace test_norm
