#include <pipeline/core/threads.hpp>
#include <pipeline/nn/layers/activation.hpp>
#include <pipeline/nn/layers/pool2d.hpp>
#include <pipeline/nn/sequential.hpp>
#include <pipeline/ops/pool.hpp>

#include "support/gradcheck.hpp"

#include <cmath>
#include <limits>

namespace test_pool {

using namespace pipeline;

namespace {

struct Case {
  Shape x;
  ops::Window2d win;
};

const std::vector<Case> cases = {
    {{2, 3, 8, 8}, {2, 2, 2, 2, 0, 0}},   // the common 2x2/2
    {{1, 5, 7, 9}, {3, 3, 2, 2, 1, 1}},   // batch 1, odd sizes, padding
    {{3, 2, 6, 5}, {3, 2, 1, 2, 1, 1}},   // non-square kernel and stride
    {{2, 3, 5, 7}, {2, 2, 2, 2, 0, 0}},   // 2x2/2 on odd extents (last row and column dropped)
    {{2, 2, 9, 6}, {4, 3, 3, 2, 2, 1}},   // larger kernel, stride 3
    {{1, 2, 6, 39}, {2, 2, 2, 2, 0, 0}},  // 2x2/2 rows of 19 outputs: a full vector and a tail
    {{1, 2, 3, 67}, {2, 2, 2, 2, 0, 0}},  // 2x2/2 rows of 33 outputs, odd extents
};

// Direct loops: max (first maximum on ties), average over kh·kw (padding counts as zero).
void reference(const Tensor& x, const ops::Window2d& k, Tensor& ymax, Tensor& imax, Tensor& yavg) {
  const auto N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3);
  const auto OH = k.out_h(H), OW = k.out_w(W);
  ymax = Tensor::empty({N, C, OH, OW});
  imax = Tensor::empty({N, C, OH, OW}, DType::Int32);
  yavg = Tensor::empty({N, C, OH, OW});
  for (std::int64_t p = 0; p < N * C; ++p)
    for (std::int64_t oh = 0; oh < OH; ++oh)
      for (std::int64_t ow = 0; ow < OW; ++ow) {
        float best = -std::numeric_limits<float>::infinity();
        std::int32_t at = -1;
        double sum = 0;
        for (std::int64_t i = 0; i < k.kernel_h; ++i)
          for (std::int64_t j = 0; j < k.kernel_w; ++j) {
            const auto ih = oh * k.stride_h - k.pad_h + i, iw = ow * k.stride_w - k.pad_w + j;
            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
            const float v = x.data<float>()[p * H * W + ih * W + iw];
            sum += v;
            if (at < 0 || v > best) {
              best = v;
              at = static_cast<std::int32_t>(ih * W + iw);
            }
          }
        const auto o = (p * OH + oh) * OW + ow;
        ymax.data<float>()[o] = best;
        imax.data<std::int32_t>()[o] = at;
        yavg.data<float>()[o] = static_cast<float>(sum / double(k.kernel_h * k.kernel_w));
      }
}

void expect_close(const Tensor& got, const Tensor& want, const char* what, double tol = 1e-6) {
  REQUIRE(got.shape() == want.shape());
  std::int64_t bad = 0;
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    if (!(std::abs(double(got.values()[i]) - want.values()[i]) <= tol)) {
      if (bad < 5)
        MESSAGE(what << "[" << i << "]: got " << got.values()[i] << " want " << want.values()[i]);
      ++bad;
    }
  }
  CHECK_MESSAGE(bad == 0, what << ": " << bad << " elements differ");
}

}  // namespace

