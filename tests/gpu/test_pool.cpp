// CUDA pooling against the CPU op: max pool values and int32 indices exactly (ties keep the first
// maximum, NaN propagates), its gradient bit for bit through both backward forms (with and
// without the window) including overlapping windows, average pooling with padding, global
// average pooling; fashion-cnn's 2x2/2 pool, odd sizes, stride 1 and 2, batch 1, an empty batch;
// mixed devices are refused.
#include <pipeline/ops/pool.hpp>

#include "gpu_compare.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>

namespace test_pool {

using namespace pipeline;
using namespace pipeline::gpu_test;

namespace {

struct Case {
  std::int64_t n, c, h, w;
  ops::Window2d window;
};

const Case kCases[] = {
    {64, 32, 28, 28, ops::Window2d::square(2, 2)},   // fashion-cnn pool1
    {64, 64, 14, 14, ops::Window2d::square(2, 2)},   // fashion-cnn pool2
    {1, 3, 7, 9, ops::Window2d::square(2, 2)},       // odd sizes: the last row/column dropped
    {2, 5, 13, 11, ops::Window2d::square(3, 2, 1)},  // overlapping windows with padding (resnet)
    {3, 4, 9, 8, ops::Window2d::square(3, 1, 1)},    // stride 1: up to 9 windows per element
    {2, 3, 10, 7, {3, 2, 2, 1, 1, 0}},               // rectangular
    {1, 1, 1, 1, ops::Window2d::square(1)},
    {0, 3, 8, 8, ops::Window2d::square(2, 2)},  // empty batch
    {4, 17, 33, 31, ops::Window2d::square(5, 3, 2)},
    {2, 3, 11, 10, ops::Window2d::square(2, 3)},   // gaps between windows (stride past the kernel)
    {2, 4, 9, 9, ops::Window2d::square(2, 2, 1)},  // padded windows that do not overlap
    {3, 2, 8, 12, {2, 3, 2, 3, 0, 0}},             // rectangular, exactly tiled
    {2, 3, 8, 9, ops::Window2d::square(2, 2)},     // rows tiled, the last column in no window
    {2, 3, 11, 10, ops::Window2d::square(2, 3, 1)},  // gaps between padded windows
};

// Values on a coarse grid (multiples of 1/8 in [-2, 2)) so that windows hold ties.
Tensor tied_tensor(const Shape& shape, std::uint64_t seed) {
  Tensor t = random_tensor(shape, seed, -2.f, 2.f);
  for (float& v : t.values()) v = static_cast<float>(static_cast<int>(v * 8.f)) / 8.f + 1.f / 16;
  return t;
}

}  // namespace

TEST_CASE("max pool on CUDA: the CPU's maxima and indices, and its gradient bit for bit") {
  for (const Case& c : kCases) {
    CAPTURE(c.n);
    CAPTURE(c.c);
    CAPTURE(c.h);
    CAPTURE(c.w);
    CAPTURE(c.window.kernel_h);
    CAPTURE(c.window.stride_h);
    CAPTURE(c.window.pad_h);
    const Shape xs{c.n, c.c, c.h, c.w};
    const Shape ys = ops::pool2d_output_shape(xs, c.window);
    const auto seed = static_cast<std::uint64_t>(c.n * 401 + c.c * 31 + c.h);
    for (const bool ties : {false, true}) {
      CAPTURE(ties);
      const Tensor x = ties ? tied_tensor(xs, seed) : random_tensor(xs, seed);
      const Tensor dy = random_tensor(ys, seed + 1);
      Tensor y = Tensor::empty(ys), idx = Tensor::empty(ys, DType::Int32);
      ops::max_pool2d_forward(x, y, idx, c.window);
      Tensor yg = poisoned(ys);
      Tensor idxg = Tensor::empty(ys, DType::Int32, kGpu);
      ops::max_pool2d_forward(x.to(kGpu), yg, idxg, c.window);
      expect_equal("y", y, yg);
      expect_equal("indices", idx, idxg);

      Tensor dx = Tensor::empty(xs);
      ops::max_pool2d_backward(dy, idx, dx);
      Tensor dxg = poisoned(xs);
      ops::max_pool2d_backward(dy.to(kGpu), idxg, dxg, c.window);
      expect_equal("dx (gather)", dx, dxg);
      Tensor dxg_scatter = poisoned(xs);
      ops::max_pool2d_backward(dy.to(kGpu), idxg, dxg_scatter);
      expect_equal("dx (scatter)", dx, dxg_scatter);
      // The CPU's window form equals its plain form.
      Tensor dx_window = Tensor::empty(xs);
      ops::max_pool2d_backward(dy, idx, dx_window, c.window);
      expect_equal("dx (CPU with the window)", dx, dx_window);
    }
  }
}

TEST_CASE("max pool on CUDA: NaN propagates and -inf windows keep their first position") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor x = Tensor::from_vector(Shape{1, 1, 2, 4}, {1.f, nan, -inf, -inf,  //
                                                           3.f, 2.f, -inf, -inf});
  const ops::Window2d win = ops::Window2d::square(2, 2);
  Tensor y = Tensor::empty(Shape{1, 1, 1, 2}), idx = Tensor::empty(Shape{1, 1, 1, 2}, DType::Int32);
  ops::max_pool2d_forward(x, y, idx, win);
  Tensor yg = poisoned(Shape{1, 1, 1, 2});
  Tensor idxg = Tensor::empty(Shape{1, 1, 1, 2}, DType::Int32, kGpu);
  ops::max_pool2d_forward(x.to(kGpu), yg, idxg, win);
  expect_equal("indices", idx, idxg);
  const Tensor yh = host(yg);
  CHECK(std::isnan(yh.data<float>()[0]));
  CHECK(yh.data<float>()[1] == -inf);
  CHECK(idx.data<std::int32_t>()[0] == 1);
  CHECK(idx.data<std::int32_t>()[1] == 2);
}

