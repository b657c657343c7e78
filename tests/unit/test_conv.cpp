#include <pipeline/core/threads.hpp>
#include <pipeline/nn/layers/conv2d.hpp>
#include <pipeline/ops/conv.hpp>

#include "../../src/ops/conv_direct.hpp"
#include "../../src/ops/conv_winograd.hpp"

#include "support/gradcheck.hpp"

#include <cmath>

namespace test_conv {

using namespace pipeline;

namespace {

struct Case {
  std::int64_t n, c, h, w, m;
  ops::Window2d win;
};

// Direct loops over the definition, in double.
Tensor reference_forward(const Tensor& x, const Tensor& wt, const Tensor& b,
                         const ops::Window2d& k) {
  const auto N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3), M = wt.dim(0);
  const auto OH = k.out_h(H), OW = k.out_w(W);
  Tensor y = Tensor::empty({N, M, OH, OW});
  const float *xd = x.data<float>(), *wd = wt.data<float>();
  float* yd = y.data<float>();
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t oh = 0; oh < OH; ++oh)
        for (std::int64_t ow = 0; ow < OW; ++ow) {
          double s = b.defined() ? b.data<float>()[m] : 0.0;
          for (std::int64_t c = 0; c < C; ++c)
            for (std::int64_t i = 0; i < k.kernel_h; ++i)
              for (std::int64_t j = 0; j < k.kernel_w; ++j) {
                const auto ih = oh * k.stride_h - k.pad_h + i, iw = ow * k.stride_w - k.pad_w + j;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                s += double(xd[((n * C + c) * H + ih) * W + iw]) *
                     wd[((m * C + c) * k.kernel_h + i) * k.kernel_w + j];
              }
          yd[((n * M + m) * OH + oh) * OW + ow] = static_cast<float>(s);
        }
  return y;
}

// dx and dw by scattering every product term of the forward sum.
void reference_backward(const Tensor& x, const Tensor& wt, const Tensor& dy, const ops::Window2d& k,
                        Tensor& dx, Tensor& dw) {
  const auto N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3), M = wt.dim(0);
  const auto OH = dy.dim(2), OW = dy.dim(3);
  std::vector<double> gx(static_cast<std::size_t>(x.numel())),
      gw(static_cast<std::size_t>(wt.numel()));
  const float *xd = x.data<float>(), *wd = wt.data<float>(), *dyd = dy.data<float>();
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t oh = 0; oh < OH; ++oh)
        for (std::int64_t ow = 0; ow < OW; ++ow) {
          const double g = dyd[((n * M + m) * OH + oh) * OW + ow];
          for (std::int64_t c = 0; c < C; ++c)
            for (std::int64_t i = 0; i < k.kernel_h; ++i)
              for (std::int64_t j = 0; j < k.kernel_w; ++j) {
                const auto ih = oh * k.stride_h - k.pad_h + i, iw = ow * k.stride_w - k.pad_w + j;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                const auto xi = ((n * C + c) * H + ih) * W + iw;
                const auto wi = ((m * C + c) * k.kernel_h + i) * k.kernel_w + j;
                gx[static_cast<std::size_t>(xi)] += g * wd[wi];
                gw[static_cast<std::size_t>(wi)] += g * xd[xi];
              }
        }
  dx = Tensor::empty(x.shape());
  dw = Tensor::empty(wt.shape());
  for (std::size_t i = 0; i < gx.size(); ++i) dx.data<float>()[i] = static_cast<float>(gx[i]);
  for (std::size_t i = 0; i < gw.size(); ++i) dw.data<float>()[i] = static_cast<float>(gw[i]);
}

void expect_close(const Tensor& got, const Tensor& want, const char* what, double rel = 1e-5) {
  REQUIRE(got.shape() == want.shape());
  double scale = 0;
  for (float v : want.values()) scale = std::max(scale, double(std::abs(v)));
  const double tol = rel * (1.0 + scale);
  int shown = 0;
  std::int64_t bad = 0;
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    const double d = std::abs(double(got.values()[i]) - want.values()[i]);
    if (!(d <= tol)) {
      if (shown++ < 5)
        MESSAGE(what << "[" << i << "]: got " << got.values()[i] << " want " << want.values()[i]);
      ++bad;
    }
  }
  CHECK_MESSAGE(bad == 0, what << ": " << bad << " of " << got.numel() << " elements differ");
}