TEST_CASE("pooling ops match direct loops") {
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (std::size_t k = 0; k < cases.size(); ++k) {
      CAPTURE(k);
      const Case& c = cases[k];
      Tensor x = testing::random_tensor(c.x, 40 + k);
      Tensor ymax_ref, imax_ref, yavg_ref;
      reference(x, c.win, ymax_ref, imax_ref, yavg_ref);
      const Shape ys = ops::pool2d_output_shape(c.x, c.win);
      REQUIRE(ys == ymax_ref.shape());

      Tensor y = Tensor::empty(ys), idx = Tensor::empty(ys, DType::Int32);
      ops::max_pool2d_forward(x, y, idx, c.win);
      expect_close(y, ymax_ref, "max forward", 0.0);
      CHECK(std::equal(idx.data<std::int32_t>(), idx.data<std::int32_t>() + idx.numel(),
                       imax_ref.data<std::int32_t>()));

      // Backward: dy routed to the argmax, summed where windows overlap.
      Tensor dy = testing::random_tensor(ys, 50 + k);
      Tensor dx = Tensor::full(c.x, 3.f);
      ops::max_pool2d_backward(dy, idx, dx);
      Tensor dx_ref = Tensor::zeros(c.x);
      const std::int64_t in_plane = c.x[2] * c.x[3], out_plane = ys[2] * ys[3];
      for (std::int64_t o = 0; o < dy.numel(); ++o)
        dx_ref.data<float>()[(o / out_plane) * in_plane + imax_ref.data<std::int32_t>()[o]] +=
            dy.data<float>()[o];
      expect_close(dx, dx_ref, "max backward", 1e-6);
      // The same through the window (the 2x2/2 windows write each row whole, no scatter).
      Tensor dxw = Tensor::full(c.x, 3.f);
      ops::max_pool2d_backward(dy, idx, dxw, c.win);
      expect_close(dxw, dx_ref, "max backward with the window", 1e-6);

      Tensor ya = Tensor::empty(ys);
      ops::avg_pool2d_forward(x, ya, c.win);
      expect_close(ya, yavg_ref, "avg forward", 1e-6);

      // Average backward is the adjoint of forward: <avg(x), dy> = <x, avg_backward(dy)>.
      Tensor dxa = Tensor::full(c.x, 3.f);
      ops::avg_pool2d_backward(dy, dxa, c.win);
      double lhs = 0, rhs = 0;
      for (std::int64_t i = 0; i < dy.numel(); ++i) lhs += double(ya.values()[i]) * dy.values()[i];
      for (std::int64_t i = 0; i < x.numel(); ++i) rhs += double(x.values()[i]) * dxa.values()[i];
      CHECK(lhs == doctest::Approx(rhs).epsilon(1e-5));
    }
  }
  set_num_threads(default_num_threads());
}

TEST_CASE("max pooling: padding never wins, ties take the first, NaN propagates") {
  Tensor x = Tensor::full({1, 1, 2, 2}, -5.f);
  x.data<float>()[3] = -1.f;
  Tensor y = Tensor::empty({1, 1, 3, 3}), idx = Tensor::empty({1, 1, 3, 3}, DType::Int32);
  ops::max_pool2d_forward(x, y, idx, {2, 2, 1, 1, 1, 1});  // border windows are half padding
  CHECK(y.to_vector() == std::vector<float>{-5.f, -5.f, -5.f, -5.f, -1.f, -1.f, -5.f, -1.f, -1.f});
  CHECK(std::vector<std::int32_t>(idx.data<std::int32_t>(), idx.data<std::int32_t>() + 9) ==
        std::vector<std::int32_t>{0, 0, 1, 0, 3, 3, 2, 3, 3});  // ties take the first
  // The same on the 2x2/2 path: ties keep the first element of each window.
  Tensor flat = Tensor::full({1, 1, 2, 40}, 1.5f);
  Tensor yf = Tensor::empty({1, 1, 1, 20}), ifl = Tensor::empty({1, 1, 1, 20}, DType::Int32);
  ops::max_pool2d_forward(flat, yf, ifl, ops::Window2d::square(2, 2));
  for (std::int32_t q = 0; q < 20; ++q) CHECK(ifl.data<std::int32_t>()[q] == 2 * q);
  Tensor z = Tensor::from_vector({1, 1, 2, 2}, {1.f, NAN, 3.f, 2.f});
  Tensor yz = Tensor::empty({1, 1, 1, 1}), iz = Tensor::empty({1, 1, 1, 1}, DType::Int32);
  ops::max_pool2d_forward(z, yz, iz, ops::Window2d::square(2, 2));
  CHECK(std::isnan(yz.values()[0]));
  // NaN inside full vectors of the 2x2/2 path: a NaN wins over any number and over an earlier
  // NaN of its window (as the scalar loop and PyTorch's CPU kernel decide).
  Tensor wide = testing::random_tensor({1, 1, 2, 40}, 7);
  float* w = wide.data<float>();
  w[5] = NAN;                // window 2, top row
  w[40 + 17] = NAN;          // window 8, bottom row
  w[30] = w[40 + 31] = NAN;  // window 15: top left and bottom right
  Tensor yw = Tensor::empty({1, 1, 1, 20}), iw = Tensor::empty({1, 1, 1, 20}, DType::Int32);
  ops::max_pool2d_forward(wide, yw, iw, ops::Window2d::square(2, 2));
  for (std::int32_t q = 0; q < 20; ++q) {
    CAPTURE(q);
    CHECK(std::isnan(yw.values()[q]) == (q == 2 || q == 8 || q == 15));
  }
  CHECK(iw.data<std::int32_t>()[2] == 5);
  CHECK(iw.data<std::int32_t>()[8] == 40 + 17);
  CHECK(iw.data<std::int32_t>()[15] == 40 + 31);
}