TEST_CASE("max pool backward on CUDA refuses indices outside the plane (window-less form)") {
  const Tensor dy = random_tensor(Shape{1, 1, 2, 2}, 3).to(kGpu);
  const Tensor bad = Tensor::from_ints(Shape{1, 1, 2, 2}, {0, 1, 16, 3}).to(kGpu);
  Tensor dx = poisoned(Shape{1, 1, 4, 4});
  CHECK_THROWS_WITH(ops::max_pool2d_backward(dy, bad, dx),
                    doctest::Contains("indices outside a 4x4 plane"));
}

TEST_CASE("average pools on CUDA match the CPU") {
  for (const Case& c : kCases) {
    CAPTURE(c.n);
    CAPTURE(c.c);
    CAPTURE(c.h);
    CAPTURE(c.w);
    CAPTURE(c.window.kernel_h);
    const Shape xs{c.n, c.c, c.h, c.w};
    const Shape ys = ops::pool2d_output_shape(xs, c.window);
    const auto seed = static_cast<std::uint64_t>(c.n * 409 + c.c * 37 + c.w);
    const Tensor x = random_tensor(xs, seed), dy = random_tensor(ys, seed + 1);
    Tensor y = Tensor::empty(ys);
    ops::avg_pool2d_forward(x, y, c.window);
    Tensor yg = poisoned(ys);
    ops::avg_pool2d_forward(x.to(kGpu), yg, c.window);
    // Same additions in the same order; only a fused multiply-add on either side could differ.
    expect_close("avg y", y, yg, 1e-6);
    Tensor dx = Tensor::empty(xs);
    ops::avg_pool2d_backward(dy, dx, c.window);
    Tensor dxg = poisoned(xs);
    ops::avg_pool2d_backward(dy.to(kGpu), dxg, c.window);
    expect_close("avg dx", dx, dxg, 1e-6);

    if (c.h * c.w == 0) continue;
    const Shape gs{c.n, c.c};
    Tensor g = Tensor::empty(gs);
    ops::global_avg_pool_forward(x, g);
    Tensor gg = poisoned(gs);
    ops::global_avg_pool_forward(x.to(kGpu), gg);
    expect_close("global y", g, gg, 1e-6);
    const Tensor gdy = random_tensor(gs, seed + 2);
    Tensor gdx = Tensor::empty(xs);
    ops::global_avg_pool_backward(gdy, gdx);
    Tensor gdxg = poisoned(xs);
    ops::global_avg_pool_backward(gdy.to(kGpu), gdxg);
    expect_equal("global dx", gdx, gdxg);
  }
}

TEST_CASE("pooling given tensors on two devices names both") {
  const Tensor x = random_tensor(Shape{1, 1, 4, 4}, 1);
  Tensor y = poisoned(Shape{1, 1, 2, 2});
  Tensor idx = Tensor::empty(Shape{1, 1, 2, 2}, DType::Int32, kGpu);
  CHECK_THROWS_WITH_AS(ops::max_pool2d_forward(x, y, idx, ops::Window2d::square(2, 2)),
                       doctest::Contains("max_pool2d_forward: its tensors are on cpu and cuda:0"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(ops::avg_pool2d_forward(x, y, ops::Window2d::square(2, 2)),
                       doctest::Contains("avg_pool2d_forward: its tensors are on cpu and cuda:0"),
                       ConfigError);
}

}  // namespace test_pool