const std::vector<Case> cases = {
    {1, 3, 7, 5, 5, {3, 2, 2, 1, 1, 0}},    // batch 1, non-square kernel, stride 2 in h only
    {3, 5, 9, 11, 4, {3, 3, 2, 2, 1, 1}},   // stride 2 with padding, odd sizes
    {2, 1, 28, 28, 6, {5, 5, 1, 1, 2, 2}},  // fashion-cnn conv1 geometry (fewer channels)
    {4, 6, 6, 8, 3, {1, 1, 1, 1, 0, 0}},    // pointwise: no lowering
    {2, 3, 5, 6, 5, {1, 3, 1, 2, 0, 2}},    // 1x3 kernel, padding only in w
    {3, 2, 4, 4, 3, {4, 4, 3, 3, 2, 1}},    // kernel as large as the input, stride larger than 2
};

}  // namespace

TEST_CASE("conv2d ops match direct loops") {
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (std::size_t k = 0; k < cases.size(); ++k) {
      const Case& c = cases[k];
      CAPTURE(k);
      CAPTURE(threads);
      const std::uint64_t seed = 100 + k;
      Tensor x = testing::random_tensor({c.n, c.c, c.h, c.w}, seed);
      Tensor w = testing::random_tensor({c.m, c.c, c.win.kernel_h, c.win.kernel_w}, seed + 1);
      Tensor b = testing::random_tensor({c.m}, seed + 2);
      Tensor y = ops::conv2d(x, w, b, c.win);
      expect_close(y, reference_forward(x, w, b, c.win), "forward");
      expect_close(ops::conv2d(x, w, Tensor(), c.win), reference_forward(x, w, Tensor(), c.win),
                   "forward without bias");

      Tensor dy = testing::random_tensor(y.shape(), seed + 3);
      Tensor dx_ref, dw_ref;
      reference_backward(x, w, dy, c.win, dx_ref, dw_ref);
      Tensor dx = Tensor::full(x.shape(), 7.f);  // overwritten, whatever it held
      ops::conv2d_backward_data(dy, w, dx, c.win);
      expect_close(dx, dx_ref, "backward data");

      // backward_filter accumulates: start from a known non-zero buffer.
      Tensor dw = Tensor::full(w.shape(), 0.5f);
      ops::conv2d_backward_filter(x, dy, dw, c.win);
      for (float& v : dw_ref.values()) v += 0.5f;
      expect_close(dw, dw_ref, "backward filter");

      Tensor db = Tensor::full({c.m}, 1.f);
      ops::conv2d_backward_bias(dy, db);
      for (std::int64_t m = 0; m < c.m; ++m) {
        double s = 1.0;
        for (std::int64_t n = 0; n < c.n; ++n)
          for (std::int64_t p = 0; p < y.dim(2) * y.dim(3); ++p)
            s += dy.data<float>()[(n * c.m + m) * y.dim(2) * y.dim(3) + p];
        CHECK(db.data<float>()[m] == doctest::Approx(s).epsilon(1e-5));
      }
    }
  }
  set_num_threads(default_num_threads());
}

TEST_CASE("conv2d rejects inputs that do not fit") {
  Tensor w = Tensor::zeros({4, 3, 3, 3});
  CHECK_THROWS_AS(ops::conv2d(Tensor::zeros({1, 2, 8, 8}), w, Tensor(), ops::Window2d::square(3)),
                  ConfigError);  // channel mismatch
  CHECK_THROWS_AS(ops::conv2d(Tensor::zeros({1, 3, 2, 8}), w, Tensor(), ops::Window2d::square(3)),
                  ConfigError);  // kernel taller than the input
  CHECK_THROWS_AS(ops::conv2d(Tensor::zeros({1, 3, 8, 8}), w, Tensor(), ops::Window2d::square(5)),
                  ConfigError);  // window and weight disagree
  CHECK_THROWS_AS(
      ops::conv2d(Tensor::zeros({1, 3, 8, 8}), w, Tensor(), ops::Window2d::square(3, 0)),
      ConfigError);  // zero stride
  CHECK_THROWS(ops::conv2d(Tensor::zeros({1, 3, 8, 8}), w, Tensor::zeros({5}),
                           ops::Window2d::square(3)));  // bias of the wrong size
}

TEST_CASE("Conv2d backward matches finite differences") {
  testing::check_layer_gradients(Conv2d("conv", 3, 5, 3, 2, 1), {1, 3, 7, 6});
  testing::check_layer_gradients(Conv2d("conv", 2, 3, 5, 1, 2), {2, 2, 6, 5});
  testing::check_layer_gradients(Conv2d("conv", 3, 4, 1, 1, 0, false), {2, 3, 3, 5});
  testing::check_layer_gradients(Conv2d("conv", Conv2dOptions{5, 3, 2, 3, 2, 1, 1, 0, true}),
                                 {3, 5, 5, 4});
}

