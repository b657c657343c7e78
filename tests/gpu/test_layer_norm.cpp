// CUDA layer norm against the CPU op: forward (y, mean, rstd) and backward (dx, and the weight and
// bias gradients accumulated into), over widths on both sides of the kernels' register-cached
// limit (8192) and row counts that are not multiples of anything, with one and many row chunks in
// the parameter-gradient reduction; optional outputs left out; an empty batch.
#include <pipeline/ops/convert.hpp>
#include <pipeline/ops/norm.hpp>

#include "gpu_compare.hpp"

#include <doctest/doctest.h>

namespace test_layer_norm {

using namespace pipeline;
using namespace pipeline::gpu_test;

namespace {

struct Case {
  std::int64_t rows, features;
};
constexpr Case kCases[] = {{0, 8},     {1, 1},    {7, 3},     {33, 1000}, {1000, 7},
                           {65, 8192}, {5, 8193}, {3, 20000}, {2049, 64}, {100003, 10}};
constexpr float kEps = 1e-5f;

}  // namespace

TEST_CASE("layer norm on CUDA matches the CPU, forward and backward") {
  for (const Case c : kCases) {
    CAPTURE(c.rows);
    CAPTURE(c.features);
    const auto seed = static_cast<std::uint64_t>(c.rows * 7919 + c.features);
    const Shape xs{c.rows, c.features}, fs{c.features}, rs{c.rows};
    // A mean of about 3 next to a spread of 2: the variance must be computed centred.
    const Tensor x = random_tensor(xs, seed, 1.f, 5.f);
    const Tensor w = random_tensor(fs, seed + 1, 0.5f, 1.5f);
    const Tensor b = random_tensor(fs, seed + 2);
    const Tensor dy = random_tensor(xs, seed + 3);
    const Tensor dw0 = random_tensor(fs, seed + 4), db0 = random_tensor(fs, seed + 5);

    Tensor y = Tensor::empty(xs), mean = Tensor::empty(rs), rstd = Tensor::empty(rs);
    ops::layer_norm_forward(x, w, b, kEps, y, mean, rstd);
    Tensor dx = Tensor::empty(xs), dw = dw0.clone(), db = db0.clone();
    ops::layer_norm_backward(x, w, mean, rstd, dy, &dx, &dw, &db);

    const Tensor xg = x.to(kGpu), wg = w.to(kGpu);
    Tensor yg = poisoned(xs), mg = poisoned(rs), rg = poisoned(rs);
    ops::layer_norm_forward(xg, wg, b.to(kGpu), kEps, yg, mg, rg);
    expect_close("y", y, yg, 1e-5);
    expect_close("mean", mean, mg, 1e-5);
    expect_close("rstd", rstd, rg, 1e-5);

    // The backward takes the CPU's statistics, so it is checked on its own.
    Tensor dxg = poisoned(xs), dwg = dw0.to(kGpu), dbg = db0.to(kGpu);
    const Tensor mean_g = mean.to(kGpu), rstd_g = rstd.to(kGpu), dyg = dy.to(kGpu);
    ops::layer_norm_backward(xg, wg, mean_g, rstd_g, dyg, &dxg, &dwg, &dbg);
    // dx = rstd * (w * dy - its row mean - xhat * ...): one feature (xhat = 0) cancels to 0
    // exactly on the GPU and to rounding on the CPU; errors are measured against rstd * |w * dy|.
    double scale = 0;
    for (std::int64_t r = 0; c.features == 1 && r < c.rows; ++r)
      scale = std::max(scale, std::abs(static_cast<double>(rstd.data<float>()[r]) *
                                       w.data<float>()[0] * dy.data<float>()[r]));
    expect_close("dx", dx, dxg, 1e-4, scale);
    expect_close("dweight", dw, dwg, 1e-4);
    expect_close("dbias", db, dbg, 1e-4);

    // Optional outputs: each alone gives the same values.
    Tensor dx_only = poisoned(xs);
    ops::layer_norm_backward(xg, wg, mean_g, rstd_g, dyg, &dx_only, nullptr, nullptr);
    expect_equal("dx alone", host(dxg), dx_only);
    Tensor dw_only = dw0.to(kGpu);
    ops::layer_norm_backward(xg, wg, mean_g, rstd_g, dyg, nullptr, &dw_only, nullptr);
    expect_equal("dweight alone", host(dwg), dw_only);
    Tensor db_only = db0.to(kGpu);
    ops::layer_norm_backward(xg, wg, mean_g, rstd_g, dyg, nullptr, nullptr, &db_only);
    expect_equal("dbias alone", host(dbg), db_only);
  }
}

TEST_CASE("layer norm on CUDA written in bf16: the float32 y rounded, bit for bit") {
  for (const Case c : kCases) {
    CAPTURE(c.rows);
    CAPTURE(c.features);
    const auto seed = static_cast<std::uint64_t>(c.rows * 31 + c.features);
    const Shape xs{c.rows, c.features}, fs{c.features}, rs{c.rows};
    const Tensor xg = random_tensor(xs, seed, 1.f, 5.f).to(kGpu);
    const Tensor wg = random_tensor(fs, seed + 1, 0.5f, 1.5f).to(kGpu);
    const Tensor bg = random_tensor(fs, seed + 2).to(kGpu);
    Tensor y32 = poisoned(xs), m32 = poisoned(rs), r32 = poisoned(rs);
    ops::layer_norm_forward(xg, wg, bg, kEps, y32, m32, r32);
    Tensor y16 = ops::to_dtype(poisoned(xs), DType::BFloat16), m16 = poisoned(rs),
           r16 = poisoned(rs);
    ops::layer_norm_forward(xg, wg, bg, kEps, y16, m16, r16);
    expect_equal("y in bf16", host(ops::to_dtype(y32, DType::BFloat16)), y16);
    expect_equal("mean", host(m32), m16);
    expect_equal("rstd", host(r32), r16);
  }
}

TEST_CASE("layer norm on CUDA: [B, T, D] input, and tensors on two devices") {
  const Tensor x = random_tensor(Shape{2, 37, 96}, 3, -2.f, 2.f);
  const Tensor w = random_tensor(Shape{96}, 4), b = random_tensor(Shape{96}, 5);
  Tensor y = Tensor::empty(x.shape()), mean = Tensor::empty(Shape{74}),
         rstd = Tensor::empty(Shape{74});
  ops::layer_norm_forward(x, w, b, kEps, y, mean, rstd);
  Tensor yg = poisoned(x.shape()), mg = poisoned(Shape{74}), rg = poisoned(Shape{74});
  ops::layer_norm_forward(x.to(kGpu), w.to(kGpu), b.to(kGpu), kEps, yg, mg, rg);
  expect_close("y", y, yg, 1e-5);

  CHECK_THROWS_WITH_AS(ops::layer_norm_forward(x.to(kGpu), w, b.to(kGpu), kEps, yg, mg, rg),
                       doctest::Contains("layer_norm_forward: its tensors are on cuda:0 and cpu"),
                       ConfigError);
}

}  // namespace test_layer_norm