TEST_CASE("global average pooling") {
  Tensor x = testing::random_tensor({3, 5, 4, 7}, 9);
  Tensor y = Tensor::empty({3, 5});
  ops::global_avg_pool_forward(x, y);
  for (std::int64_t p = 0; p < 15; ++p) {
    double s = 0;
    for (std::int64_t k = 0; k < 28; ++k) s += x.values()[p * 28 + k];
    CHECK(y.values()[p] == doctest::Approx(s / 28).epsilon(1e-6));
  }
  testing::check_layer_gradients(GlobalAvgPool("gap"), {1, 3, 5, 3});
  testing::check_layer_gradients(GlobalAvgPool("gap"), {2, 5, 1, 1});
  GlobalAvgPool gap("gap");
  CHECK(gap.output_shape({8, 64, 7, 7}) == Shape{8, 64});
  CHECK_THROWS_AS(gap.output_shape({8, 64}), ConfigError);
}

TEST_CASE("pooling layers: backward matches finite differences") {
  // Max pooling is piecewise linear: a small step keeps every perturbation inside its piece (the
  // forward pass is exact, so the small step costs no accuracy).
  testing::GradCheckOptions o;
  o.step = 1e-3f;
  testing::check_layer_gradients(MaxPool2d("pool", 2), {2, 3, 6, 5}, o);
  testing::check_layer_gradients(MaxPool2d("pool", 3, 2, 1), {1, 5, 7, 6}, o);
  testing::check_layer_gradients(AvgPool2d("pool", 2), {2, 3, 6, 5});
  testing::check_layer_gradients(AvgPool2d("pool", 3, 2, 1), {1, 5, 7, 6});
  testing::check_layer_gradients(AvgPool2d("pool", 3, 1), {3, 2, 5, 4});
}

TEST_CASE("pooling layers report shapes and reject bad windows") {
  MaxPool2d pool("pool1", 2);
  CHECK(pool.kind() == "MaxPool2d");
  CHECK(pool.output_shape({64, 32, 28, 28}) == Shape{64, 32, 14, 14});
  CHECK(pool.parameters().empty());
  CHECK(pool.flops({64, 32, 28, 28}) == doctest::Approx(64.0 * 32 * 14 * 14 * 4));
  CHECK(AvgPool2d("a", 3, 2, 1).output_shape({1, 3, 7, 7}) == Shape{1, 3, 4, 4});
  CHECK(MaxPool2d("m", 3, 1).output_shape({2, 1, 5, 6}) == Shape{2, 1, 3, 4});
  CHECK_THROWS_AS(MaxPool2d("bad", 2, 2, 2), ConfigError);  // padding over half the kernel
  CHECK_THROWS_AS(MaxPool2d("bad", 0), ConfigError);
  CHECK_THROWS_AS(pool.output_shape({64, 32, 1, 28}), ConfigError);
  CHECK_THROWS_AS(pool.output_shape({64, 32, 28}), ConfigError);
}

TEST_CASE("max pooling backward refuses indices outside the plane, in any plane") {
  // 2 x 3 planes of 4x4 pooled 2x2; one index of the last plane out of range (the check runs on
  // each plane's thread).
  const Shape xs{2, 3, 4, 4}, ys{2, 3, 2, 2};
  Tensor x = testing::random_tensor(xs, 60);
  Tensor y = Tensor::empty(ys), idx = Tensor::empty(ys, DType::Int32);
  ops::max_pool2d_forward(x, y, idx, ops::Window2d::square(2, 2));
  Tensor dy = testing::random_tensor(ys, 61), dx = Tensor::empty(xs);
  idx.data<std::int32_t>()[idx.numel() - 1] = 16;
  CHECK_THROWS_WITH(ops::max_pool2d_backward(dy, idx, dx),
                    doctest::Contains("indices outside a 4x4 plane"));
  idx.data<std::int32_t>()[0] = -1;
  CHECK_THROWS_WITH(ops::max_pool2d_backward(dy, idx, dx),
                    doctest::Contains("indices outside a 4x4 plane"));
  CHECK_THROWS_WITH(ops::max_pool2d_backward(dy, idx, dx, ops::Window2d::square(2, 2)),
                    doctest::Contains("indices outside a 4x4 plane"));
}