TEST_CASE("Conv2d reports shapes, FLOPs and parameters") {
  Conv2d conv2("conv2", 32, 64, 5, 1, 2);
  CHECK(conv2.kind() == "Conv2d");
  CHECK(conv2.output_shape({64, 32, 14, 14}) == Shape{64, 64, 14, 14});
  CHECK(conv2.flops({64, 32, 14, 14}) == doctest::Approx(2.0 * 64 * 64 * 14 * 14 * 32 * 25));
  CHECK(conv2.parameter_bytes() == (64 * 32 * 25 + 64) * 4);
  auto specs = conv2.parameters();
  REQUIRE(specs.size() == 2);
  CHECK(specs[0].name == "weight");
  CHECK(specs[0].shape == Shape{64, 32, 5, 5});
  CHECK(specs[0].init.a == doctest::Approx(1.0 / std::sqrt(32.0 * 25)));
  CHECK(specs[1].shape == Shape{64});
  CHECK(Conv2d("c", 3, 8, 3, 2, 1, false).parameters().size() == 1);
  Conv2d nonsq("c", Conv2dOptions{3, 4, 3, 1, 2, 1, 1, 0, true});
  CHECK(nonsq.output_shape({2, 3, 9, 7}) == Shape{2, 4, 5, 7});
  CHECK_THROWS_AS(conv2.output_shape({64, 3, 14, 14}), ConfigError);
  CHECK_THROWS_AS(conv2.output_shape({64, 32, 14}), ConfigError);
  CHECK_THROWS_AS(Conv2d("bad", 0, 4, 3), ConfigError);
  CHECK_THROWS_AS(Conv2d("bad", 3, 4, 3, 0), ConfigError);
}

TEST_CASE("Conv2d: k accumulated microbatches equal one batch of k times the size") {
  Conv2d conv("conv", 3, 5, 3, 2, 1);
  LayerParams p = conv.init(7);
  const std::int64_t k = 3, micro = 2;
  Tensor x = testing::random_tensor({k * micro, 3, 9, 8}, 11);
  Tensor dy = testing::random_tensor(conv.output_shape(x.shape()), 12);

  std::vector<Tensor> whole = conv.zero_grads();
  {
    Saved saved;
    conv.forward(p, x, saved, {});
    conv.backward(p, saved, dy, whole);
  }
  std::vector<Tensor> acc = conv.zero_grads();
  for (std::int64_t i = 0; i < k; ++i) {
    Saved saved;
    conv.forward(p, x.slice(i * micro, (i + 1) * micro), saved, {});
    conv.backward(p, saved, dy.slice(i * micro, (i + 1) * micro), acc, GradParts::Weight);
  }
  for (std::size_t j = 0; j < whole.size(); ++j)
    expect_close(acc[j], whole[j], "accumulated", 1e-5);
}

TEST_CASE("conv2d weight gradients are reproducible bit for bit") {
  // Sums over samples keep a fixed split over threads, so repeated runs agree exactly.
  const ops::Window2d win = ops::Window2d::square(3, 1, 1);
  Tensor x = testing::random_tensor({9, 4, 6, 7}, 21);
  Tensor w = testing::random_tensor({5, 4, 3, 3}, 22);
  Tensor dy = testing::random_tensor({9, 5, 6, 7}, 23);
  Tensor a = Tensor::zeros(w.shape()), b = Tensor::zeros(w.shape());
  ops::conv2d_backward_filter(x, dy, a, win);
  ops::conv2d_backward_filter(x, dy, b, win);
  CHECK(a.to_vector() == b.to_vector());
}

