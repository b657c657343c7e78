#include <pipeline/core/rng.hpp>
#include <pipeline/core/threads.hpp>
#include <pipeline/nn/layers/linear.hpp>
#include <pipeline/ops/optimizer_update.hpp>
#include <pipeline/optim/adamw.hpp>
#include <pipeline/optim/flatten.hpp>
#include <pipeline/optim/sgd.hpp>

#include <Eigen/Core>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

namespace test_optimizer {

using namespace pipeline;

namespace {

// One scalar parameter p with a gradient sequence; returns p after each step.
std::vector<float> run_scalar(Optimizer& opt, float p0, const std::vector<float>& grads, float lr) {
  std::vector<Tensor> p{Tensor::full({1}, p0)};
  std::vector<float> out;
  for (float g : grads) {
    std::vector<Tensor> gt{Tensor::full({1}, g)};
    opt.step(p, gt, lr);
    out.push_back(p[0].values()[0]);
  }
  return out;
}

// Independent double-precision reference of torch.optim.AdamW for a gradient function g(p, t).
template <typename GradFn>
std::vector<double> adamw_reference(double p, int steps, double lr, double b1, double b2,
                                    double eps, double wd, GradFn grad) {
  double m = 0, v = 0;
  std::vector<double> out;
  for (int t = 1; t <= steps; ++t) {
    double g = grad(p, t);
    p *= 1 - lr * wd;
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    double mhat = m / (1 - std::pow(b1, t)), vhat = v / (1 - std::pow(b2, t));
    p -= lr * mhat / (std::sqrt(vhat) + eps);
    out.push_back(p);
  }
  return out;
}

bool all_zero(const std::vector<Tensor>& ts) {
  for (const Tensor& t : ts)
    if (!std::all_of(t.data<float>(), t.data<float>() + t.numel(),
                     [](float x) { return x == 0.f && !std::signbit(x); }))
      return false;
  return true;
}

}  // namespace

TEST_CASE("SGD without momentum is p -= lr (g + wd p)") {
  Sgd plain;
  auto p = run_scalar(plain, 1.f, {1.f, 1.f}, 0.1f);
  CHECK(p[0] == doctest::Approx(0.9));
  CHECK(p[1] == doctest::Approx(0.8));
  CHECK(plain.buffer_names().empty());

  Sgd decay({.weight_decay = 0.5f});
  // p1 = 1 - 0.1 (1 + 0.5) = 0.85; p2 = 0.85 - 0.1 (1 + 0.425) = 0.7075
  p = run_scalar(decay, 1.f, {1.f, 1.f}, 0.1f);
  CHECK(p[0] == doctest::Approx(0.85));
  CHECK(p[1] == doctest::Approx(0.7075));
}

TEST_CASE("SGD momentum follows PyTorch: the buffer starts as the first gradient") {
  Sgd opt({.momentum = 0.9f});
  // buf: 1, 1.9, 2.71 → p: 0.9, 0.71, 0.439
  auto p = run_scalar(opt, 1.f, {1.f, 1.f, 1.f}, 0.1f);
  CHECK(p[0] == doctest::Approx(0.9));
  CHECK(p[1] == doctest::Approx(0.71));
  CHECK(p[2] == doctest::Approx(0.439));
  CHECK(opt.state()[0].step == 3);
  CHECK(opt.state()[0].buffers[0].values()[0] == doctest::Approx(2.71));

  // Dampening applies from the second step on: buf 1, 0.9 + 0.5 = 1.4 → p 0.9, 0.76
  Sgd damp({.momentum = 0.9f, .dampening = 0.5f});
  p = run_scalar(damp, 1.f, {1.f, 1.f}, 0.1f);
  CHECK(p[0] == doctest::Approx(0.9));
  CHECK(p[1] == doctest::Approx(0.76));
}

TEST_CASE("SGD Nesterov with weight decay") {
  Sgd nesterov({.momentum = 0.9f, .nesterov = true});
  // step 1: buf 1, d = 1 + 0.9 = 1.9, p = 0.81; step 2: buf 1.9, d = 1 + 1.71 = 2.71, p = 0.539
  auto p = run_scalar(nesterov, 1.f, {1.f, 1.f}, 0.1f);
  CHECK(p[0] == doctest::Approx(0.81));
  CHECK(p[1] == doctest::Approx(0.539));

  Sgd both({.momentum = 0.9f, .weight_decay = 0.1f, .nesterov = true});
  // step 1: g' = 1 + 0.1 = 1.1, buf 1.1, d = 1.1 + 0.99 = 2.09, p = 0.791
  // step 2: g' = 2 + 0.0791 = 2.0791, buf = 0.99 + 2.0791 = 3.0691, d = 2.0791 + 2.76219 = 4.84129,
  //         p = 0.791 - 0.484129 = 0.306871
  p = run_scalar(both, 1.f, {1.f, 2.f}, 0.1f);
  CHECK(p[0] == doctest::Approx(0.791));
  CHECK(p[1] == doctest::Approx(0.306871));

  CHECK_THROWS_AS(Sgd({.momentum = 0.f, .nesterov = true}), ConfigError);
  CHECK_THROWS_AS(Sgd({.momentum = 0.9f, .dampening = 0.1f, .nesterov = true}), ConfigError);
}

TEST_CASE("AdamW with a constant gradient moves by lr per step after decay") {
  // With g constant, the bias-corrected m̂/√v̂ is exactly g/|g| (up to eps): p ← p(1 − lr wd) − lr.
  AdamW opt({.weight_decay = 0.01f});
  auto p = run_scalar(opt, 1.f, {0.5f, 0.5f, 0.5f}, 0.1f);
  CHECK(p[0] == doctest::Approx(0.899).epsilon(1e-6));
  CHECK(p[1] == doctest::Approx(0.798101).epsilon(1e-6));
  CHECK(p[2] == doctest::Approx(0.798101 * 0.999 - 0.1).epsilon(1e-6));
  CHECK(opt.state()[0].step == 3);
}

TEST_CASE("AdamW matches a double reference on a varying gradient") {
  const double lr = 0.05, b1 = 0.8, b2 = 0.95, eps = 1e-6, wd = 0.1;
  auto grad = [](double p, int t) { return 2.0 * p + std::sin(static_cast<double>(t)); };
  auto ref = adamw_reference(1.5, 6, lr, b1, b2, eps, wd, grad);

  AdamW opt({.beta1 = 0.8f, .beta2 = 0.95f, .eps = 1e-6f, .weight_decay = 0.1f});
  std::vector<Tensor> p{Tensor::full({1}, 1.5f)};
  for (int t = 1; t <= 6; ++t) {
    std::vector<Tensor> g{Tensor::full({1}, static_cast<float>(grad(p[0].values()[0], t)))};
    opt.step(p, g, static_cast<float>(lr));
    CHECK(p[0].values()[0] == doctest::Approx(ref[t - 1]).epsilon(1e-5));
  }
}

TEST_CASE("Adam with L2 decay adds the decay to the gradient") {
  // step 1: g' = 0.5 + 0.1·1 = 0.6, m̂/√v̂ = 1 → p = 1 − 0.1 = 0.9 (no multiplicative decay)
  AdamW adam({.weight_decay = 0.1f, .decoupled = false});
  CHECK(adam.kind() == "adam");
  auto p = run_scalar(adam, 1.f, {0.5f}, 0.1f);
  CHECK(p[0] == doctest::Approx(0.9).epsilon(1e-6));
}

TEST_CASE("Vectorised updates equal the scalar rule on a large tensor") {
  const std::int64_t n = 300'001;  // large enough to be split into chunks, odd length
  Tensor w = Tensor::empty({n}), g = Tensor::empty({n});
  Rng rng(7);
  rng.fill_normal(w, 0.f, 1.f);
  rng.fill_normal(g, 0.f, 1.f);
  Tensor w0 = w.clone();
  std::vector<Tensor> ps{w}, gs{g};
  Sgd sgd({.momentum = 0.9f, .weight_decay = 0.01f, .nesterov = true});
  sgd.step(ps, gs, 0.1f);
  sgd.step(ps, gs, 0.1f);
  for (std::int64_t i : {std::int64_t{0}, std::int64_t{65'537}, n / 2, n - 1}) {
    double p = w0.values()[i], gi = g.values()[i];
    double gd = gi + 0.01 * p, buf = gd;
    p -= 0.1 * (gd + 0.9 * buf);
    gd = gi + 0.01 * p;
    buf = 0.9 * buf + gd;
    p -= 0.1 * (gd + 0.9 * buf);
    CHECK(w.values()[i] == doctest::Approx(p).epsilon(1e-5));
  }
}

TEST_CASE("Optimizer state is lazy, keyed by position and checked") {
  Sgd opt({.momentum = 0.5f});
  CHECK(opt.state().empty());
  std::vector<Tensor> p{Tensor::full({2, 3}, 1.f), Tensor::full({4}, 1.f)};
  std::vector<Tensor> g{Tensor::full({2, 3}, 1.f), Tensor::full({4}, 1.f)};
  opt.step(p, g, 0.1f);
  REQUIRE(opt.state().size() == 2);
  CHECK(opt.state()[1].shape == Shape{4});

  std::vector<Tensor> p_other{Tensor::full({2, 3}, 1.f), Tensor::full({5}, 1.f)};
  std::vector<Tensor> g_other{Tensor::full({2, 3}, 1.f), Tensor::full({5}, 1.f)};
  CHECK_THROWS_WITH_AS(opt.step(p_other, g_other, 0.1f),
                       doctest::Contains("parameter 1 has shape [5]"), Error);
  std::vector<Tensor> p_short{p[0]}, g_short{g[0]};
  CHECK_THROWS_AS(opt.step(p_short, g_short, 0.1f), Error);
  std::vector<Tensor> g_bad{Tensor::full({3, 2}, 1.f), g[1]};
  CHECK_THROWS_AS(opt.step(p, g_bad, 0.1f), Error);
}

TEST_CASE("Optimizer state saves and restores to continue the same trajectory") {
  auto make = [] {
    return std::vector<Tensor>{Tensor::from_vector({2, 2}, {1, -2, 3, 0.5f}),
                               Tensor::from_vector({3}, {0.1f, 0.2f, -0.3f})};
  };
  auto grads = [](int t) {
    float s = static_cast<float>(t);
    return std::vector<Tensor>{Tensor::from_vector({2, 2}, {s, -1, 0.5f * s, 2}),
                               Tensor::from_vector({3}, {1, -s, 0.25f})};
  };
  std::vector<std::string> names{"fc.weight", "fc.bias"};

  // Reference: 5 uninterrupted steps.
  AdamW ref;
  auto pr = make();
  for (int t = 0; t < 5; ++t) ref.step(pr, grads(t), 0.01f);

  // Interrupted after 3 steps; the state goes through named (deep-copied) tensors.
  AdamW first;
  auto pi = make();
  for (int t = 0; t < 3; ++t) first.step(pi, grads(t), 0.01f);
  NamedTensors saved;
  for (auto& [name, t] : first.state_tensors(names)) saved.emplace_back(name, t.clone());
  CHECK(saved.size() == 6);
  CHECK(saved[0].first == "fc.weight.step");
  CHECK(saved[1].first == "fc.weight.exp_avg");
  CHECK(saved[5].first == "fc.bias.exp_avg_sq");

  AdamW second;
  std::vector<Shape> shapes{{2, 2}, {3}};
  second.load_state_tensors(saved, shapes, names);
  CHECK(second.state()[0].step == 3);
  for (int t = 3; t < 5; ++t) second.step(pi, grads(t), 0.01f);
  for (int k = 0; k < 2; ++k) CHECK(pi[k].to_vector() == pr[k].to_vector());

  // Position-keyed names when none are given.
  CHECK(first.state_tensors()[0].first == "0.step");

  // Missing and mis-shaped tensors are named.
  NamedTensors broken(saved.begin() + 1, saved.end());
  broken[0].second = Tensor::zeros({4});
  AdamW third;
  CHECK_THROWS_WITH_AS(third.load_state_tensors(broken, shapes, names),
                       doctest::Contains("'fc.weight.step' is missing"), IoError);
  CHECK_THROWS_WITH_AS(third.load_state_tensors(broken, shapes, names),
                       doctest::Contains("'fc.weight.exp_avg' has shape [4]"), IoError);
  CHECK(third.state().empty());
}

TEST_CASE("Flattened model parameters share storage with the model") {
  Sequential model("m");
  model.emplace<Linear>("fc1", 3, 2).emplace<Linear>("fc2", 2, 1);
  ModelParams params = model.init(1);
  ModelGrads grads = model.zero_grads(model.all());
  auto flat = flatten_params(params);
  auto gflat = flatten_grads(grads);
  REQUIRE(flat.size() == 4);
  CHECK(gflat.size() == 4);
  CHECK(parameter_names(model, model.all()) ==
        std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"});
  CHECK(parameter_shapes(model, {1, 2}) == std::vector<Shape>{{1, 2}, {1}});
  for (auto& g : gflat) g.fill(1.f);
  const float before = params[1].params[0].values()[0];
  Sgd opt;
  opt.step(flat, gflat, 0.5f);
  CHECK(params[1].params[0].values()[0] == doctest::Approx(before - 0.5f));
  CHECK(grads[0][1].values()[0] == 1.f);
}

TEST_CASE("sum_of_squares: float block sums added in double, the same bits on any thread count") {
  // Sizes around the 1024-float block and the per-thread share, and a large tensor that is
  // split over the threads.
  const int before = num_threads();
  for (std::int64_t n : {std::int64_t{1}, std::int64_t{1023}, std::int64_t{1025},
                         std::int64_t{65'536 * 3 + 17}, std::int64_t{3'000'007}}) {
    CAPTURE(n);
    Tensor x = Tensor::empty({n});
    Rng(static_cast<std::uint64_t>(n), "sum_of_squares").fill_normal(x, 0.5f, 2.f);
    // The definition, serially: each block's float sum, added up in block order in double. (Its
    // float rounding depends on how this file is compiled, fused multiply-adds or not, so it is
    // matched to float precision; the bits are compared across thread counts.)
    const float* p = x.data<float>();
    double definition = 0, exact = 0;
    for (std::int64_t i = 0; i < n; i += 1024) {
      const auto len = static_cast<Eigen::Index>(std::min<std::int64_t>(1024, n - i));
      definition +=
          static_cast<double>(Eigen::Map<const Eigen::ArrayXf>(p + i, len).square().sum());
    }
    for (std::int64_t i = 0; i < n; ++i) exact += static_cast<double>(p[i]) * p[i];
    set_num_threads(1);
    const double serial = ops::sum_of_squares(x);
    CHECK(serial == doctest::Approx(definition).epsilon(1e-6));
    CHECK(serial == doctest::Approx(exact).epsilon(1e-6));
    for (int threads : {2, 3, 8}) {
      CAPTURE(threads);
      set_num_threads(threads);
      CHECK(ops::sum_of_squares(x) == serial);
    }
  }
  set_num_threads(before);
}

TEST_CASE("Updates, sums of squares and zeroing of many tensors at once equal them one by one") {
  // A model's mix: tiny biases, tensors around the 16-float alignment and the per-thread share,
  // one large enough to be split, an empty one. The many-tensor forms share one region between
  // all of them; every element must come out with the same bits as the per-tensor forms give.
  const std::vector<std::int64_t> sizes = {1, 10, 17, 1023, 0, 65'536 + 5, 250'001, 3};
  const int before = num_threads();
  auto random = [&](std::uint64_t seed) {
    std::vector<Tensor> ts;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      ts.push_back(Tensor::empty({sizes[i]}));
      Rng(seed + i, "many").fill_normal(ts.back(), 0.f, 1.f);
    }
    return ts;
  };
  auto clones = [](const std::vector<Tensor>& ts) {
    std::vector<Tensor> out;
    for (const Tensor& t : ts) out.push_back(t.clone());
    return out;
  };
  auto same_bits = [](const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
    for (std::size_t i = 0; i < a.size(); ++i)
      if (std::memcmp(a[i].raw(), b[i].raw(), a[i].nbytes()) != 0) return false;
    return true;
  };
  const std::vector<Tensor> w0 = random(1), g = random(100), m0 = random(200), v0 = random(300);
  std::vector<Tensor> v_abs = clones(v0);  // Adam's second moments are never negative
  for (Tensor& v : v_abs)
    std::for_each(v.data<float>(), v.data<float>() + v.numel(), [](float& x) { x = std::abs(x); });
  for (int threads : {1, 2, 3, 4}) {
    CAPTURE(threads);
    set_num_threads(threads);
    for (bool first : {true, false}) {
      const ops::SgdParams sp{
          .lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f, .nesterov = true};
      std::vector<Tensor> w1 = clones(w0), b1 = clones(m0), w2 = clones(w0), b2 = clones(m0);
      for (std::size_t i = 0; i < sizes.size(); ++i)
        ops::sgd_update(w1[i], g[i], &b1[i], first, sp);
      std::vector<Tensor*> buffers;
      for (Tensor& b : b2) buffers.push_back(&b);
      ops::sgd_update_many(w2, g, buffers, first, sp);
      CHECK(same_bits(w1, w2));
      CHECK(same_bits(b1, b2));
      // With the tail: the same update, the gradients' sums of squares before it and the
      // gradients zeroed after, all in its pass.
      std::vector<Tensor> w3 = clones(w0), b3 = clones(m0), g3 = clones(g);
      buffers.clear();
      for (Tensor& b : b3) buffers.push_back(&b);
      std::vector<double> sums(sizes.size(), -1.0);
      ops::sgd_update_many(w3, g3, buffers, first, sp, {sums, true});
      CHECK(same_bits(w1, w3));
      CHECK(same_bits(b1, b3));
      CHECK(sums == ops::sums_of_squares(g));
      CHECK(all_zero(g3));
    }
    for (bool decoupled : {true, false}) {
      const ops::AdamWParams ap{.lr = 0.01f, .weight_decay = 0.1f, .decoupled = decoupled};
      std::vector<Tensor> w1 = clones(w0), m1 = clones(m0), v1 = clones(v_abs);
      std::vector<Tensor> w2 = clones(w0), m2 = clones(m0), v2 = clones(v_abs);
      for (std::size_t i = 0; i < sizes.size(); ++i)
        ops::adamw_update(w1[i], g[i], m1[i], v1[i], 3, ap);
      ops::adamw_update_many(w2, g, m2, v2, 3, ap);
      CHECK(same_bits(w1, w2));
      CHECK(same_bits(m1, m2));
      CHECK(same_bits(v1, v2));
      std::vector<Tensor> w3 = clones(w0), m3 = clones(m0), v3 = clones(v_abs), g3 = clones(g);
      std::vector<double> sums(sizes.size(), -1.0);
      ops::adamw_update_many(w3, g3, m3, v3, 3, ap, {sums, true});
      CHECK(same_bits(w1, w3));
      CHECK(same_bits(m1, m3));
      CHECK(same_bits(v1, v3));
      CHECK(sums == ops::sums_of_squares(g));
      CHECK(all_zero(g3));
      // A tail of sums alone leaves the gradients as they were.
      std::vector<Tensor> g4 = clones(g);
      w3 = clones(w0), m3 = clones(m0), v3 = clones(v_abs);
      ops::adamw_update_many(w3, g4, m3, v3, 3, ap, {sums, false});
      CHECK(same_bits(g4, g));
      CHECK(same_bits(w1, w3));
    }
    const std::vector<double> sums = ops::sums_of_squares(g);
    for (std::size_t i = 0; i < sizes.size(); ++i) CHECK(sums[i] == ops::sum_of_squares(g[i]));
    std::vector<Tensor> z = clones(g);
    zero_all(z);
    CHECK(all_zero(z));
  }
  set_num_threads(before);
}

TEST_CASE("An optimizer step that zeroes the gradients equals step, sum_of_squares and zero_all") {
  const std::vector<Shape> shapes = {{300, 70}, {70}, {5, 3}};
  for (int rule = 0; rule < 2; ++rule) {
    CAPTURE(rule);
    auto make = [rule]() -> std::unique_ptr<Optimizer> {
      if (rule == 0) return std::make_unique<Sgd>(SgdOptions{.momentum = 0.9f});
      return std::make_unique<AdamW>(AdamWOptions{});
    };
    auto plain = make(), fused = make();
    std::vector<Tensor> w1, w2;
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      w1.push_back(Tensor::empty(shapes[i]));
      Rng(i, "w").fill_normal(w1.back(), 0.f, 1.f);
      w2.push_back(w1.back().clone());
    }
    for (int step = 0; step < 3; ++step) {
      std::vector<Tensor> g1, g2;
      for (std::size_t i = 0; i < shapes.size(); ++i) {
        g1.push_back(Tensor::empty(shapes[i]));
        Rng(10 * step + i, "g").fill_normal(g1.back(), 0.f, 1.f);
        g2.push_back(g1.back().clone());
      }
      const std::vector<double> expected = ops::sums_of_squares(g1);
      plain->step(w1, g1, 0.05f);
      std::vector<double> sums(shapes.size(), -1.0);
      fused->step_and_zero(w2, g2, 0.05f, sums);
      CHECK(sums == expected);
      CHECK(all_zero(g2));
      for (std::size_t i = 0; i < shapes.size(); ++i) CHECK(w1[i].to_vector() == w2[i].to_vector());
    }
  }
}

}  // namespace test_optimizer
