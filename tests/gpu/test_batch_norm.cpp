// CUDA batch norm against the CPU op: training forward (y, the saved mean and rstd, the running
// estimates updated with momentum and the unbiased variance), evaluation forward, and the
// backward in both modes with dweight and dbias accumulated into non-zero gradients; optional
// outputs left out; H = W = 1 (batch norm after a linear layer), odd sizes, batch 1 with a plane,
// an empty evaluation batch; the reductions reproduce their bits; mixed devices are refused.
#include <pipeline/ops/norm.hpp>

#include "gpu_compare.hpp"

#include <doctest/doctest.h>

#include <cmath>

namespace test_batch_norm {

using namespace pipeline;
using namespace pipeline::gpu_test;

namespace {

struct Case {
  std::int64_t n, c, h, w;
};
constexpr Case kCases[] = {{64, 32, 28, 28}, {64, 64, 14, 14}, {1, 3, 7, 9},    {5, 7, 1, 1},
                           {2, 1, 33, 17},   {3, 130, 5, 5},   {128, 16, 1, 3}, {2, 5, 64, 64}};
constexpr float kEps = 1e-5f, kMomentum = 0.1f;
constexpr double kTol = 1e-5;

}  // namespace

TEST_CASE("batch norm on CUDA matches the CPU in training and evaluation") {
  for (const Case c : kCases) {
    CAPTURE(c.n);
    CAPTURE(c.c);
    CAPTURE(c.h);
    CAPTURE(c.w);
    const auto seed = static_cast<std::uint64_t>(c.n * 7919 + c.c * 31 + c.h * 7 + c.w);
    const Shape xs{c.n, c.c, c.h, c.w}, cs{c.c};
    // A mean of about 3 beside a spread of 2: the variance must be computed centred.
    const Tensor x = random_tensor(xs, seed, 1.f, 5.f);
    const Tensor w = random_tensor(cs, seed + 1, 0.5f, 1.5f), b = random_tensor(cs, seed + 2);
    const Tensor rm0 = random_tensor(cs, seed + 3), rv0 = random_tensor(cs, seed + 4, 0.5f, 2.f);
    const Tensor dy = random_tensor(xs, seed + 5);
    const Tensor dw0 = random_tensor(cs, seed + 6), db0 = random_tensor(cs, seed + 7);
    const Tensor xg = x.to(kGpu), wg = w.to(kGpu), bg = b.to(kGpu), dyg = dy.to(kGpu);

    // Training forward.
    Tensor y = Tensor::empty(xs), mean = Tensor::empty(cs), rstd = Tensor::empty(cs);
    Tensor rm = rm0.clone(), rv = rv0.clone();
    ops::batch_norm_forward_train(x, w, b, kEps, kMomentum, rm, rv, y, mean, rstd);
    Tensor yg = poisoned(xs), mg = poisoned(cs), sg = poisoned(cs);
    Tensor rmg = rm0.to(kGpu), rvg = rv0.to(kGpu);
    ops::batch_norm_forward_train(xg, wg, bg, kEps, kMomentum, rmg, rvg, yg, mg, sg);
    expect_close("train y", y, yg, kTol);
    expect_close("train mean", mean, mg, kTol);
    expect_close("train rstd", rstd, sg, kTol);
    expect_close("running_mean", rm, rmg, kTol);
    expect_close("running_var", rv, rvg, kTol);

    // Training backward from the CPU's statistics, gradients accumulated.
    const Tensor mean_g = mean.to(kGpu), rstd_g = rstd.to(kGpu);
    Tensor dx = Tensor::empty(xs), dw = dw0.clone(), db = db0.clone();
    ops::batch_norm_backward(x, w, mean, rstd, dy, true, &dx, &dw, &db);
    Tensor dxg = poisoned(xs), dwg = dw0.to(kGpu), dbg = db0.to(kGpu);
    ops::batch_norm_backward(xg, wg, mean_g, rstd_g, dyg, true, &dxg, &dwg, &dbg);
    expect_close("train dx", dx, dxg, kTol);
    expect_close("dweight (accumulated)", dw, dwg, kTol);
    expect_close("dbias (accumulated)", db, dbg, kTol);

    // Optional outputs alone give the same bits; a rerun gives the same bits.
    Tensor dx_only = poisoned(xs);
    ops::batch_norm_backward(xg, wg, mean_g, rstd_g, dyg, true, &dx_only, nullptr, nullptr);
    expect_equal("dx alone", host(dxg), dx_only);
    Tensor dw_only = dw0.to(kGpu);
    ops::batch_norm_backward(xg, wg, mean_g, rstd_g, dyg, true, nullptr, &dw_only, nullptr);
    expect_equal("dweight alone", host(dwg), dw_only);
    Tensor db_only = db0.to(kGpu);
    ops::batch_norm_backward(xg, wg, mean_g, rstd_g, dyg, true, nullptr, nullptr, &db_only);
    expect_equal("dbias alone", host(dbg), db_only);

    // Evaluation forward and backward (statistics are constants).
    Tensor ye = Tensor::empty(xs), me = Tensor::empty(cs), se = Tensor::empty(cs);
    ops::batch_norm_forward_eval(x, w, b, kEps, rm0, rv0, ye, me, se);
    Tensor yeg = poisoned(xs), meg = poisoned(cs), seg = poisoned(cs);
    ops::batch_norm_forward_eval(xg, wg, bg, kEps, rm0.to(kGpu), rv0.to(kGpu), yeg, meg, seg);
    expect_close("eval y", ye, yeg, kTol);
    expect_equal("eval mean", me, meg);
    expect_close("eval rstd", se, seg, kTol);
    Tensor dxe = Tensor::empty(xs), dwe = dw0.clone(), dbe = db0.clone();
    ops::batch_norm_backward(x, w, me, se, dy, false, &dxe, &dwe, &dbe);
    Tensor dxeg = poisoned(xs), dweg = dw0.to(kGpu), dbeg = db0.to(kGpu);
    ops::batch_norm_backward(xg, wg, me.to(kGpu), se.to(kGpu), dyg, false, &dxeg, &dweg, &dbeg);
    expect_close("eval dx", dxe, dxeg, kTol);
    expect_close("eval dweight", dwe, dweg, kTol);
    expect_close("eval dbias", dbe, dbeg, kTol);
  }
}

TEST_CASE("batch norm on CUDA: checks, an empty evaluation batch, and mixed devices") {
  const Shape cs{3};
  const Tensor w = Tensor::full(cs, 1.f, kGpu), b = Tensor::zeros(cs, DType::Float32, kGpu);
  Tensor rm = Tensor::zeros(cs, DType::Float32, kGpu), rv = Tensor::full(cs, 1.f, kGpu);
  Tensor mean = poisoned(cs), rstd = poisoned(cs);
  // One value per channel cannot be normalised by batch statistics.
  Tensor one = random_tensor(Shape{1, 3, 1, 1}, 1).to(kGpu), y1 = poisoned(Shape{1, 3, 1, 1});
  CHECK_THROWS_WITH(
      ops::batch_norm_forward_train(one, w, b, kEps, kMomentum, rm, rv, y1, mean, rstd),
      doctest::Contains("more than one value per channel"));
  // An empty batch in evaluation still writes the statistics.
  Tensor empty = Tensor::empty(Shape{0, 3, 4, 4}, DType::Float32, kGpu);
  Tensor y0 = Tensor::empty(Shape{0, 3, 4, 4}, DType::Float32, kGpu);
  ops::batch_norm_forward_eval(empty, w, b, kEps, rm, rv, y0, mean, rstd);
  expect_equal("mean", Tensor::zeros(cs), mean);
  expect_close("rstd", Tensor::full(cs, 1.f / std::sqrt(1.f + kEps)), rstd, 1e-7);

  const Tensor x = random_tensor(Shape{2, 3, 2, 2}, 2);
  Tensor y = Tensor::empty(x.shape());
  CHECK_THROWS_WITH_AS(
      ops::batch_norm_forward_train(x, w, b, kEps, kMomentum, rm, rv, y, mean, rstd),
      doctest::Contains("batch_norm_forward_train: its tensors are on cpu and cuda:0"),
      ConfigError);
}

}  // namespace test_batch_norm