TEST_CASE("Winograd transforms compute correlations exactly in 1-D") {
  // y_i = Σ_k d_{i+k} g_k through Aᵀ [(G g) ⊙ (Bᵀ d)], for every F(m, r) with α = 6 and 8.
  for (const int alpha : {6, 8}) {
    const auto& bt = ops::detail::winograd_input_matrix(alpha);
    for (int r = 1; r <= alpha; ++r) {
      const int m = alpha + 1 - r;
      CAPTURE(alpha);
      CAPTURE(r);
      const ops::detail::WinogradMatrices f = ops::detail::winograd_matrices(m, r);
      CHECK(f.alpha == alpha);
      const auto a = static_cast<std::size_t>(alpha);
      std::vector<double> d(a), g(static_cast<std::size_t>(r)), product(a);
      for (std::size_t i = 0; i < a; ++i) d[i] = std::sin(1.7 * static_cast<double>(i) + 0.3);
      for (int k = 0; k < r; ++k) g[k] = std::cos(0.9 * k + 0.1);
      for (int j = 0; j < alpha; ++j) {
        double gj = 0, dj = 0;
        for (int k = 0; k < r; ++k) gj += f.g[j][k] * g[k];
        for (int i = 0; i < alpha; ++i) dj += bt[j][i] * d[i];
        product[j] = gj * dj;
      }
      for (int i = 0; i < m; ++i) {
        double y = 0, want = 0;
        for (int j = 0; j < alpha; ++j) y += f.at[i][j] * product[j];
        for (int k = 0; k < r; ++k) want += d[i + k] * g[k];
        CHECK(y == doctest::Approx(want).epsilon(1e-6));
      }
    }
  }
  // fashion-cnn's conv2 (14x14 outputs) in 4x4 tiles; a 2x5 output in F(2, 5)'s 2x2 ones.
  CHECK(ops::detail::winograd_alpha({64, 32, 14, 14, 64, 14, 14, 5, 2, 2}) == 8);
  CHECK(ops::detail::winograd_alpha({1, 16, 6, 9, 17, 2, 5, 5, 0, 0}) == 6);
  CHECK(ops::detail::winograd_alpha({64, 64, 32, 32, 64, 32, 32, 3, 1, 1}) == 6);
  CHECK_THROWS(ops::detail::winograd_matrices(2, 3));
}

TEST_CASE("Winograd convolutions match direct loops") {
  // 3x3 (F(4,3)) and 5x5 (F(4,5)) with every padding the transform takes, sizes that are not
  // multiples of the tiles, one sample and several blocks of tiles; 1 and 3 threads.
  struct WinogradCase {
    std::int64_t n, c, h, w, m, r, pad;
  };
  const std::vector<WinogradCase> wcases = {{1, 16, 5, 7, 16, 3, 1},   {3, 17, 13, 11, 19, 3, 0},
                                            {2, 16, 9, 10, 24, 3, 2},  {2, 20, 14, 14, 16, 5, 2},
                                            {1, 16, 6, 9, 17, 5, 0},   {3, 16, 11, 8, 16, 5, 4},
                                            {5, 16, 33, 31, 18, 3, 1}, {3, 16, 28, 28, 16, 5, 2}};
  for (int threads : {1, 3}) {
    set_num_threads(threads);
    for (std::size_t k = 0; k < wcases.size(); ++k) {
      const WinogradCase& c = wcases[k];
      CAPTURE(k);
      CAPTURE(threads);
      const ops::Window2d win = ops::Window2d::square(c.r, 1, c.pad);
      const Shape ys = win.output_shape({c.n, c.c, c.h, c.w}, c.m);
      REQUIRE(ops::detail::winograd_suits(
          {c.n, c.c, c.h, c.w, c.m, ys[2], ys[3], c.r, c.pad, c.pad}, c.r, 1, 1));
      const std::uint64_t seed = 300 + k;
      Tensor x = testing::random_tensor({c.n, c.c, c.h, c.w}, seed);
      Tensor w = testing::random_tensor({c.m, c.c, c.r, c.r}, seed + 1);
      Tensor b = testing::random_tensor({c.m}, seed + 2);
      Tensor y = Tensor::full(ops::conv2d_output_shape(x.shape(), w.shape(), win), NAN);
      ops::conv2d_forward(x, w, b, y, win);
      expect_close(y, reference_forward(x, w, b, win), "forward", 1e-5);

      Tensor dy = testing::random_tensor(y.shape(), seed + 3);
      Tensor dx_ref, dw_ref;
      reference_backward(x, w, dy, win, dx_ref, dw_ref);
      Tensor dx = Tensor::full(x.shape(), NAN);
      ops::conv2d_backward_data(dy, w, dx, win);
      expect_close(dx, dx_ref, "backward data", 1e-5);
      Tensor dw = Tensor::full(w.shape(), 0.5f);
      ops::conv2d_backward_filter(x, dy, dw, win);
      for (float& v : dw_ref.values()) v += 0.5f;
      // The weight gradient adds every tile's transformed products before one inverse transform
      // (F(5, 4) for 5x5, whose points include ±2 and ±1/2), so its rounding grows with the tiles:
      // 1.05e-5 of the largest value on the 3 x 28 x 28 case with AVX2 + FMA, 9.0e-6 with
      // AVX-512 (the same arithmetic, contracted differently); forward and data stay below 4e-6.
      expect_close(dw, dw_ref, "backward filter", 2e-5);
    }
  }
  set_num_threads(default_num_threads());
}