TEST_CASE("a ReLU before a max pool runs after it, with the same outputs and gradients") {
  Sequential m("m");
  m.emplace<ReLU>("relu1")
      .emplace<MaxPool2d>("pool1", 2)
      .emplace<ReLU>("relu2")
      .emplace<MaxPool2d>("pool2", 3, 2, 1);  // overlapping, padded windows
  const std::vector<int> swapped{1, 0, 3, 2};
  for (int i = 0; i < m.size(); ++i) CHECK(m.runs_at(m.all(), i) == swapped[std::size_t(i)]);
  // Never across a range's ends: a stage sends and receives what the layers declare.
  CHECK(m.runs_at({1, 4}, 1) == 1);
  CHECK(m.runs_at({1, 4}, 2) == 3);
  CHECK(m.runs_at({0, 1}, 0) == 0);
  CHECK(m.runs_at({2, 3}, 2) == 2);
  // Other activations before a max pool, and a ReLU before an average pool, keep their place.
  Sequential others("others");
  others.emplace<Tanh>("tanh")
      .emplace<MaxPool2d>("pool", 2)
      .emplace<ReLU>("relu")
      .emplace<AvgPool2d>("avg", 2);
  for (int i = 0; i < others.size(); ++i) CHECK(others.runs_at(others.all(), i) == i);

  // Values on a coarse grid, so that windows tie (at zero, below it and above it), and a plane of
  // sample 0 wholly negative.
  const Shape xs{2, 3, 24, 24};
  Tensor x = testing::random_tensor(xs, 70);
  for (float& v : x.values()) v = std::round(v * 3.f) / 3.f;
  for (std::int64_t k = 0; k < 24 * 24; ++k) x.values()[k] = -std::abs(x.values()[k]);
  const Shape ys = m.output_shape(xs);
  Tensor dy = testing::random_tensor(ys, 71);

  // The reference: every layer in its declared order.
  ModelParams params = m.init(1);
  std::vector<Tensor> inputs;
  std::vector<Saved> saved(std::size_t(m.size()));
  Tensor h = x;
  for (int i = 0; i < m.size(); ++i) {
    inputs.push_back(h);
    h = m.layer(i).forward(params[std::size_t(i)], h, saved[std::size_t(i)], {});
  }
  const std::vector<float> y_ref = h.to_vector();
  Tensor g = dy;
  for (int i = m.size() - 1; i >= 0; --i) {
    std::vector<Tensor> none;
    g = m.layer(i).backward(params[std::size_t(i)], saved[std::size_t(i)], g, none);
  }
  const std::vector<float> dx_ref = g.to_vector();

  // The whole model in one range, and split into ranges that part each pair.
  for (const std::vector<LayerRange>& ranges :
       {std::vector<LayerRange>{m.all()}, std::vector<LayerRange>{{0, 1}, {1, 3}, {3, 4}}}) {
    CAPTURE(ranges.size());
    std::vector<std::vector<Saved>> saves(ranges.size());
    std::vector<ModelParams> ps;
    std::vector<ModelGrads> gs;
    Tensor out = x;
    for (std::size_t s = 0; s < ranges.size(); ++s) {
      ps.push_back(m.init(1, ranges[s]));
      gs.push_back(m.zero_grads(ranges[s]));
      out = m.forward(ranges[s], ps[s], out, saves[s], {});
    }
    CHECK(out.to_vector() == y_ref);
    Tensor grad = dy;
    for (std::size_t s = ranges.size(); s-- > 0;)
      grad = m.backward(ranges[s], ps[s], saves[s], grad, gs[s]);
    CHECK(grad.to_vector() == dx_ref);
    // Run after the pool, relu1 keeps the pooled tensor: a quarter of its input.
    if (ranges.size() == 1)
      CHECK(saves[0][0].bytes() == static_cast<std::size_t>(xs.numel()) * sizeof(float) / 4);
  }
}

}  // namespace test_pool