TEST_CASE(
    "Winograd takes only the convolutions it speeds up; CpuConvAlgorithm::Lowered takes none") {
  const auto suits = [](std::int64_t c, std::int64_t m, std::int64_t size, std::int64_t r,
                        std::int64_t stride, std::int64_t pad) {
    const std::int64_t out = (size + 2 * pad - r) / stride + 1;
    return ops::detail::winograd_suits({8, c, size, size, m, out, out, r, pad, pad}, r, stride,
                                       stride);
  };
  CHECK(suits(32, 64, 14, 5, 1, 2));         // fashion-cnn's conv2
  CHECK(suits(64, 64, 32, 3, 1, 1));         // vgg16's second convolution
  CHECK_FALSE(suits(1, 32, 28, 5, 1, 2));    // fashion-cnn's conv1: one input channel
  CHECK_FALSE(suits(64, 64, 32, 3, 2, 1));   // stride 2
  CHECK_FALSE(suits(64, 64, 32, 7, 1, 3));   // 7x7
  CHECK_FALSE(suits(64, 64, 32, 3, 1, 3));   // padding beyond r - 1
  CHECK_FALSE(suits(512, 512, 2, 3, 1, 1));  // a 2x2 output in 4x4 tiles saves nothing

  // Both algorithms agree to rounding; the lowered one is what the setting selects.
  const ops::Window2d win = ops::Window2d::square(5, 1, 2);
  const Tensor x = testing::random_tensor({2, 16, 9, 9}, 41);
  const Tensor w = testing::random_tensor({16, 16, 5, 5}, 42);
  REQUIRE(ops::cpu_conv_algorithm() == ops::CpuConvAlgorithm::Automatic);
  const Tensor fast = ops::conv2d(x, w, Tensor(), win);
  ops::set_cpu_conv_algorithm(ops::CpuConvAlgorithm::Lowered);
  const Tensor lowered = ops::conv2d(x, w, Tensor(), win);
  ops::set_cpu_conv_algorithm(ops::CpuConvAlgorithm::Automatic);
  expect_close(fast, lowered, "automatic against lowered", 1e-5);
  CHECK(fast.to_vector() != lowered.to_vector());  // two different sums
}

TEST_CASE(
    "the direct forward and weight gradient of few input channels match direct loops, on "
    "any thread count") {
  // 1 to 4 input channels, kernels 1x1 to 7x7 (rectangular too), every padding up to the
  // kernel's, rows of one, two and three 32-column chunks, channel counts past the 8-channel
  // block (forward) and the 4-channel group (weight gradient); the output poisoned, with and
  // without bias, the gradient accumulated onto non-zero values; the same bits on 1 and 3
  // threads (the weight gradient: where the direct form takes it, with AVX-512).
  struct DirectCase {
    std::int64_t n, c, h, w, m;
    ops::Window2d win;
  };
  const std::vector<DirectCase> dcases = {
      {3, 1, 28, 28, 32, ops::Window2d::square(5, 1, 2)},  // fashion-cnn's conv1
      {2, 3, 9, 40, 13, ops::Window2d::square(3, 1, 1)},   // RGB, two chunks, 8 + 5 channels
      {2, 2, 7, 70, 9, ops::Window2d::square(7, 1, 3)},    // three chunks
      {1, 4, 6, 5, 3, ops::Window2d::square(1)},           // pointwise, fewer than 8 channels
      {2, 1, 5, 11, 8, {2, 4, 1, 1, 1, 3}},                // rectangular, padding past the input
      {1, 2, 10, 33, 16, ops::Window2d::square(7, 1, 0)},  // no padding, 33 columns: two chunks
  };
  for (std::size_t k = 0; k < dcases.size(); ++k) {
    const DirectCase& c = dcases[k];
    CAPTURE(k);
    const Shape xs{c.n, c.c, c.h, c.w};
    const Shape ys =
        ops::conv2d_output_shape(xs, {c.m, c.c, c.win.kernel_h, c.win.kernel_w}, c.win);
    const bool direct =
        ops::detail::direct_conv_suits({c.n, c.c, c.h, c.w, c.m, ys[2], ys[3], c.win.kernel_h,
                                        c.win.kernel_w, c.win.pad_h, c.win.pad_w},
                                       1, 1);
#if defined(__AVX512F__)
    CHECK(direct);
#else
    CHECK_FALSE(direct);
#endif
    const Tensor x = testing::random_tensor(xs, 500 + k);
    const Tensor w = testing::random_tensor({c.m, c.c, c.win.kernel_h, c.win.kernel_w}, 600 + k);
    const Tensor b = testing::random_tensor({c.m}, 700 + k);
    for (const bool with_bias : {true, false}) {
      std::vector<float> first;
      for (const int threads : {1, 3}) {
        set_num_threads(threads);
        Tensor y = Tensor::full(ys, NAN);
        ops::conv2d_forward(x, w, with_bias ? b : Tensor(), y, c.win);
        if (first.empty()) {
          expect_close(y, reference_forward(x, w, with_bias ? b : Tensor(), c.win), "forward");
          first = y.to_vector();
        } else {
          CHECK(y.to_vector() == first);
        }
      }
    }
    const Tensor dy = testing::random_tensor(ys, 800 + k);
    Tensor dx_ref, dw_ref;
    reference_backward(x, w, dy, c.win, dx_ref, dw_ref);
    for (float& v : dw_ref.values()) v += 0.5f;  // accumulated onto 0.5
    std::vector<float> first;
    for (const int threads : {1, 3}) {
      set_num_threads(threads);
      Tensor dw = Tensor::full(w.shape(), 0.5f);
      ops::conv2d_backward_filter(x, dy, dw, c.win);
      // (The lowered form, taken without AVX-512, sums each thread's samples apart: the same
      // bits for a given thread count only.)
      if (first.empty() || !direct) {
        expect_close(dw, dw_ref, "weight gradient");
        first = dw.to_vector();
      } else {
        CHECK(dw.to_vector() == first);
      }
    }
  }
  set_num_threads(default_num_threads());
  const auto suits = [](std::int64_t channels, std::int64_t r, std::int64_t stride) {
    return ops::detail::direct_conv_suits({8, channels, 28, 28, 32, 28, 28, r, r, 0, 0}, stride,
                                          stride);
  };
  CHECK_FALSE(suits(5, 5, 1));  // more input channels: lowered or Winograd
  CHECK_FALSE(suits(1, 5, 2));  // stride 2
  CHECK_FALSE(suits(1, 9, 1));  // 9x9
}

TEST_CASE(
    "Winograd results: outputs the same bits for any thread count, weight gradients for a given "
    "one") {
  // Each output belongs to one block of tiles, whatever thread computes it. The weight gradient
  // is summed over tiles by each thread apart and the sums added in thread order: repeated runs
  // agree exactly, other thread counts to rounding. 3x3 (α = 6) and 5x5 (α = 8); 200 output
  // channels (not a multiple of the products' 8-row tiles) and 3 samples, so that 16 threads
  // get tiles and some get none.
  for (const std::int64_t r : {3, 5}) {
    CAPTURE(r);
    const ops::Window2d win = ops::Window2d::square(r, 1, r / 2);
    const Tensor x = testing::random_tensor({3, 16, 9, 9}, 51);
    const Tensor w = testing::random_tensor({200, 16, r, r}, 52);
    const Tensor dy = testing::random_tensor({3, 200, 9, 9}, 53);
    const auto weight_gradient = [&] {
      Tensor dw = Tensor::zeros(w.shape());
      ops::conv2d_backward_filter(x, dy, dw, win);
      return dw;
    };
    std::vector<std::vector<float>> first;
    Tensor first_dw;
    for (int threads : {1, 2, 8, 16}) {
      CAPTURE(threads);
      set_num_threads(threads);
      Tensor dx = Tensor::empty(x.shape());
      ops::conv2d_backward_data(dy, w, dx, win);
      const std::vector<std::vector<float>> now = {ops::conv2d(x, w, Tensor(), win).to_vector(),
                                                   dx.to_vector()};
      const Tensor dw = weight_gradient();
      CHECK(weight_gradient().to_vector() == dw.to_vector());
      if (first.empty()) {
        first = now;
        first_dw = dw;
      }
      CHECK(now[0] == first[0]);
      CHECK(now[1] == first[1]);
      expect_close(dw, first_dw, "weight gradient against 1 thread");
    }
  }
  set_num_threads(default_num_threads());
}

}  // namespace test_conv
